"""Model repositories for tests: copies of the repo's models/ (whole, or with one thing broken), new versions, and
learned LayerNorms made by hand.

A learned LayerNorm is the default layernorm graph plus weights.npz (gamma, beta) and a config with
normalized_shape and eps, exactly what `normserve export layernorm` writes, but made without torch so
that server tests need no export extra.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np

from app.core.model import sha256_of
from tests.live_server import MODELS

BROKEN = ["tampered", "missing", "no-manifest"]  # the breakages of broken_copy


def copy_models(target: Path, names: tuple[str, ...] = ("layernorm", "encoder", "encoder-preln")) -> Path:
    """The repo's default models (version 1 each) copied into target."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(MODELS / name, target / name)
    return target


def broken_copy(tmp_path: Path, how: str) -> Path:
    """models/ copied under tmp_path, then: a byte appended to layernorm's model.onnx, encoder's deleted, or
    layernorm's manifest deleted."""
    target = copy_models(tmp_path / "models")
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


def add_version(root: Path, name: str, version: int, source: int = 1) -> Path:
    """A copy of a version as a new one, its manifest saying so; written in a sibling folder, then renamed."""
    tmp = root / name / f".{version}-tmp"
    shutil.copytree(root / name / str(source), tmp)
    manifest = json.loads((tmp / "manifest.json").read_text())
    (tmp / "manifest.json").write_text(json.dumps(manifest | {"version": version}, indent=2))
    tmp.rename(root / name / str(version))
    return root / name / str(version)


def learned_layernorm(
    root: Path, name: str, version: int, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5
) -> Path:
    """A learned LayerNorm of normalized_shape gamma.shape, as `normserve export layernorm` lays it out."""
    folder = root / name / str(version)
    folder.mkdir(parents=True)
    shutil.copyfile(MODELS / "layernorm/1/model.onnx", folder / "model.onnx")
    np.savez(folder / "weights.npz", gamma=gamma.astype(np.float32), beta=beta.astype(np.float32))
    manifest = json.loads((MODELS / "layernorm/1/manifest.json").read_text())
    manifest |= {
        "name": name,
        "version": version,
        "config": {"normalized_shape": list(gamma.shape), "eps": eps},
        "files": {f: sha256_of(folder / f) for f in ("model.onnx", "weights.npz")},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder


def sha256sum_identity(folder: Path) -> str:
    """A version's identity as docs/api.md tells users to compute it: coreutils' `sha256sum FILES | sha256sum` in
    the version's folder, over the files its manifest lists in name order (not the server's own code)."""
    files = sorted(json.loads((folder / "manifest.json").read_text())["files"])
    command = f"sha256sum {shlex.join(files)} | sha256sum"
    out = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True, check=True)
    return out.stdout.split()[0]
