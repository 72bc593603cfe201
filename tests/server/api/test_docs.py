"""GET /docs in Debian's headless Chromium: Swagger UI renders every operation with nothing loaded from off the host."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import fastapi_offline
import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.live_server import ROOT
from tests.server.api.test_playground import browser  # noqa: F401  (the module's Chromium, as a fixture)

SCREENSHOT = ROOT / "docs" / "openapi.png"
PACKAGE_ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"


@pytest.fixture
def docs(browser: Browser, server: str) -> Iterator[tuple[Page, list[str], list[str]]]:  # noqa: F811
    """/docs loaded until the /normalize operation shows; every request URL and every script or console error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)  # CSP violations too
    page.goto(server + "/docs")
    page.wait_for_selector(".opblock-summary-path[data-path='/normalize']")
    yield page, requests, errors
    context.close()


def test_docs_render_every_operation_from_this_host_only(docs: tuple[Page, list[str], list[str]], server: str) -> None:
    page, requests, errors = docs
    paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.dataset.path)")
    spec = httpx.get(server + "/openapi.json").json()
    assert sorted(paths) == sorted(spec["paths"])
    assert {"/normalize", "/encode", "/v2/models/{name}/infer"} <= set(paths)
    assert page.title() == "normserve - Swagger UI"
    assert [u for u in requests if not u.startswith(server + "/")] == []
    assert {u.removeprefix(server) for u in requests} == {
        "/docs",
        "/docs/assets/swagger-ui.css",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/favicon.png",
        "/openapi.json",
    }
    assert errors == []


def test_try_it_out_runs_the_seed_example_against_this_server(
    docs: tuple[Page, list[str], list[str]], server: str
) -> None:
    page, requests, errors = docs
    block = page.locator("#operations-normalization-normalize_normalize_post")
    block.locator(".opblock-summary").click()
    block.locator("button.try-out__btn").click()
    block.locator("button.execute").click()
    status = block.locator(".live-responses-table tr.response .response-col_status")
    status.wait_for()
    assert status.text_content() == "200"
    body = block.locator(".live-responses-table tr.response .response-col_description pre").first.text_content() or ""
    assert '"backend": "onnxruntime"' in body and '"shape": [' in body
    assert server + "/normalize" in requests
    assert [u for u in requests if not u.startswith(server + "/")] == []
    assert errors == []


def test_the_assets_are_the_installed_packages_files(server: str) -> None:
    for name, ctype in [("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "text/css")]:
        r = httpx.get(f"{server}/docs/assets/{name}")
        assert r.status_code == 200 and ctype in r.headers["content-type"]
        assert r.content == (PACKAGE_ASSETS / name).read_bytes()
    page = httpx.get(server + "/docs")
    assert "https://" not in page.text and "http://" not in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    missing = httpx.get(server + "/docs/assets/missing.js")
    assert missing.status_code == 404 and missing.json() == {"error": "no route GET /docs/assets/missing.js"}


def test_screenshot_of_the_docs_for_the_readme(docs: tuple[Page, list[str], list[str]], tmp_path: Path) -> None:
    """docs/openapi.png is written when missing or with UPDATE_SCREENSHOTS=1 (as docs/playground.png is)."""
    page, _, _ = docs
    update = os.environ.get("UPDATE_SCREENSHOTS") == "1" or not SCREENSHOT.exists()
    target = SCREENSHOT if update else tmp_path / SCREENSHOT.name
    png = page.screenshot(path=str(target))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1280, 900)


def test_redoc_is_not_served_and_no_file_says_it_is(server: str) -> None:
    """ReDoc's bundle loads its logo from a CDN, so the app has no /redoc: pyproject and the docs must not offer it."""
    assert httpx.get(f"{server}/redoc", timeout=30).status_code == 404
    files = [ROOT / "pyproject.toml", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    offering = [str(path.relative_to(ROOT)) for path in files if "/redoc" in path.read_text()]
    assert not offering, f"these name /redoc, which answers 404: {offering}"
