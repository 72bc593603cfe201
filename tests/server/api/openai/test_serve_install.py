"""The serve install (`pip install -e .`, no extras: no torch, no transformers) serves an exported text encoder:
/v1/embeddings answers as this venv's in-process model does (1e-5)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.core.runtime import Runtime
from app.core.textencoder import TextEncoderModel
from app.settings import Settings
from tests.core.test_textencoder import MAX_LEN, TEXTS
from tests.live_server import cli_server

pytestmark = pytest.mark.slow


def test_the_serve_install_serves_a_text_encoder_without_torch(base_venv: Path, tmp_path: Path) -> None:
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    tiny = tiny_model(tmp_path / "hf", "bert")
    export_text_encoder(tmp_path / "models", "bert", tiny.path, max_seq_length=MAX_LEN)
    python = str(base_venv / "bin" / "python")
    for module in ("torch", "transformers"):
        missing = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
        assert missing.returncode == 1 and f"No module named '{module}'" in missing.stderr
    runtime = Runtime(Settings(model_dir=tmp_path / "models"))
    runtime.load()
    model = runtime.get("bert")
    assert isinstance(model, TextEncoderModel)
    expected = model.infer(model.tokenize(TEXTS)).sentence_embedding
    env = {"NORMSERVE_MODEL_DIR": str(tmp_path / "models"), "PATH": str(base_venv / "bin")}
    with cli_server([python, "-m", "app.cli.main", "serve"], env) as server:
        answer = httpx.post(f"{server.base}/v1/embeddings", json={"model": "bert", "input": TEXTS}, timeout=60)
    assert answer.status_code == 200
    got = np.array([d["embedding"] for d in answer.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
