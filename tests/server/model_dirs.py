"""Copies of the repo's models/ with one thing broken, and the whole reason a worker then gives for not being ready."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.live_server import MODELS

BROKEN = ["tampered", "missing", "no-manifest"]


def broken_copy(tmp_path: Path, how: str) -> Path:
    """models/ copied under tmp_path, then: a byte appended to layernorm's model.onnx, encoder's deleted, or
    layernorm's manifest deleted."""
    target = tmp_path / "models"
    shutil.copytree(MODELS, target)
    if how == "tampered":
        with (target / "layernorm/1/model.onnx").open("ab") as f:
            f.write(b"\0")
    elif how == "missing":
        (target / "encoder/1/model.onnx").unlink()
    elif how == "no-manifest":
        (target / "layernorm/1/manifest.json").unlink()
    else:
        raise ValueError(f"unknown breakage {how!r}")
    return target


def not_ready_reason(models: Path, how: str) -> str:
    """The whole reason of a worker whose start found the copy broken as `how` says: paths repository-relative."""
    if how == "tampered":
        path = models / "layernorm/1/model.onnx"
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        expected = json.loads((MODELS / "layernorm/1/manifest.json").read_text())["files"]["model.onnx"]
        return f"model check failed: layernorm/1/model.onnx: sha256 {actual} does not match the manifest's {expected}"
    if how == "missing":
        return "model check failed: encoder/1/model.onnx: model file missing"
    return "model check failed: layernorm/1/manifest.json: manifest missing"
