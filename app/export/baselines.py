"""The drift monitor's baseline in the manifest: each LayerNorm's per-position input mean and std at export.

Measured on the parity inputs, or on `--calibration FILE.npy` (inputs like the traffic the model will see),
with the float64 NumPy reference rather than the exported graph: the figures are then the same on every CPU,
and the manifest's bytes with them. Padded positions are left out: they are not traffic. A text encoder's is
measured on the parity texts or `--calibration FILE` (texts, one a line) with the graph as served (an INT8 one
included): the statistics the monitor compares are then the served graph's own, and its manifest's parity figures
depend on the CPU already.

    "baseline": {"inputs": "<what was measured>", "layers": {"<LayerNorm>": {"count", "levels", "mean", "std"}}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.core import monitor
from app.core.reference import EncoderConfig, encoder

LAYERNORM_LAYER = monitor.LAYERNORM_LAYER


def manifest_entry(stats: Mapping[str, tuple[np.ndarray, np.ndarray]], inputs: str) -> dict[str, Any]:
    """The manifest's `baseline` from each LayerNorm's per-position input means and stds (any shapes, paired)."""
    layers = {name: monitor.baseline(means, stds).to_json() for name, (means, stds) in stats.items()}
    return {"inputs": inputs, "layers": layers}


def layernorm_stats(rows: Iterable[np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A layernorm model's per-row input mean and std over 2-D (rows, normalized elements) arrays."""
    x = [np.asarray(r, dtype=np.float64) for r in rows]
    means = np.concatenate([r.mean(axis=1) for r in x])  # R
    stds = np.concatenate([r.std(axis=1) for r in x])  # R, population: what the LayerNorm divides by (before eps)
    return {LAYERNORM_LAYER: (means, stds)}


def encoder_stats(
    cases: Iterable[tuple[np.ndarray, np.ndarray | None]], weights: Mapping[str, np.ndarray], cfg: EncoderConfig
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each LayerNorm's per-token input mean and std over (input (B,T,C), padding mask (B,T) or None) pairs."""
    collected: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for x, mask in cases:
        keep = np.ones(x.shape[:2], dtype=bool) if mask is None else ~mask  # B,T
        _, stats = encoder(x, dict(weights), cfg, mask)
        for name, mean, std in stats:
            means, stds = collected.setdefault(name, ([], []))
            means.append(mean[keep])
            stds.append(std[keep])
    return {name: (np.concatenate(m), np.concatenate(s)) for name, (m, s) in collected.items()}


def text_stats(
    answers: Iterable[tuple[Mapping[str, np.ndarray], np.ndarray]], layer_norms: Sequence[str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A text encoder's per-token LayerNorm input mean and std, from (the graph's outputs, attention mask (B,T))
    pairs: each LayerNorm's `NAME.mean` / `NAME.std` (B,T) at real tokens, in the order of layer_norms."""
    collected: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {name: ([], []) for name in layer_norms}
    for outputs, attention_mask in answers:
        real = np.asarray(attention_mask).astype(bool)  # padding is not traffic
        for name, (means, stds) in collected.items():
            means.append(np.asarray(outputs[f"{name}.mean"], dtype=np.float64)[real])
            stds.append(np.asarray(outputs[f"{name}.std"], dtype=np.float64)[real])
    return {name: (np.concatenate(m), np.concatenate(s)) for name, (m, s) in collected.items()}


def load_calibration(path: Path, shape: str, ndim: int | None, last: tuple[int, ...]) -> np.ndarray:
    """A --calibration .npy of float values: `ndim` dims (any when None) ending in `last`, finite, not empty."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"--calibration {path}: not a readable .npy file ({e})") from e
    if array.dtype.kind not in "fiu":
        raise ValueError(f"--calibration {path}: expected a float array {shape}, got dtype {array.dtype}")
    dims_ok = (ndim is None or array.ndim == ndim) and array.ndim >= len(last)
    if not dims_ok or tuple(array.shape[array.ndim - len(last) :]) != last or array.size == 0:
        raise ValueError(f"--calibration {path}: expected a float array {shape}, got shape {list(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError(f"--calibration {path}: holds NaN or infinite values")
    calibration: np.ndarray = array.astype(np.float32)
    return calibration
