"""The playground page (GET /) in Debian's headless Chromium, driven by Playwright against the live server."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from app.core.reference import EncoderConfig, layer_norm_names
from app.core.seeds import SEED000, SEED003
from tests.live_server import ROOT, live_server
from tests.repositories import copy_models, learned_layernorm

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package (scripts/system-deps.sh); never a browser download
# Without the background-networking switches Chromium keeps calling Google's services, which this network lacks.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = ROOT / "docs" / "playground.png"
TOL = 1e-4


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} missing: run `bash scripts/system-deps.sh` (installs Debian's chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    """The loaded playground; afterwards, no request may have left the server's origin and no script may have failed."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    foreign: list[str] = []
    script_errors: list[str] = []
    pg.on("request", lambda r: foreign.append(r.url) if not r.url.startswith((server + "/", "data:")) else None)
    pg.on("pageerror", lambda e: script_errors.append(str(e)))
    # Chromium logs every non-2xx fetch as a console error; the 4xx cases are the point of some tests.
    pg.on(
        "console", lambda m: script_errors.append(m.text) if m.type == "error" and "status of 4" not in m.text else None
    )
    pg.goto(server + "/")
    pg.wait_for_selector("body[data-ready='true']")
    yield pg
    context.close()
    assert foreign == [], f"the page reached beyond its origin: {foreign}"
    assert script_errors == [], f"script errors: {script_errors}"


def settle(page: Page, action: Callable[[], None]) -> None:
    """Do `action` and wait until the page has shown the answer (or the error) of the request it sent."""
    before = int(page.get_attribute("body", "data-settled") or 0)
    action()
    # A selector, not wait_for_function: the page's CSP forbids eval, which that would need.
    page.wait_for_selector(f"body[data-settled='{before + 1}']", state="attached")


def output_table(page: Page) -> list[list[float]]:
    cells = page.eval_on_selector_all(
        "#output-table td.out", "els => els.map(e => [+e.dataset.row, +e.dataset.col, e.textContent])"
    )
    rows = 1 + max(r for r, _, _ in cells)
    table: list[list[float]] = [[] for _ in range(rows)]
    for r, _, text in sorted(cells):
        table[r].append(float(text))
    return table


def column(page: Page, stat: str) -> list[float]:
    return [
        float(t) for t in page.eval_on_selector_all(f"#stats-table td.{stat}", "els => els.map(e => e.textContent)")
    ]


def series(page: Page, plot: str) -> dict[str, dict[str, int]]:
    """Each drawn series of an SVG plot: its path and dot counts, keyed by its name."""
    return page.eval_on_selector_all(
        f"#{plot} svg g.series",
        "gs => Object.fromEntries(gs.map(g => [g.dataset.series,"
        " {paths: g.querySelectorAll('path').length, dots: g.querySelectorAll('circle').length}]))",
    )


def assert_close(got: list[float], want: list[float], tol: float = TOL) -> None:
    assert len(got) == len(want), f"{got} vs {want}"
    assert all(math.isclose(g, w, abs_tol=tol) for g, w in zip(got, want, strict=True)), f"{got} vs {want}"


SEED003_TEXT = json.dumps(SEED003.request()["data"])  # "[[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]"
EXAMPLES = [
    # id, how the tensor gets in (typed text or an example button), expected output rows, mean, std (= sqrt(var));
    # seed 002's button sends the [2, 1, 3] input: its table shows the same two rows as seed 003's
    pytest.param(SEED003_TEXT, None, SEED003.output, SEED003.mean, SEED003.std, id="seed003-typed"),
    pytest.param(None, "#example-seed003", SEED003.output, SEED003.mean, SEED003.std, id="seed003-button"),
    pytest.param(None, "#example-seed000", SEED000.output, SEED000.mean, SEED000.std, id="seed000-std-button"),
    pytest.param(None, "#example-seed002", SEED003.output, SEED003.mean, SEED003.std, id="seed002-last2dims-button"),
]


@pytest.mark.parametrize(("typed", "button", "want_out", "want_mean", "want_std"), EXAMPLES)
def test_seed_examples_show_the_seeds_outputs_stats_and_plots(
    page: Page,
    typed: str | None,
    button: str | None,
    want_out: list[list[float]],
    want_mean: list[float],
    want_std: list[float],
) -> None:
    if typed is not None:
        page.fill("#data", typed)
        page.fill("#eps", "1e-5")
        page.select_option("#eps-mode", "var")
        page.fill("#k", "1")
    else:
        assert button is not None
        page.click(button)
    settle(page, lambda: page.click("#run"))
    assert page.is_hidden("#error")
    got = output_table(page)
    assert len(got) == len(want_out)
    for g, w in zip(got, want_out, strict=True):
        assert_close(g, w)
    assert_close(column(page, "mean"), want_mean)
    assert_close(column(page, "std"), want_std)
    rows, cols = len(want_out), len(want_out[0])
    for plot in ("plot-before", "plot-after"):
        drawn = series(page, plot)
        assert list(drawn) == [f"row [{r}]" for r in range(rows)]
        assert all(s == {"paths": 1, "dots": cols} for s in drawn.values()), drawn
    assert series(page, "plot-stats") == {"mean": {"paths": 1, "dots": rows}, "std": {"paths": 1, "dots": rows}}


def test_rank1_tensor_is_one_row_whose_stats_are_bare_numbers(page: Page) -> None:
    page.fill("#data", json.dumps(SEED003.x[0]))
    settle(page, lambda: page.click("#run"))
    assert len(output_table(page)) == 1
    assert_close(output_table(page)[0], SEED003.output[0])
    assert_close(column(page, "mean"), SEED003.mean[:1])
    assert list(series(page, "plot-after")) == ["row all"]


@pytest.mark.parametrize(("backend", "reference"), [("onnxruntime", "numpy"), ("numpy", "onnxruntime")])
def test_compare_button_reports_parity_with_the_other_backend(page: Page, backend: str, reference: str) -> None:
    page.click("#example-seed000")
    page.select_option("#backend", backend)
    settle(page, lambda: page.click("#compare"))
    assert page.is_visible("#validation")
    assert page.text_content("#val-reference") == reference
    assert page.text_content("#val-passed") == "true"
    assert float(page.text_content("#val-max-abs-diff") or "nan") <= float(page.text_content("#val-atol") or "nan")


def test_generated_tensor_has_each_row_normalized_and_its_stats_shown(page: Page) -> None:
    for field, value in {
        "#gen-rows": "5",
        "#gen-cols": "16",
        "#gen-offset": "100",
        "#gen-scale": "3",
        "#gen-seed": "11",
    }.items():
        page.fill(field, value)
    page.click("#generate")
    data = json.loads(page.input_value("#data"))
    assert len(data) == 5 and all(len(row) == 16 for row in data)
    settle(page, lambda: page.click("#run"))
    for row in output_table(page):
        mean = sum(row) / len(row)
        std = math.sqrt(sum((v - mean) ** 2 for v in row) / len(row))
        assert abs(mean) < 1e-4 and abs(std - 1) < 1e-4, row
    assert_close(column(page, "mean"), [sum(r) / 16 for r in data], tol=1e-3)
    assert len(series(page, "plot-before")) == len(series(page, "plot-after")) == 5


def test_k_beyond_the_rank_is_refused_before_sending(page: Page) -> None:
    page.click("#example-seed003")
    page.fill("#k", "3")
    settle(page, lambda: page.click("#run"))
    assert page.text_content("#error") == "Error: normalized dims k = 3 exceeds the tensor's rank 2"


BAD_NORMALIZE = [
    pytest.param(
        {"#data": "[[0.2, 0.1, 0.3], [0.5, 0.1]]"}, 422, "data: row 1 has 2 elements, expected 3", id="ragged-data"
    ),
    pytest.param(
        {"#data": "[[1, 2,]]"},
        400,
        "body: not valid JSON (trailing comma is not allowed: line 1 column 16 (char 15))",
        id="invalid-json",
    ),
    pytest.param({"#eps": "0"}, 422, "eps: expected a finite number > 0, got 0.0", id="eps-zero"),
    pytest.param(
        {"#gamma": "[1, 2]"}, 422, "gamma: shape [2] does not match the normalized dims of data, [3]", id="gamma-shape"
    ),
]


@pytest.mark.parametrize(("fields", "status", "error"), BAD_NORMALIZE)
def test_invalid_normalize_input_shows_the_services_error(
    page: Page, server: str, fields: dict[str, str], status: int, error: str
) -> None:
    page.click("#example-seed003")
    page.click("#affine summary")
    for selector, value in fields.items():
        page.fill(selector, value)
    with page.expect_request("**/normalize") as sent:
        settle(page, lambda: page.click("#run"))
    # The same body straight to the service: the page must show exactly its status and message.
    direct = httpx.post(
        server + "/normalize", content=sent.value.post_data, headers={"Content-Type": "application/json"}
    )
    assert direct.status_code == status
    message = direct.json()["error"]
    assert message == error
    shown = page.text_content("#error") or ""
    assert page.is_visible("#error") and shown.startswith(str(status)) and shown.endswith(": " + message), shown


@pytest.mark.parametrize("model", ["encoder", "encoder-preln"])
def test_encode_view_plots_one_line_per_layer_norm(page: Page, model: str) -> None:
    page.click("#tab-encode")
    page.fill("#enc-seq", "24")
    page.fill("#enc-pad", "4")
    page.select_option("#enc-model", model)
    page.check("#enc-validate")
    settle(page, lambda: page.click("#enc-run"))
    assert page.is_hidden("#enc-error")
    names = layer_norm_names(EncoderConfig(norm_first=model == "encoder-preln"))
    for plot in ("enc-plot-mean", "enc-plot-std"):
        assert series(page, plot) == {n: {"paths": 1, "dots": 24} for n in names}
        assert page.locator(f"#{plot} rect.shade").count() == 1  # the padded positions are marked
    assert page.text_content("#enc-val-passed") == "true"
    assert "output [24, 128]" in (page.text_content("#enc-status") or "")


def test_encode_error_shows_the_services_message(page: Page) -> None:
    page.click("#tab-encode")
    page.fill("#enc-seq", "600")
    settle(page, lambda: page.click("#enc-run"))
    shown = page.text_content("#enc-error") or ""
    assert shown.startswith("422") and shown.endswith(
        "data: sequence length 600 exceeds max_sequence_length 512 (set at export: normserve export --max-sequence-length)"
    )


def test_tabs_switch_views_by_click_and_arrow_keys(page: Page) -> None:
    assert page.is_visible("#view-normalize") and page.is_hidden("#view-encode")
    page.click("#tab-encode")
    assert page.is_hidden("#view-normalize") and page.is_visible("#view-encode")
    page.press("#tab-encode", "ArrowLeft")
    assert page.is_visible("#view-normalize")
    assert page.get_attribute("#tab-normalize", "aria-selected") == "true"


def test_page_and_assets_come_from_the_app_with_a_self_only_policy(server: str) -> None:
    page = httpx.get(server + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    for asset, ctype in [("/static/app.js", "javascript"), ("/static/style.css", "text/css")]:
        r = httpx.get(server + asset)
        assert r.status_code == 200 and ctype in r.headers["content-type"]
    missing = httpx.get(server + "/static/missing.js")
    assert missing.status_code == 404 and missing.json()["error"] == "no route GET /static/missing.js"


def test_screenshot_of_a_normalized_tensor_for_the_readme(page: Page, tmp_path: Path) -> None:
    """docs/playground.png is written when missing or with UPDATE_SCREENSHOTS=1.

    Chromium's anti-aliasing varies by a few pixels from run to run, so an unconditional write would dirty the
    checkout on every run.
    """
    page.click("#generate")  # the defaults: 4 rows of 24, offset 5, scale 2
    settle(page, lambda: page.click("#compare"))
    assert page.text_content("#val-passed") == "true"
    update = os.environ.get("UPDATE_SCREENSHOTS") == "1" or not SCREENSHOT.exists()
    target = SCREENSHOT if update else tmp_path / SCREENSHOT.name
    target.parent.mkdir(exist_ok=True)
    png = page.screenshot(path=str(target), full_page=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width == 1280 and height >= 900


# ---- the model pickers, fed by the repository --------------------------------------------------------------


@pytest.fixture(scope="module")
def repository_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The defaults plus a learned LayerNorm of normalized_shape (3,) in two versions, both serving."""
    root = copy_models(tmp_path_factory.mktemp("picker") / "models")
    for version, scale in ((1, 1.0), (2, 3.0)):
        learned_layernorm(root, "my-ln", version, np.full(3, scale), np.zeros(3))
    (root / "my-ln/model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    with live_server({"NORMSERVE_MODEL_DIR": str(root)}) as base:
        yield base


def test_the_pickers_list_every_ready_model_and_version_and_a_pinned_version_answers(
    browser: Browser, repository_server: str
) -> None:
    pg = browser.new_page()
    pg.goto(repository_server + "/")
    pg.wait_for_selector("body[data-ready='true']")
    options = pg.eval_on_selector_all("#ln-model option", "os => os.map(o => [o.value, o.textContent])")
    assert options == [
        ["layernorm", "layernorm (latest: v1)"],
        ["my-ln", "my-ln (latest: v2)"],
        ["my-ln@1", "my-ln v1"],
        ["my-ln@2", "my-ln v2"],
    ]
    encoders = pg.eval_on_selector_all("#enc-model option", "os => os.map(o => o.value)")
    assert encoders == ["encoder", "encoder-preln"]
    pg.fill("#data", "[[1, 2, 4]]")
    pg.select_option("#ln-model", "my-ln@1")
    settle(pg, lambda: pg.click("#run"))
    assert "model my-ln v1" in (pg.text_content("#status") or "")
    pg.select_option("#ln-model", "my-ln")
    settle(pg, lambda: pg.click("#run"))
    assert "model my-ln v2" in (pg.text_content("#status") or "")
    out = output_table(pg)  # gamma 3 in version 2: three times the normalized row
    ref = [(v - 7 / 3) / math.sqrt(14 / 9 + 1e-5) * 3 for v in (1, 2, 4)]
    assert out[0] == pytest.approx(ref, abs=1e-4)
    pg.close()
