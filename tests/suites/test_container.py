"""The container: the Dockerfile lints clean, and the runtime stage's exact steps serve without torch.

Docker cannot run on these machines, so the runtime stage is replayed in a fresh venv:
the same requirements file, the same `pip install --no-deps .`, the same CMD.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_server import MODELS, ROOT, cli_server

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _runtime_stage() -> list[str]:
    stage = DOCKERFILE.split(" AS runtime", 1)[1]
    return [
        line.strip() for line in stage.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")
    ]


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    out = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_runtime_stage_has_no_torch_runs_as_non_root_and_probes_readiness() -> None:
    stage = "\n".join(_runtime_stage())
    assert "torch" not in stage
    assert "USER 10001" in stage
    assert "HEALTHCHECK" in stage and "/v2/health/ready" in stage and "curl" not in stage
    assert "requirements-serve.txt" in stage and stage.index("requirements-serve.txt") < stage.index("COPY app")
    assert "torch" not in (ROOT / "requirements-serve.txt").read_text()


def _cmd() -> list[str]:
    line = next(line for line in _runtime_stage() if line.startswith("CMD"))
    return list(json.loads(line[len("CMD") :]))


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for line in _runtime_stage():
        if line.startswith("RUN pip install"):
            args = shlex.split(line.split("&&")[0])[3:]
            subprocess.run([*pip, *args], cwd=ROOT, check=True)
    yield venv


def test_runtime_venv_has_no_torch(runtime_venv: Path) -> None:
    out = subprocess.run([str(runtime_venv / "bin" / "python"), "-c", "import torch"], capture_output=True, text=True)
    assert out.returncode != 0 and "No module named 'torch'" in out.stderr


def test_runtime_cmd_serves_the_models_without_torch(runtime_venv: Path, tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NORMSERVE_")},
        "PATH": f"{runtime_venv / 'bin'}:{os.environ['PATH']}",
        "NORMSERVE_MODEL_DIR": str(MODELS),
    }  # cli_server adds NORMSERVE_HOST=127.0.0.1 (the image binds 0.0.0.0; tests stay on loopback) and the port
    with cli_server(_cmd(), env, cwd=tmp_path, timeout=60) as server:
        r = httpx.post(server.base + "/normalize", json={"data": [[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]})
        assert r.status_code == 200
        assert [round(v, 4) for v in r.json()["output"][1]] == [1.414, -0.707, -0.707]
