"""app/cli/validate.py: `normserve validate` in process and against a running server: its plans, checks and exit codes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from app.cli.validate import NORMALIZE_CASES, Check, ValidateError, in_process_plan, remote_plan
from app.core.layernorm import WARM_UP_ATOL
from app.core.model import ModelLoadError
from app.core.runtime import Runtime
from app.settings import Settings
from tests.cli.normserve import closed_port, run
from tests.live_server import MODELS, live_server
from tests.repositories import copy_models, learned_layernorm

NAMES = sorted(["encoder/1", "encoder-preln/1", "layernorm/1"])


def _tamper(models: Path) -> Path:
    """A byte appended to layernorm's model.onnx; its path."""
    path = models / "layernorm/1/model.onnx"
    with path.open("ab") as f:
        f.write(b"\0")
    return path


# ---- the command, as users run it ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["validate", "--model-dir", "/nonexistent/models"],
            "normserve validate: error: /nonexistent/models: model repository missing; run `normserve export` or pass --model-dir",
        ),
        (
            ["validate", "--url", "127.0.0.1:8000"],
            "normserve validate: error: --url '127.0.0.1:8000' is not an http(s)://host:port URL",
        ),
        (
            ["validate", "--url", "http://127.0.0.1:{closed}"],
            "normserve validate: error: cannot reach http://127.0.0.1:{closed}/v2/health/ready: [Errno 111] Connection refused",
        ),
    ],
    ids=["validate-no-models", "validate-not-a-url", "validate-unreachable"],
)
def test_errors_are_one_line_with_exit_2(args: list[str], line: str) -> None:
    port = str(closed_port())
    out = run(*[a.replace("{closed}", port) for a in args])
    assert (out.returncode, out.stdout, out.stderr.splitlines()) == (2, "", [line.replace("{closed}", port)])


def test_validate_in_process_prints_a_parity_table() -> None:
    out = run("validate", "--model-dir", str(MODELS))
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "warm-up vs NumPy" in line]
    assert sorted(line.split()[1] for line in rows) == NAMES
    assert all("pass" in line for line in rows)
    assert "all 3 checks passed" in out.stdout
    assert "[2/2] parity warm-up against NumPy" in out.stderr


def test_validate_url_checks_every_model_of_a_running_server(server: str) -> None:
    out = run("validate", "--url", server)
    assert out.returncode == 0, out.stderr
    rows = [line.split("│")[1:-1] for line in out.stdout.splitlines() if line.startswith("│ ")]  # a wrapped cell
    models = [cells[0].strip() for cells in rows if cells[0].strip()]
    assert models == ["encoder/1", "encoder-preln/1"] + ["layernorm/1"] * 4
    for cells in rows:
        if cells[0].strip():
            diff, atol, result = (c.strip() for c in cells[2:])
            assert float(diff) <= float(atol) and result == "pass"
    assert "all 6 checks passed" in out.stdout
    assert f"[6/6] POST /normalize (layernorm/1, {NORMALIZE_CASES[-1][0]})" in out.stderr


def test_validate_url_fails_with_exit_1_when_a_check_misses_its_tolerance(server: str) -> None:
    out = run("validate", "--url", server, "--atol", "1e-12")
    assert out.returncode == 1
    assert out.stdout.count("FAIL") == 6 and "6 of 6 checks failed" in out.stdout


def test_validate_url_with_a_path_that_is_not_normserve_is_one_line_error(server: str) -> None:
    out = run("validate", "--url", server + "/not-normserve")
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert (
        line
        == f"normserve validate: error: GET {server}/not-normserve/v2/health/ready: HTTP 404: no route GET /not-normserve/v2/health/ready"
    )


def test_validate_in_process_fails_with_exit_1_when_weights_do_not_match_the_graph(tmp_path: Path) -> None:
    models = tmp_path / "models"
    copy_models(models)
    manifest = json.loads((models / "encoder/1/manifest.json").read_text())
    path = models / "encoder/1/weights.npz"
    with np.load(path) as npz:
        weights = {k: npz[k] for k in npz.files}
    name = next(k for k in sorted(weights) if k.endswith("weight") and weights[k].ndim == 2)
    weights[name] = weights[name] * 1.01  # the NumPy reference now differs from the ONNX graph
    np.savez(path, **weights)
    manifest["files"]["weights.npz"] = hashlib.sha256(path.read_bytes()).hexdigest()  # sha256 checks still pass
    (models / "encoder/1/manifest.json").write_text(json.dumps(manifest))
    out = run("validate", "--model-dir", str(models))
    assert out.returncode == 1
    assert (
        out.stderr.splitlines()[-1].startswith("normserve validate: FAIL: ") and "parity warm-up failed" in out.stderr
    )


# ---- Check ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("diff", "atol", "passed"),
    [(1e-6, 1e-5, True), (1e-5, 1e-5, True), (0.0, 1e-5, True), (2e-5, 1e-5, False), (float("nan"), 1.0, False)],
    ids=["under", "equal", "zero", "over", "nan"],
)
def test_a_check_passes_when_its_difference_is_within_atol(diff: float, atol: float, passed: bool) -> None:
    assert Check("layernorm", "var k=1", diff, atol).passed is passed


# ---- in process: the steps of Worker.start ---------------------------------------------------------


def test_in_process_plan_loads_then_warms_up_every_model() -> None:
    plan = in_process_plan(MODELS)
    assert [description for description, _ in plan] == [
        f"verifying sha256 and loading {MODELS}",
        "parity warm-up against NumPy",
    ]
    (_, load), (_, warm_up) = plan
    assert load() == []
    checks = warm_up()
    assert sorted(c.model for c in checks) == NAMES
    assert {c.check for c in checks} == {"warm-up vs NumPy"}
    assert {c.model: c.atol for c in checks} == {
        "encoder/1": 1e-4,
        "encoder-preln/1": 1e-4,
        "layernorm/1": WARM_UP_ATOL,
    }
    assert all(c.passed and c.max_abs_diff > 0 for c in checks)


def test_in_process_plan_with_atol_checks_every_model_against_it() -> None:
    (_, load), (_, warm_up) = in_process_plan(MODELS, atol=1e-12)
    load()
    checks = warm_up()
    assert [(c.atol, c.passed) for c in checks] == [(1e-12, False)] * 3


def test_in_process_plan_of_a_directory_without_models_is_refused_before_any_step(tmp_path: Path) -> None:
    with pytest.raises(ValidateError) as e:
        in_process_plan(tmp_path / "models")
    assert str(e.value) == f"{tmp_path}/models: model repository missing; run `normserve export` or pass --model-dir"


def test_in_process_load_step_reports_a_tampered_file_as_a_validate_error(tmp_path: Path) -> None:
    models = copy_models(tmp_path / "models")
    path = _tamper(models)
    expected = json.loads((models / "layernorm/1/manifest.json").read_text())["files"]["model.onnx"]
    (_, load), _ = in_process_plan(models)
    with pytest.raises(ValidateError) as e:
        load()
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    assert str(e.value) == f"{path}: sha256 {actual} does not match the manifest's {expected}"


def test_in_process_warm_up_step_stops_at_a_model_past_the_services_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Runtime(Settings(model_dir=MODELS, batch_max_size=1))
    diff, _ = runtime.build("encoder", 1).warm_up()  # the first model the warm-up runs (sorted by name)
    monkeypatch.setenv("NORMSERVE_VALIDATE_ATOL", "1e-12")  # the worker's own Settings read it
    (_, load), (_, warm_up) = in_process_plan(MODELS)
    load()
    with pytest.raises(ModelLoadError) as e:
        warm_up()
    assert str(e.value) == f"{MODELS}/encoder/1/model.onnx: parity warm-up failed, max abs diff {diff:.3g} > 1e-12"


# ---- against a running server ---------------------------------------------------------------------


def test_remote_plan_checks_each_normalize_case_then_each_encoder(server: str) -> None:
    plan = remote_plan(server + "/")  # a trailing slash is the same server
    assert [description for description, _ in plan] == [
        "POST /encode (encoder v1, validate: true)",
        "POST /encode (encoder-preln v1, validate: true)",
        *(f"POST /normalize (layernorm/1, {case[0]})" for case in NORMALIZE_CASES),
    ]
    checks = [check for _, step in plan for check in step()]
    assert [(c.model, c.check) for c in checks] == [
        ("encoder/1", "encode, validate: true"),
        ("encoder-preln/1", "encode, validate: true"),
        *(("layernorm/1", case[0]) for case in NORMALIZE_CASES),
    ]
    assert all(c.passed and 0 <= c.max_abs_diff for c in checks)
    assert [c.atol for c in checks[:2]] == [1e-4, 1e-4]  # the server's NORMSERVE_VALIDATE_ATOL
    assert all(1e-5 < c.atol < 2e-5 for c in checks[2:])  # 1e-5 x max(1, |gamma|) plus half an ulp


def test_remote_plan_with_atol_holds_every_check_to_it(server: str) -> None:
    checks = [check for _, step in remote_plan(server, atol=1e-12) for check in step()]
    assert [(c.atol, c.passed) for c in checks] == [(1e-12, False)] * 6


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://127.0.0.1:8000", "http://", "localhost"])
def test_remote_plan_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValidateError) as e:
        remote_plan(url)
    assert str(e.value) == f"--url {url!r} is not an http(s)://host:port URL"


def test_remote_plan_of_an_unreachable_server_says_so_before_any_step() -> None:
    port = closed_port()
    with pytest.raises(ValidateError) as e:
        remote_plan(f"http://127.0.0.1:{port}")
    assert str(e.value) == f"cannot reach http://127.0.0.1:{port}/v2/health/ready: [Errno 111] Connection refused"


def test_remote_plan_reports_the_servers_own_error(server: str) -> None:
    with pytest.raises(ValidateError) as e:
        remote_plan(server + "/elsewhere")
    assert str(e.value) == f"GET {server}/elsewhere/v2/health/ready: HTTP 404: no route GET /elsewhere/v2/health/ready"


def test_remote_plan_checks_every_version_of_a_users_learned_layernorm(tmp_path: Path) -> None:
    root = copy_models(tmp_path / "models", ("layernorm",))
    rng = np.random.default_rng(5)
    for version in (1, 2):
        learned_layernorm(root, "my-ln", version, 1 + rng.standard_normal((2, 4)), rng.standard_normal((2, 4)))
    (root / "my-ln/model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    with live_server({"NORMSERVE_MODEL_DIR": str(root)}) as base:
        checks = [check for _, step in remote_plan(base) for check in step()]
    assert [(c.model, c.check) for c in checks] == [
        *(("layernorm/1", case[0]) for case in NORMALIZE_CASES),
        ("my-ln/1", "learned"),
        ("my-ln/2", "learned"),
    ]
    assert all(c.passed for c in checks)


# ---- text encoders ------------------------------------------------------------------------------------

TEXT_CHECKS = ["embedding", "hidden states", "LayerNorm mean", "LayerNorm std"]


@pytest.fixture(scope="module")
def text_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo's layernorm beside a tiny random BERT and DistilBERT exported as text encoders."""
    pytest.importorskip("transformers")
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    root = tmp_path_factory.mktemp("text")
    models = copy_models(root / "models", ("layernorm",))
    for model_type in ("bert", "distilbert"):
        export_text_encoder(models, f"tiny-{model_type}", tiny_model(root / model_type, model_type).path)
    return models


def test_in_process_plan_checks_each_text_encoder_on_the_validation_texts(text_models: Path) -> None:
    (_, load), (_, warm_up) = in_process_plan(text_models)
    load()
    checks = warm_up()
    assert [(c.model, c.check) for c in checks] == [
        ("layernorm/1", "warm-up vs NumPy"),
        ("tiny-bert/1", "warm-up vs NumPy"),
        ("tiny-distilbert/1", "warm-up vs NumPy"),
        *((f"tiny-{t}/1", f"texts: {what}") for t in ("bert", "distilbert") for what in TEXT_CHECKS),
    ]
    assert all(c.passed and 0 < c.max_abs_diff for c in checks)
    # The sentence embedding within 1e-5 of the reference; the others within 1e-5 of their magnitude.
    assert [c.atol for c in checks if c.check == "texts: embedding"] == [1e-5, 1e-5]
    assert all(c.atol >= 1e-5 for c in checks[3:])


def test_in_process_plan_with_atol_holds_text_encoders_to_it(text_models: Path) -> None:
    (_, load), (_, warm_up) = in_process_plan(text_models, atol=1e-12)
    load()
    checks = warm_up()
    assert [(c.atol, c.passed) for c in checks] == [(1e-12, False)] * (3 + 2 * len(TEXT_CHECKS))


def test_validate_in_process_prints_the_text_encoders_figures(text_models: Path) -> None:
    out = run("validate", "--model-dir", str(text_models))
    assert out.returncode == 0, out.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.stdout.splitlines() if "texts: " in line]
    assert [(row[0], row[1], row[-1]) for row in rows] == [
        (f"tiny-{t}/1", f"texts: {what}", "pass") for t in ("bert", "distilbert") for what in TEXT_CHECKS
    ]
    assert "all 11 checks passed" in out.stdout


def test_remote_plan_says_a_text_encoder_is_not_checked_over_http(text_models: Path) -> None:
    with live_server({"NORMSERVE_MODEL_DIR": str(text_models)}) as base:
        plan = remote_plan(base)
        checks = [check for _, step in plan for check in step()]
    assert [description for description, _ in plan] == [
        *(f"POST /normalize (layernorm/1, {case[0]})" for case in NORMALIZE_CASES),
        "tiny-bert v1: a text encoder, not checked over HTTP (validate in process)",
        "tiny-distilbert v1: a text encoder, not checked over HTTP (validate in process)",
    ]
    assert [c.model for c in checks] == ["layernorm/1"] * len(NORMALIZE_CASES)
