"""The `normserve` command as users run it: dispatch, --help everywhere, export with progress, one-line errors.

`normserve serve` and `normserve validate` have their own modules (test_serve.py, test_validate.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.normserve import run

SMALL = ["--d-model", "16", "--num-heads", "2", "--d-ff", "32", "--num-layers", "1", "--max-sequence-length", "32"]


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--help"], ["export", "serve", "validate"]),
        (
            ["export", "--help"],
            [
                "--repository",
                "--out-dir",
                "--checkpoint-preln",
                "--d-model",
                "--opset",
                "normserve export encoder --help",
                "Hugging Face",
            ],
        ),
        (
            ["export", "encoder", "--help"],
            [
                "--name",
                "--module",
                "pickled",
                "--checkpoint",
                "--num-heads",
                "--activation",
                "--d-model",
                "--pre-ln",
                "--eps",
                "--positional-encoding",
                "--check-input",
                "--check-mask",
                "--repository",
            ],
        ),
        (
            ["export", "layernorm", "--help"],
            ["--name", "--module", "--checkpoint", "--eps", "--check-output", "--repository", "torch.nn.LayerNorm"],
        ),
        (
            ["export", "text-encoder", "--help"],
            [
                "--name",
                "--hf",
                "--max-sequence-length",
                "--pooling",
                "--normalize",
                "--no-normalize",
                "--tolerance",
                "--check-texts",
                "--calibration",
                "--version",
                "--model-dir",
                "trust_remote_code",
            ],
        ),
        (["serve", "--help"], ["--host", "--port", "--workers", "--model-dir", "PROMETHEUS_MULTIPROC_DIR"]),
        (["validate", "--help"], ["--url", "--model-dir", "--atol", "Exit status"]),
    ],
    ids=["normserve", "export", "export-encoder", "export-layernorm", "export-text-encoder", "serve", "validate"],
)
def test_help_exits_0_and_lists_the_options(args: list[str], mentions: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 0, out.stderr
    for word in mentions:
        assert word in out.stdout


def test_export_shows_each_step_and_writes_the_models(tmp_path: Path) -> None:
    out = run("export", "--repository", str(tmp_path / "models"), *SMALL)
    assert out.returncode == 0, out.stderr
    steps = out.stderr.splitlines()
    assert [line.split("] ")[0] for line in steps] == [f"[{i}" for i in range(1, len(steps) + 1)]  # numbered steps
    for name in ("layernorm", "encoder", "encoder-preln"):
        assert any(f"exporting {name} (" in line for line in steps)
        assert any(f"parity {name}: torch" in line for line in steps)
    assert steps[-1].endswith(f"wrote layernorm/1, encoder/1, encoder-preln/1 to {tmp_path / 'models'}")
    assert out.stdout.splitlines() == [
        f"exported {name} version 1 to {tmp_path / 'models' / name / '1'}"
        for name in ("layernorm", "encoder", "encoder-preln")
    ]
    manifest = json.loads((tmp_path / "models" / "encoder" / "1" / "manifest.json").read_text())
    assert (manifest["name"], manifest["version"], manifest["config"]["d_model"]) == ("encoder", 1, 16)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "--d-model", "15"], "d_model 15 must be even"),
        (["export", "--checkpoint", "/nonexistent/ckpt.pt"], "/nonexistent/ckpt.pt"),
        (
            ["export", "encoder", "--name", "mine", "--checkpoint", "/nonexistent/ckpt.pt", "--num-heads", "2"],
            "/nonexistent/ckpt.pt",
        ),
        (["serve"], "NORMSERVE_PORT"),
        (["no-such-command"], "unknown command 'no-such-command'"),
    ],
    ids=[
        "export-bad-config",
        "export-missing-checkpoint",
        "export-encoder-missing-checkpoint",
        "serve-bad-env",
        "unknown-command",
    ],
)
def test_errors_are_one_line_with_a_nonzero_exit(args: list[str], message: str) -> None:
    env = {"NORMSERVE_PORT": "not-a-port"} if args == ["serve"] else None
    out = run(*args, env=env)
    assert out.returncode != 0
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("normserve") and "error" in line and message in line
