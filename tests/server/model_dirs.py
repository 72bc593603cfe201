"""Copies of the repo's models/ with one thing broken, and the whole reason a worker then gives for not being ready."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.live_server import MODELS

BROKEN = ["tampered", "missing", "no-manifest"]


def broken_copy(tmp_path: Path, how: str) -> Path:
    """models/ copied under tmp_path, then: a byte appended to layernorm.onnx, encoder.onnx deleted, or no manifest."""
    target = tmp_path / "models"
    shutil.copytree(MODELS, target)
    if how == "tampered":
        with (target / "layernorm.onnx").open("ab") as f:
            f.write(b"\0")
    elif how == "missing":
        (target / "encoder.onnx").unlink()
    elif how == "no-manifest":
        (target / "manifest.json").unlink()
    else:
        raise ValueError(f"unknown breakage {how!r}")
    return target


def not_ready_reason(models: Path, how: str) -> str:
    """The whole reason of a worker whose start found the copy broken as `how` says."""
    if how == "tampered":
        actual = hashlib.sha256((models / "layernorm.onnx").read_bytes()).hexdigest()
        expected = json.loads((MODELS / "manifest.json").read_text())["models"]["layernorm"]["sha256"]
        return f"model check failed: {models}/layernorm.onnx: sha256 {actual} does not match the manifest's {expected}"
    if how == "missing":
        return f"model check failed: {models}/encoder.onnx: model file missing"
    return f"model check failed: {models}/manifest.json: manifest missing; run `normserve export`"
