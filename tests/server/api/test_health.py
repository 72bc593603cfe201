"""Liveness and readiness: ready only after sha256 checks and the parity warm-up; live regardless."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.live_server import MODELS, live_server


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


# {models}: the model directory; {sha256}: the tampered file's; {manifest_sha256}: the one the manifest expects.
@pytest.mark.parametrize(
    ("how", "reason"),
    [
        pytest.param(
            "tampered",
            "model check failed: {models}/layernorm.onnx: sha256 {sha256} does not match the manifest's {manifest_sha256}",
            id="tampered",
        ),
        pytest.param("missing", "model check failed: {models}/encoder.onnx: model file missing", id="missing"),
        pytest.param(
            "no-manifest",
            "model check failed: {models}/manifest.json: manifest missing; run `normserve export`",
            id="no-manifest",
        ),
    ],
)
def test_bad_model_dir_keeps_server_live_but_not_ready(tmp_path: Path, how: str, reason: str) -> None:
    model_dir = _tampered_copy(tmp_path, how)
    reason = reason.format(
        models=model_dir,
        sha256=hashlib.sha256((model_dir / "layernorm.onnx").read_bytes()).hexdigest(),
        manifest_sha256=json.loads((MODELS / "manifest.json").read_text())["models"]["layernorm"]["sha256"],
    )
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
        assert r.status_code == 503 and r.json()["error"] == f"not ready: {reason}"
        assert r.headers["retry-after"] == "1"
        inf = c.post("/normalize", json={"data": [1.0, 2.0]})
        assert inf.status_code == 503 and inf.headers["retry-after"] == "1"
        assert inf.json()["error"] == f"server is not ready: {reason}"
