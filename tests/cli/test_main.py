"""The `normserve` command as users run it: --help everywhere, export with progress, validate in process and by URL."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.live_server import MODELS, ROOT

NORMSERVE = Path(sys.executable).parent / "normserve"
SMALL = ["--d-model", "16", "--num-heads", "2", "--d-ff", "32", "--num-layers", "1", "--max-sequence-length", "32"]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NORMSERVE_MODEL_DIR": str(MODELS), **(env or {})}
    return subprocess.run(
        [str(NORMSERVE), *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on return: nothing listens there


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--help"], ["export", "serve", "validate"]),
        (
            ["export", "--help"],
            ["--out-dir", "--checkpoint", "--checkpoint-preln", "--d-model", "--num-layers", "--opset"],
        ),
        (["serve", "--help"], ["--host", "--port", "--workers", "--model-dir", "PROMETHEUS_MULTIPROC_DIR"]),
        (["validate", "--help"], ["--url", "--model-dir", "--atol", "Exit status"]),
    ],
    ids=["normserve", "export", "serve", "validate"],
)
def test_help_exits_0_and_lists_the_options(args: list[str], mentions: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 0, out.stderr
    for word in mentions:
        assert word in out.stdout


def test_export_shows_each_step_and_writes_the_models(tmp_path: Path) -> None:
    out = run("export", "--out-dir", str(tmp_path / "models"), *SMALL)
    assert out.returncode == 0, out.stderr
    steps = out.stderr.splitlines()
    assert [line.split("] ")[0] for line in steps] == [f"[{i}" for i in range(1, len(steps) + 1)]  # numbered steps
    for name in ("layernorm", "encoder", "encoder-preln"):
        assert any(f"exporting {name} (" in line for line in steps)
        assert any(f"parity {name}: torch" in line for line in steps)
    assert "wrote layernorm, encoder, encoder-preln and manifest.json" in steps[-1]
    manifest = json.loads((tmp_path / "models" / "manifest.json").read_text())
    assert manifest["models"]["encoder"]["config"]["d_model"] == 16


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "--d-model", "15"], "d_model 15 must be even"),
        (["export", "--checkpoint", "/nonexistent/ckpt.pt"], "/nonexistent/ckpt.pt"),
        (["validate", "--model-dir", "/nonexistent/models"], "/nonexistent/models: no manifest.json"),
        (["validate", "--url", "127.0.0.1:8000"], "is not an http(s)://host:port URL"),
        (["validate", "--url", "http://127.0.0.1:{closed}"], "cannot reach http://127.0.0.1:{closed}/v2/health/ready"),
        (["serve"], "NORMSERVE_PORT"),
        (["no-such-command"], "unknown command 'no-such-command'"),
    ],
    ids=[
        "export-bad-config",
        "export-missing-checkpoint",
        "validate-no-models",
        "validate-not-a-url",
        "validate-unreachable",
        "serve-bad-env",
        "unknown-command",
    ],
)
def test_errors_are_one_line_with_a_nonzero_exit(args: list[str], message: str) -> None:
    port = str(_closed_port())
    env = {"NORMSERVE_PORT": "not-a-port"} if args == ["serve"] else None
    out = run(*[a.replace("{closed}", port) for a in args], env=env)
    assert out.returncode != 0
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("normserve") and "error" in line and message.replace("{closed}", port) in line


def test_validate_in_process_prints_a_parity_table() -> None:
    out = run("validate", "--model-dir", str(MODELS))
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "warm-up vs NumPy" in line]
    assert sorted(line.split()[1] for line in rows) == ["encoder", "encoder-preln", "layernorm"]
    assert all("pass" in line for line in rows)
    assert "all 3 checks passed" in out.stdout
    assert "[2/2] parity warm-up against NumPy" in out.stderr


def test_validate_url_checks_every_model_of_a_running_server(server: str) -> None:
    out = run("validate", "--url", server)
    assert out.returncode == 0, out.stderr
    rows = [line.split("│")[1:-1] for line in out.stdout.splitlines() if line.startswith("│ ")]  # a wrapped cell
    models = [cells[0].strip() for cells in rows if cells[0].strip()]
    assert models == ["layernorm"] * 4 + ["encoder", "encoder-preln"]
    for cells in rows:
        if cells[0].strip():
            diff, atol, result = (c.strip() for c in cells[2:])
            assert float(diff) <= float(atol) and result == "pass"
    assert "all 6 checks passed" in out.stdout
    assert "[6/6] POST /encode (model encoder-preln, validate: true)" in out.stderr


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
    shutil.copytree(MODELS, models)
    manifest = json.loads((models / "manifest.json").read_text())
    entry = manifest["models"]["encoder"]["weights"]
    with np.load(models / entry["file"]) as npz:
        weights = {k: npz[k] for k in npz.files}
    name = next(k for k in sorted(weights) if k.endswith("weight") and weights[k].ndim == 2)
    weights[name] = weights[name] * 1.01  # the NumPy reference now differs from the ONNX graph
    np.savez(models / entry["file"], **weights)
    entry["sha256"] = hashlib.sha256((models / entry["file"]).read_bytes()).hexdigest()  # sha256 checks still pass
    (models / "manifest.json").write_text(json.dumps(manifest))
    out = run("validate", "--model-dir", str(models))
    assert out.returncode == 1
    assert (
        out.stderr.splitlines()[-1].startswith("normserve validate: FAIL: ") and "parity warm-up failed" in out.stderr
    )
