"""The playground page (GET /) in Debian's headless Chromium, driven by Playwright against the live server."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from app.core.reference import EncoderConfig, layer_norm_names
from app.core.seeds import SEED000, SEED003
from tests.live_server import ROOT, live_server
from tests.polling import wait_until
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
    with loaded_page(browser, server) as pg:
        yield pg


@contextmanager
def loaded_page(browser: Browser, base: str) -> Iterator[Page]:
    """The loaded playground; afterwards, no request may have left the server's origin and no script may have failed."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    foreign: list[str] = []
    script_errors: list[str] = []
    pg.on("request", lambda r: foreign.append(r.url) if not r.url.startswith((base + "/", "data:")) else None)
    pg.on("pageerror", lambda e: script_errors.append(str(e)))
    # Chromium logs every non-2xx fetch as a console error; the 4xx cases are the point of some tests.
    pg.on(
        "console", lambda m: script_errors.append(m.text) if m.type == "error" and "status of 4" not in m.text else None
    )
    pg.goto(base + "/")
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


# ---- the text view and the monitor view ----------------------------------------------------------------------

MAX_REQUEST_TOKENS = 100  # the text server's NORMSERVE_MAX_REQUEST_TOKENS: three of the tiny model's 40-token texts
NO_BASELINE = "no baseline: this version was exported before the drift monitor; export it again to monitor it"


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tiny random BERT (tests/textmodels.py) exported as `bert`; `encoder` as exported, with its baseline, which
    no request reaches; `layernorm` as a version exported before the drift monitor (its manifest has no baseline)."""
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    root = tmp_path_factory.mktemp("text")
    models = copy_models(root / "models", ("layernorm", "encoder"))
    manifest = models / "layernorm" / "1" / "manifest.json"
    doc = json.loads(manifest.read_text())
    del doc["baseline"]
    manifest.write_text(json.dumps(doc))
    export_text_encoder(models, "bert", tiny_model(root / "hf" / "bert", "bert").path)
    env = {"NORMSERVE_MODEL_DIR": str(models), "NORMSERVE_MAX_REQUEST_TOKENS": str(MAX_REQUEST_TOKENS)}
    with live_server(env) as base:
        yield base


@pytest.fixture
def text_page(browser: Browser, text_server: str) -> Iterator[Page]:
    with loaded_page(browser, text_server) as pg:
        yield pg


def sentence_label(i: int, text: str) -> str:
    """How the page names sentence i: its index and first three words."""
    words = text.split()
    return f"{i}: {' '.join(words[:3])}{'…' if len(words) > 3 else ''}"


def heatmap(page: Page) -> dict[tuple[int, int], str]:
    cells = page.eval_on_selector_all(
        "#text-heatmap td.sim", "els => els.map(e => [+e.dataset.row, +e.dataset.col, e.textContent])"
    )
    return {(r, c): text for r, c, text in cells}


SENTENCES = [
    pytest.param(["A cat sits on the mat.", "A kitten is sleeping on the rug."], id="two"),
    pytest.param(
        ["A cat sits on the mat.", "", "Stock markets fell sharply today.", "Ünïcödé, 東京 and 😀"], id="three"
    ),
]


@pytest.mark.parametrize("lines", SENTENCES)
def test_text_view_shows_the_embeddings_cosines_and_one_std_plot_per_layer_norm(
    text_page: Page, text_server: str, lines: list[str]
) -> None:
    """Blank lines are skipped; each heatmap cell is the cosine of the embeddings /v1/embeddings gives, to the 3
    decimals shown; each LayerNorm, in the answer's order, has a plot with one series per sentence, a dot a token."""
    texts = [t for t in lines if t]
    text_page.click("#tab-text")
    text_page.fill("#text-input", "\n".join(lines))
    settle(text_page, lambda: text_page.click("#text-run"))
    assert text_page.is_hidden("#text-error")
    body = {"model": "bert", "input": texts, "encoding_format": "float", "return_layer_norms": True}
    answer = httpx.post(text_server + "/v1/embeddings", json=body, timeout=60).json()
    vectors = np.array([d["embedding"] for d in answer["data"]], dtype=np.float64)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cosines = unit @ unit.T
    shown = heatmap(text_page)
    assert sorted(shown) == [(r, c) for r in range(len(texts)) for c in range(len(texts))]
    assert all(shown[i, i] == "1.000" for i in range(len(texts))), shown
    for (r, c), text in shown.items():
        assert abs(float(text) - cosines[r, c]) <= 1e-3, (r, c, text, cosines[r, c])
    tokens = httpx.post(text_server + "/tokenize", json={"model": "bert", "input": texts}, timeout=30).json()
    lengths = [len(t["ids"]) for t in tokens["data"]]
    names = [ln["name"] for ln in answer["data"][0]["layer_norms"]]
    plots = text_page.eval_on_selector_all("#text-ln-plots div.plot", "els => els.map(e => [e.id, e.dataset.layer])")
    assert [layer for _, layer in plots] == names and len(names) == 5  # the embeddings' and two per layer
    want = {sentence_label(i, t): {"paths": 1, "dots": n} for i, (t, n) in enumerate(zip(texts, lengths, strict=True))}
    for plot, _ in plots:
        assert series(text_page, plot) == want
    assert (text_page.text_content("#text-status") or "").startswith(f"bert · {len(texts)} sentence(s) · width 32")


def test_text_models_picker_lists_the_text_encoders_and_the_layernorm_picker_does_not(text_page: Page) -> None:
    assert text_page.eval_on_selector_all("#text-model option", "os => os.map(o => o.value)") == ["bert"]
    assert text_page.eval_on_selector_all("#ln-model option", "os => os.map(o => o.value)") == ["layernorm"]
    assert text_page.eval_on_selector_all("#enc-model option", "os => os.map(o => o.value)") == ["encoder"]
    monitored = text_page.eval_on_selector_all("#mon-model option", "os => os.map(o => o.value)")
    assert sorted(monitored) == ["bert", "encoder", "layernorm"]


def test_text_view_shows_the_services_error_whole(text_page: Page, text_server: str) -> None:
    """Four texts cut at the tiny model's 40 tokens exceed the server's 100 tokens a request: OpenAI's error shape,
    whose message the page shows after the status."""
    texts = [" ".join(["word"] * 60)] * 4
    text_page.click("#tab-text")
    text_page.fill("#text-input", "\n".join(texts))
    settle(text_page, lambda: text_page.click("#text-run"))
    direct = httpx.post(text_server + "/v1/embeddings", json={"model": "bert", "input": texts}, timeout=60)
    assert direct.status_code == 413
    message = direct.json()["error"]["message"]
    assert message == f"input: 160 tokens; at most {MAX_REQUEST_TOKENS} per request (NORMSERVE_MAX_REQUEST_TOKENS)"
    shown = text_page.text_content("#text-error") or ""
    assert shown.startswith("413") and shown.endswith(": " + message), shown
    assert text_page.is_hidden("#text-results")


def test_text_view_refuses_no_sentences_before_sending(text_page: Page) -> None:
    text_page.click("#tab-text")
    text_page.fill("#text-input", "\n  \n")
    settle(text_page, lambda: text_page.click("#text-run"))
    assert text_page.text_content("#text-error") == "Error: type at least one sentence"


def monitor_rows(page: Page) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        "#mon-table tbody tr",
        "trs => trs.map(tr => ({layer: tr.dataset.layer, psi: tr.querySelector('.psi').textContent,"
        " reading: tr.querySelector('.verdict').textContent, verdict: tr.querySelector('.verdict').className,"
        " samples: tr.querySelector('.samples').textContent}))",
    )


def send_traffic(server: str, model: str) -> int:
    """Three requests to model; the positions (rows, tokens) the monitor counts from them."""
    rng = np.random.default_rng(5)
    for _ in range(3):
        if model == "layernorm":
            r = httpx.post(server + "/normalize", json={"data": rng.normal(size=(4, 3)).tolist()}, timeout=30)
        else:
            body = {"model": model, "data": rng.normal(size=(6, 128)).tolist()}
            r = httpx.post(server + "/encode", json=body, timeout=30)
        assert r.status_code == 200, r.text
    return 3 * (4 if model == "layernorm" else 6)


def monitor(server: str, model: str) -> dict[str, Any]:
    answer = httpx.get(f"{server}/v2/models/{model}/monitor", timeout=30)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


@pytest.mark.parametrize("model", ["layernorm", "encoder"])
def test_monitor_view_shows_each_layer_norms_drift_and_window_samples(
    page: Page, server: str, tmp_path: Path, model: str
) -> None:
    """The page's rows are the service's monitor answer: every LayerNorm in order, its PSI to 3 decimals, its reading,
    and the window's sample count, which the traffic sent here has raised above 0."""
    before = {layer["name"]: layer["samples"] for layer in monitor(server, model)["layers"]}
    assert list(before) == (["layernorm"] if model == "layernorm" else layer_norm_names(EncoderConfig()))
    sent = send_traffic(server, model)

    def counted() -> bool:
        return all(layer["samples"] >= before[layer["name"]] + sent for layer in monitor(server, model)["layers"])

    wait_until(counted, f"{model}'s monitor counting the {sent} positions sent")
    page.click("#tab-monitor")
    page.select_option("#mon-model", model)
    # The answer the page got, not a second request's: the window slides, and may drop old counts in between.
    with page.expect_response(f"**/v2/models/{model}/monitor") as response:
        settle(page, lambda: page.click("#mon-refresh"))
    assert page.is_hidden("#mon-error")
    doc = response.value.json()
    rows = monitor_rows(page)
    assert [row["layer"] for row in rows] == [layer["name"] for layer in doc["layers"]] == list(before)
    for row, layer in zip(rows, doc["layers"], strict=True):
        assert int(row["samples"]) == layer["samples"] > 0
        assert row["psi"] == f"{layer['psi']:.3f}"
        assert (row["reading"], row["verdict"]) == (layer["verdict"], f"verdict {layer['verdict']}")
    positions = max(layer["baseline"]["count"] for layer in doc["layers"])
    assert page.text_content("#mon-baseline") == f"Baseline: {doc['baseline']} ({positions} positions)."
    png = page.screenshot(path=str(tmp_path / "monitor.png"), full_page=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "monitor.png").stat().st_size > 10_000


def test_monitor_view_never_reads_an_empty_window_as_stable(text_page: Page, text_server: str) -> None:
    """`encoder` on the text server has its baseline and has had no request: every row says "no samples"."""
    text_page.click("#tab-monitor")
    text_page.select_option("#mon-model", "encoder")
    settle(text_page, lambda: text_page.click("#mon-refresh"))
    doc = monitor(text_server, "encoder")
    assert all(layer["samples"] == 0 and layer["psi"] is None for layer in doc["layers"])
    want = {"psi": "—", "reading": "no samples", "verdict": "verdict nodata", "samples": "no samples"}
    assert monitor_rows(text_page) == [{"layer": name} | want for name in layer_norm_names(EncoderConfig())]


def test_monitor_view_says_a_version_exported_before_baselines_has_none(text_page: Page, text_server: str) -> None:
    text_page.click("#tab-monitor")
    text_page.select_option("#mon-model", "layernorm")
    settle(text_page, lambda: text_page.click("#mon-refresh"))
    assert monitor(text_server, "layernorm") == {
        "model": "layernorm", "version": "1", "window_s": 300.0, "baseline": NO_BASELINE, "layers": []
    }  # fmt: skip
    shown = text_page.text_content("#mon-baseline")
    assert shown == f"Exported before baselines: none. The service says: “{NO_BASELINE}”."
    assert text_page.is_hidden("#mon-table")
    assert text_page.text_content("#mon-status") == "layernorm v1 · window 300 s · 0 LayerNorm(s)"


def test_monitor_view_shows_an_unknown_model_as_the_services_404(text_page: Page, text_server: str) -> None:
    text_page.click("#tab-monitor")
    text_page.eval_on_selector("#mon-model", "s => s.append(new Option('gone', 'gone', true, true))")
    settle(text_page, lambda: text_page.click("#mon-refresh"))
    direct = httpx.get(text_server + "/v2/models/gone/monitor", timeout=30)
    assert direct.status_code == 404
    shown = text_page.text_content("#mon-error") or ""
    assert shown.startswith("404") and shown.endswith(": " + direct.json()["error"]), shown
