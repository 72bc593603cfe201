"""`normserve` on the serve install alone (`pip install -e .`: no extras, no torch, no httpx), as a newcomer has it.

Every command's --help answers there, and a command that needs an extra says which, in one line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.live_server import ROOT


def normserve(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NORMSERVE_", "PYTHON"))}
    return subprocess.run(
        [str(venv / "bin" / "normserve"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_base_install_has_no_extra(base_venv: Path) -> None:
    code = "import importlib.util as u; print([m for m in ('torch', 'onnx', 'httpx', 'matplotlib') if u.find_spec(m)])"
    out = subprocess.run([str(base_venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["export", "export encoder", "export layernorm", "serve", "validate", "bench"])
def test_every_commands_help_answers_without_the_extras(base_venv: Path, command: str) -> None:
    out = normserve(base_venv, *command.split(), "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: normserve {command} [-h]")
    assert out.stderr == ""


def test_the_commands_overview_answers_without_the_extras(base_venv: Path) -> None:
    out = normserve(base_venv, "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: normserve {export,serve,validate,models,bench}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench"], "normserve bench: needs the test extra (httpx missing): pip install -e '.[test]'"),
        (
            ["bench", "--quick", "--no-kserve"],
            "normserve bench: needs the test extra (httpx missing): pip install -e '.[test]'",
        ),
        (["export"], "normserve export: needs the export extra (torch missing): pip install -e '.[export]'"),
        (
            ["export", "--out-dir", "/nonexistent/models", "--d-model", "16"],
            "normserve export: needs the export extra (torch missing): pip install -e '.[export]'",
        ),
        (
            ["export", "layernorm", "--name", "mine", "--checkpoint", "ln.pt"],
            "normserve export: needs the export extra (torch missing): pip install -e '.[export]'",
        ),
    ],
    ids=["bench", "bench-quick", "export", "export-with-flags", "export-layernorm"],
)
def test_a_missing_extra_is_one_line_naming_it(base_venv: Path, args: list[str], message: str) -> None:
    out = normserve(base_venv, *args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [message]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["bench", "--sections", "floor,nope"],
            "normserve bench: error: unknown sections ['nope']; expected some of pinned,floor,codecs,http,batching,monitor,memory,embeddings",
        ),
        (["export", "--d-model", "x"], "normserve export: error: argument --d-model: invalid int value: 'x'"),
        (
            ["export", "encoder", "--name", "mine", "--checkpoint", "c.pt"],
            "normserve export encoder: error: --num-heads is required with --checkpoint: a state_dict does not "
            "record it",
        ),
    ],
    ids=["bench", "export", "export-encoder"],
)
def test_bad_flags_are_refused_before_the_extra_is_asked_for(base_venv: Path, args: list[str], message: str) -> None:
    out = normserve(base_venv, *args)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == message
