"""The user's own check pair (--check-input, --check-output, --check-mask): what pins an export to the trained model.

A state_dict does not record the heads, the activation or the norm placement; an input the user ran
through their module and the output it gave do. The exported graph is run on that input as the server
runs it, and the export fails, writing nothing, where it answers otherwise beyond the tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from app.export.graph import ExportError, sha256
from app.export.parity import LayerNormCase, layernorm_feeds


class CheckFailed(ExportError):
    """The exported model's answer to the user's input differs from their module's output."""


@dataclasses.dataclass(frozen=True)
class CheckPair:
    input: Path
    output: Path
    mask: Path | None = None


def from_args(args: argparse.Namespace) -> CheckPair | None:
    """The pair given by --check-input/--check-output/--check-mask, or None."""
    if args.check_input is None:
        return None
    return CheckPair(args.check_input, args.check_output, getattr(args, "check_mask", None))


def _load(path: Path, dtype: type) -> np.ndarray:
    array = np.load(path, allow_pickle=False)
    if not isinstance(array, np.ndarray) or array.dtype.kind not in ("f" if dtype is np.float32 else "b"):
        raise ValueError(f"{path}: expected a .npy of {np.dtype(dtype).name}, got {getattr(array, 'dtype', array)}")
    return array.astype(dtype)


def check_encoder(session: ort.InferenceSession, pair: CheckPair, tolerance: float) -> dict[str, Any]:
    """The exported encoder on the pair's input (and mask), against its output at unpadded positions."""
    x, y = _load(pair.input, np.float32), _load(pair.output, np.float32)
    d_model = session.get_inputs()[0].shape[2]
    if x.ndim != 3 or x.shape[2] != d_model or y.shape != x.shape:
        raise ValueError(
            f"{pair.input} and {pair.output}: expected two (batch, seq, {d_model}) arrays, batch first, "
            f"got {list(x.shape)} and {list(y.shape)}"
        )
    mask = np.zeros(x.shape[:2], dtype=bool) if pair.mask is None else _load(pair.mask, np.bool_)
    if mask.shape != x.shape[:2]:
        raise ValueError(f"{pair.mask}: expected a (batch, seq) mask {list(x.shape[:2])}, got {list(mask.shape)}")
    got = session.run(["output"], {"input": x, "padding_mask": mask})[0]
    keep = np.broadcast_to(~mask[..., None], x.shape)  # torch's fast path answers 0 at padded positions
    return _compare(got, y, keep, pair, tolerance)


def check_layernorm(
    session: ort.InferenceSession, module: torch.nn.LayerNorm, pair: CheckPair, tolerance: float
) -> dict[str, Any]:
    """The exported LayerNorm, fed its gamma, beta and eps as the server feeds them, against the pair's output."""
    x, y = _load(pair.input, np.float32), _load(pair.output, np.float32)
    shape = tuple(module.normalized_shape)
    if tuple(x.shape[-len(shape) :]) != shape or x.ndim <= len(shape) or y.shape != x.shape:
        raise ValueError(
            f"{pair.input} and {pair.output}: expected two arrays of one shape ending in {list(shape)}, "
            f"got {list(x.shape)} and {list(y.shape)}"
        )
    weight, bias = module.weight, module.bias
    gamma = None if weight is None else weight.detach().numpy()
    beta = None if bias is None else bias.detach().numpy()
    case = LayerNormCase("check", x, len(shape), float(module.eps), "var", gamma, beta)
    got = session.run(["output"], layernorm_feeds(case))[0].reshape(x.shape)
    return _compare(got, y, np.ones(x.shape, dtype=bool), pair, tolerance)


def _compare(got: np.ndarray, y: np.ndarray, keep: np.ndarray, pair: CheckPair, tolerance: float) -> dict[str, Any]:
    diff = np.where(keep, np.abs(got.astype(np.float64) - y), 0.0)
    worst = float(np.nanmax(diff)) if not np.isnan(diff).any() else float("nan")
    where = [int(i) for i in np.unravel_index(int(np.argmax(np.nan_to_num(diff, nan=np.inf))), diff.shape)]
    if not worst <= tolerance:  # NaN fails too
        raise CheckFailed(
            f"check failed: the exported model's output differs from {pair.output} by {worst:.3e} at index {where} "
            f"(tolerance {tolerance:.0e}); nothing written"
        )
    files = {"input": pair.input, "output": pair.output} | ({} if pair.mask is None else {"mask": pair.mask})
    return {
        "max_abs_diff": worst,
        "tolerance": tolerance,
        "shape": list(y.shape),
        "sha256": {role: sha256(Path(path)) for role, path in files.items()},
    }
