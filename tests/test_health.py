"""Liveness and readiness: ready only after sha256 checks and the parity warm-up; live regardless."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
from live_server import MODELS, live_server


def test_ready_and_live_when_models_verified(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}


def _tampered_copy(tmp_path: Path, how: str) -> Path:
    target = tmp_path / "models"
    shutil.copytree(MODELS, target)
    if how == "tampered":
        with (target / "layernorm.onnx").open("ab") as f:
            f.write(b"\0")
    elif how == "missing":
        (target / "encoder.onnx").unlink()
    elif how == "no-manifest":
        (target / "manifest.json").unlink()
    return target


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("tampered", "layernorm.onnx: sha256"),
        ("missing", "encoder.onnx: model file missing"),
        ("no-manifest", "manifest missing"),
    ],
)
def test_bad_model_dir_keeps_server_live_but_not_ready(tmp_path: Path, how: str, reason: str) -> None:
    model_dir = _tampered_copy(tmp_path, how)
    with (
        live_server({"NORMSERVE_MODEL_DIR": str(model_dir)}, wait_ready=False) as base,
        httpx.Client(base_url=base) as c,
    ):
        assert c.get("/v2/health/live").status_code == 200
        for _ in range(100):  # loading runs in the background: wait until it has given up
            r = c.get("/v2/health/ready")
            if "model check failed" in r.text:
                break
            time.sleep(0.05)
        assert r.status_code == 503 and reason in r.json()["error"]
        assert r.headers["retry-after"] == "1"
        inf = c.post("/normalize", json={"data": [1.0, 2.0]})
        assert inf.status_code == 503 and inf.headers["retry-after"] == "1"
        assert "server is not ready: model check failed" in inf.json()["error"]
