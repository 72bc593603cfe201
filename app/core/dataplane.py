"""The data plane: normalize and encode, shared by every protocol, plus the parity warm-up.

Protocol layers (app/api/) turn requests into these dataclasses and results back
into their wire format; the math lives here and in app/reference.py only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core import reference
from app.core.conditioning import condition_rows, refine_rows
from app.core.runtime import Model, ModelLoadError, Runtime
from app.core.tensors import FLOAT32_MAX
from app.errors import InvalidInput

FLOAT32_ULP = 2.0**-23
CHUNK_ELEMENTS = 1 << 18  # rows of a larger input run in chunks of about this many elements (1 MiB)
NORMALIZE_ATOL = 1e-5  # times max(1, |gamma|): the fidelity promise of spec section 1


@dataclass(frozen=True)
class NormalizeInput:
    x: np.ndarray  # any shape, float32
    k: int  # normalize over the last k dims
    eps: float = 1e-5
    eps_mode: str = "var"
    gamma: np.ndarray | None = None  # x.shape[-k:], float32
    beta: np.ndarray | None = None  # x.shape[-k:], float32
    backend: str = "onnxruntime"
    validate: bool = False


@dataclass(frozen=True)
class NormalizeOutput:
    output: np.ndarray  # x.shape; float32 from onnxruntime, float64 from numpy
    mean: np.ndarray  # x.shape[:-k], float64
    var: np.ndarray  # x.shape[:-k], float64
    backend: str
    model: Model | None
    validation: dict[str, Any] | None


@dataclass(frozen=True)
class EncodeInput:
    x: np.ndarray  # B,T,C float32
    padding_mask: np.ndarray | None  # B,T bool, true = padding
    model: str = "encoder"
    validate: bool = False


@dataclass(frozen=True)
class EncodeOutput:
    output: np.ndarray  # B,T,C float32
    layer_norms: list[tuple[str, np.ndarray, np.ndarray]]  # (name, mean B,T, std B,T)
    model: Model
    validation: dict[str, Any] | None


def normalize(runtime: Runtime, req: NormalizeInput) -> NormalizeOutput:
    """Layer norm over the last k dims by the chosen backend, optionally checked against the other."""
    model = runtime.get("layernorm") if req.backend == "onnxruntime" or req.validate else None
    ort_out = _normalize_onnx(model, req) if model is not None else None
    ref = _normalize_numpy(req) if req.backend == "numpy" or req.validate else None
    if req.backend == "onnxruntime":
        assert ort_out is not None
        output, mean, var = ort_out
    else:
        assert ref is not None
        output, mean, var = ref.output, ref.mean, ref.var
    _check_finite(output, "output")
    validation = None
    if req.validate:
        assert ort_out is not None and ref is not None
        gamma_max = 1.0 if req.gamma is None else max(1.0, float(np.abs(req.gamma).max()))
        # float32 cannot hold the output closer than its own rounding: add half an ulp of the largest value.
        atol = NORMALIZE_ATOL * gamma_max + FLOAT32_ULP * float(np.abs(ref.output).max())
        diff = float(np.abs(ort_out[0] - ref.output).max())
        other = "numpy" if req.backend == "onnxruntime" else "onnxruntime"
        validation = {"reference": other, "max_abs_diff": diff, "atol": atol, "passed": diff <= atol}
    return NormalizeOutput(output, mean, var, req.backend, model if req.backend == "onnxruntime" else None, validation)


def _normalize_onnx(model: Model, req: NormalizeInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    shape = req.x.shape
    D = math.prod(shape[-req.k :])
    x2 = np.ascontiguousarray(req.x, dtype=np.float32).reshape(-1, D)  # R,D view: any rank, any k
    gamma = np.ones(D, np.float32) if req.gamma is None else req.gamma.reshape(D).astype(np.float32)
    beta = np.zeros(D, np.float32) if req.beta is None else req.beta.reshape(D).astype(np.float32)
    step = max(1, CHUNK_ELEMENTS // D)  # rows per run
    batch_shape = shape[: len(shape) - req.k]
    if len(x2) <= step:
        out, mean, var = _normalize_rows(model, x2, req, gamma, beta)
        return out.reshape(shape), mean.reshape(batch_shape), var.reshape(batch_shape)
    # Rows are independent: a large input runs in row chunks, so the conditioned copy and the graph's
    # intermediates (4 tensors the size of the input) exist for one chunk at a time (peak RSS, measured).
    out, mean, var = np.empty(x2.shape, np.float32), np.empty(len(x2)), np.empty(len(x2))  # R,D  R  R
    for i in range(0, len(x2), step):
        part = slice(i, i + step)
        out[part], mean[part], var[part] = _normalize_rows(model, x2[part], req, gamma, beta)
    return out.reshape(shape), mean.reshape(batch_shape), var.reshape(batch_shape)


def _normalize_rows(
    model: Model, x2: np.ndarray, req: NormalizeInput, gamma: np.ndarray, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One run of the graph on (R, D) rows: output R,D float32, mean and var R float64."""
    rows = condition_rows(x2, req.eps, req.eps_mode)
    feeds = {"input": rows.x, "gamma": gamma, "beta": beta, "eps_var": rows.eps_var, "eps_std": rows.eps_std}
    with np.errstate(over="ignore"):
        out, kernel_mean, kernel_inv_std = model.run(feeds, ["output", "mean", "inv_std_dev"])
        refine_rows(rows, out, kernel_mean, kernel_inv_std, gamma, beta)
    return out, rows.mean, rows.var


def _normalize_numpy(req: NormalizeInput) -> reference.LayerNormResult:
    return reference.layer_norm(req.x, req.k, req.eps, req.eps_mode, req.gamma, req.beta)


def encode(runtime: Runtime, req: EncodeInput) -> EncodeOutput:
    """Run an exported encoder; LayerNorm input statistics come out of the graph itself."""
    model = runtime.get(req.model)
    if model.kind != "encoder" or model.config is None:
        raise InvalidInput(f"{req.model!r} is not an encoder", "model")
    cfg = model.config
    B, T, C = req.x.shape
    if C != cfg.d_model:
        raise InvalidInput(f"last dimension is {C}, expected d_model = {cfg.d_model}", "data")
    if T > cfg.max_sequence_length:
        raise InvalidInput(
            f"sequence length {T} exceeds max_sequence_length {cfg.max_sequence_length}"
            " (set at export: normserve export --max-sequence-length)",
            "data",
        )
    mask = np.zeros((B, T), dtype=bool) if req.padding_mask is None else req.padding_mask
    if mask.shape != (B, T):
        raise InvalidInput(f"shape {list(mask.shape)} does not match data's [batch, seq] = {[B, T]}", "padding_mask")
    names = ["output"] + [f"{n}.{s}" for n in model.layer_norms for s in ("mean", "std")]
    x = np.require(req.x, np.float32, ["C", "A"])  # contiguous and aligned: V2 binary inputs are views of the body
    with np.errstate(over="ignore"):
        if model.batcher is not None:  # dynamic batching: the same run, merged with concurrent requests
            outs = model.batcher.run(x, mask, names)
        else:
            outs = model.run({"input": x, "padding_mask": mask}, names)
    _check_finite(outs[0], "output")
    stats = [(n, outs[1 + 2 * i], outs[2 + 2 * i]) for i, n in enumerate(model.layer_norms)]
    validation = None
    if req.validate:
        assert model.weights is not None
        ref, _ = reference.encoder(req.x, model.weights, cfg, mask)
        diff = float(np.abs(outs[0] - ref).max())
        atol = runtime.settings.validate_atol
        validation = {"reference": "numpy", "max_abs_diff": diff, "atol": atol, "passed": diff <= atol}
    return EncodeOutput(outs[0], stats, model, validation)


def _check_finite(arr: np.ndarray, field: str) -> None:
    # NaN propagates through min and max and fails both comparisons, so this also rejects NaN; no temporary
    # the size of the output (np.abs would double a 64 MiB request's peak memory for a moment).
    if not (-FLOAT32_MAX <= float(arr.min()) and float(arr.max()) <= FLOAT32_MAX):
        raise InvalidInput("the result is not finite in float32 (it overflows); scale the input or gamma down", field)


def warm_up(runtime: Runtime) -> dict[str, float]:
    """Run every model on fixed inputs against the NumPy reference; ModelLoadError on a mismatch."""
    rng = np.random.default_rng(20261121)
    figures: dict[str, float] = {}
    for name, model in runtime.models.items():
        if model.kind == "layernorm":
            x = (rng.standard_normal((3, 5, 16)) * 4 + 100).astype(np.float32)
            g = (1 + 0.1 * rng.standard_normal((5, 16))).astype(np.float32)
            diffs = []
            for mode in ("var", "std"):
                out = normalize(runtime, NormalizeInput(x, 2, 1e-5, mode, g, -g, validate=True))
                assert out.validation is not None
                diffs.append(out.validation["max_abs_diff"])
            diff, atol = max(diffs), NORMALIZE_ATOL * 2
        else:
            assert model.config is not None
            x = rng.standard_normal((2, 7, model.config.d_model)).astype(np.float32)
            mask = np.zeros((2, 7), dtype=bool)
            mask[1, 4:] = True
            enc = encode(runtime, EncodeInput(x, mask, name, validate=True))
            assert enc.validation is not None
            diff, atol = enc.validation["max_abs_diff"], runtime.settings.validate_atol
        if not diff <= atol:
            raise ModelLoadError(f"{model.path}: parity warm-up failed, max abs diff {diff:.3g} > {atol:.3g}")
        figures[name] = diff
    return figures
