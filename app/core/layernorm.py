"""The layernorm kind: one graph for any rank, eps, eps_mode, gamma and beta, conditioned to stay float64-faithful.

The graph normalizes (rows, cols) float32 with gamma and beta as inputs and eps per row
(eps_var, eps_std); any N-D input is a (rows, cols) view of itself, so one graph serves
every normalized_shape. app/core/conditioning.py makes the float32 kernel faithful to the
float64 math (spec section 1); the statistics are its float64 sums.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from app.core import reference
from app.core.conditioning import condition_rows, correct_rows, moments, refine_rows
from app.core.dataplane import Fields, NormalizeInput, NormalizeOutput
from app.core.halfprecision import HALF_DTYPES, narrow, narrow_exact, overflow_bound, uncertain
from app.core.kernels import FusedKernel, check_kernel, run_kernel
from app.core.model import (
    FLOAT,
    Loaded,
    Model,
    ModelLoadError,
    Signature,
    TensorSpec,
    positive_float,
    read_weights,
)
from app.core.repository import MANIFEST, WEIGHTS_FILE
from app.core.tensors import check_finite
from app.errors import InvalidInput, shown

FLOAT32_ULP = 2.0**-23
CHUNK_ELEMENTS = 1 << 18  # rows of a larger input run in chunks of about this many elements (1 MiB)
NORMALIZE_ATOL = 1e-5  # times max(1, |gamma|): the fidelity promise of spec section 1
WARM_UP_ATOL = 2 * NORMALIZE_ATOL  # the warm-up's gamma stays within 2
DEFAULT_EPS = 1e-5  # torch.nn.LayerNorm's
STATE = ("gamma", "beta")  # a learned LayerNorm's weights.npz
UNIT_COLS = 4096  # rows up to this long share one read-only gamma of ones and beta of zeros per length

INPUTS: Signature = [
    ("input", ["rows", "cols"]),
    ("gamma", ["cols"]),
    ("beta", ["cols"]),
    ("eps_var", ["rows", 1]),
    ("eps_std", ["rows", 1]),
]
OUTPUTS: Signature = [("output", ["rows", "cols"]), ("mean", ["rows", 1]), ("inv_std_dev", ["rows", 1])]
GRAPH_OUTPUTS = [name for name, _ in OUTPUTS]  # the exported graph's, in order (kernels.py has its own)


class LayerNormModel(Model):
    """V2: `input` [rows, cols] (any rank >= 1 is taken: Triton has no notation for it), optional `gamma` and
    `beta` of input.shape[-k:]; outputs `output`, `mean` and `inv_std_dev` (input.shape[:-k]), with k the
    request parameter normalized_ndim.

    A learned LayerNorm (an exported torch.nn.LayerNorm) has a normalized_shape, gamma, beta and eps of its
    own (config and weights.npz): its input ends in normalized_shape, and a request may pass its own gamma,
    beta and eps instead."""

    kind = "layernorm"
    parameters = ("eps", "eps_mode", "normalized_ndim")
    numbers = MappingProxyType({"eps": float, "normalized_ndim": int})

    def __init__(self, loaded: Loaded) -> None:
        super().__init__(loaded)
        where = loaded.path.parent / MANIFEST
        config = loaded.entry.get("config") or {}
        shape = config.get("normalized_shape", []) if isinstance(config, dict) else None
        if not isinstance(shape, list) or not all(type(d) is int and d >= 1 for d in shape):
            message = f"config.normalized_shape {shown(shape)}; expected a list of positive integers"
            raise ModelLoadError(f"{where}: {message}")
        self.normalized_shape: tuple[int, ...] = tuple(shape)
        self.eps = positive_float(config, "eps", where, DEFAULT_EPS)
        self.graph = (INPUTS, OUTPUTS)
        self.gamma: np.ndarray | None = None
        self.beta: np.ndarray | None = None
        if self.normalized_shape:
            weights = read_weights(loaded)
            if any(weights.get(k, np.empty(0)).size != math.prod(shape) for k in STATE):
                found = {k: list(v.shape) for k, v in weights.items()}
                raise ModelLoadError(
                    f"{loaded.path.parent / WEIGHTS_FILE}: expected gamma and beta of {shape} elements, got {found}"
                )
            self.gamma, self.beta = (weights[k].astype(np.float32).reshape(self.normalized_shape) for k in STATE)
        self.kernel = FusedKernel(loaded.session.get_session_options())  # the same threads as the model's session
        self.kernel.session(self.eps)  # built at load, not by the first request
        trailing = self.normalized_shape or (-1,)
        batch = (-1,)
        self.inputs = (
            TensorSpec("input", FLOAT, batch + trailing),
            TensorSpec("gamma", FLOAT, trailing, optional=True),
            TensorSpec("beta", FLOAT, trailing, optional=True),
        )
        self.outputs = (
            TensorSpec("output", FLOAT, batch + trailing),
            TensorSpec("mean", FLOAT, batch, statistic=True),
            TensorSpec("inv_std_dev", FLOAT, batch, statistic=True),
        )

    def request(
        self,
        x: np.ndarray,
        k: int | None = None,
        eps: float | None = None,
        eps_mode: str = "var",
        gamma: np.ndarray | None = None,
        beta: np.ndarray | None = None,
        backend: Literal["onnxruntime", "numpy"] = "onnxruntime",
        validate: bool = False,
        fields: Fields = Fields(),  # noqa: B008 - frozen dataclass
        dtype: str = "FP32",
        sent: np.ndarray | None = None,
    ) -> NormalizeInput:
        """The data plane's input with this model's defaults: its normalized_shape, gamma, beta and eps."""
        learned = self.normalized_shape
        if learned:
            x = np.asarray(x)
            if tuple(x.shape[-len(learned) :]) != learned or x.ndim < len(learned) or k not in (None, len(learned)):
                raise InvalidInput(
                    f"model {self.name!r} normalizes trailing dims {list(learned)}; got shape {list(x.shape)}"
                    + ("" if k is None else f" with {k} normalized dims"),
                    fields.x,
                )
            gamma = self.gamma if gamma is None else gamma
            beta = self.beta if beta is None else beta
        k = (len(learned) or 1) if k is None else k
        eps = self.eps if eps is None else eps
        return NormalizeInput(x, k, eps, eps_mode, gamma, beta, backend, validate, fields, dtype, sent)

    def from_tensors(
        self, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any], f: Fields, dtype: str = "FP32"
    ) -> NormalizeInput:
        gamma, beta = tensors.get("gamma"), tensors.get("beta")
        k, eps, mode = params.get("normalized_ndim"), params.get("eps"), params.get("eps_mode", "var")
        return self.request(tensors["input"], k, eps, mode, gamma, beta, fields=f, dtype=dtype)

    def to_tensors(self, result: NormalizeOutput) -> dict[str, np.ndarray]:
        # inv_std_dev from the float64 variance, so FP64 clients get every digit it has.
        return {"output": result.output, "mean": result.mean, "inv_std_dev": result.inv_std_dev}

    def infer(self, request: NormalizeInput) -> NormalizeOutput:
        """Layer norm by the chosen backend, optionally checked against the other."""
        return normalize(self, request)

    def warm_up(self) -> tuple[float, float]:
        rng = np.random.default_rng(20261121)
        if self.normalized_shape:  # its own gamma, beta and eps: the tolerance scales with its gamma
            x = (rng.standard_normal((3, *self.normalized_shape)) * 4 + 100).astype(np.float32)
            out = normalize(self, self.request(x, validate=True))
            assert out.validation is not None
            return out.validation["max_abs_diff"], out.validation["atol"]
        x = (rng.standard_normal((3, 5, 16)) * 4 + 100).astype(np.float32)
        g = (1 + 0.1 * rng.standard_normal((5, 16))).astype(np.float32)
        diffs = []
        for mode in ("var", "std"):
            out = normalize(self, NormalizeInput(x, 2, 1e-5, mode, g, -g, validate=True))
            assert out.validation is not None
            diffs.append(out.validation["max_abs_diff"])
        return max(diffs), WARM_UP_ATOL

    def normalize_rows(self, x2: np.ndarray, req: NormalizeInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The graph on (R, D) float32 rows, in chunks: output R,D float32, mean and var R float64."""
        D = x2.shape[1]
        ones, zeros = _unit_affine(D) if D <= UNIT_COLS else (np.ones(D, np.float32), np.zeros(D, np.float32))
        gamma = ones if req.gamma is None else req.gamma.reshape(D)
        beta = zeros if req.beta is None else req.beta.reshape(D)
        step = max(1, CHUNK_ELEMENTS // D)  # rows per run
        if len(x2) <= step:
            return self._run_rows(x2, req, gamma, beta)
        # Rows are independent: a large input runs in row chunks, so the conditioned copy and the graph's
        # intermediates (4 tensors the size of the input) exist for one chunk at a time (peak RSS, measured).
        out, mean, var = np.empty(x2.shape, np.float32), np.empty(len(x2)), np.empty(len(x2))  # R,D  R  R
        for i in range(0, len(x2), step):
            part = slice(i, i + step)
            out[part], mean[part], var[part] = self._run_rows(x2[part], req, gamma, beta)
        return out, mean, var

    def _run_rows(
        self, x2: np.ndarray, req: NormalizeInput, gamma: np.ndarray, beta: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fused kernel on the raw rows; the conditioned graph redoes the rows it got wrong (kernels.py)."""
        kernel = self.kernel.session(req.eps) if req.eps_mode == "var" else None
        if kernel is None:  # mode std and eps beyond float32's normal range: every row on the exact path
            return self.exact_rows(x2, req, gamma, beta)
        mean, var = moments(x2)  # R, R: the statistics every backend reports
        start = time.perf_counter()
        outputs = run_kernel(kernel, {"input": x2, "gamma": gamma, "beta": beta})
        self._observe(self.name, self.version, time.perf_counter() - start, len(x2), self.warming)
        g_max = 1.0 if req.gamma is None else float(np.abs(gamma).max())
        b_max = 0.0 if req.beta is None else float(np.abs(beta).max())
        check = check_kernel(mean, var, req.eps, outputs, g_max, b_max)
        out = outputs[0]
        correct_rows(out, check.refine, check.ratio, check.shift, gamma, beta)
        if check.exact.size:
            out[check.exact] = self.exact_rows(x2[check.exact], req, gamma, beta)[0]
        return out, mean, var

    def exact_rows(
        self, x2: np.ndarray, req: NormalizeInput, gamma: np.ndarray, beta: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The model's graph on conditioned rows, refined: faithful for any eps, eps_mode and finite row."""
        rows = condition_rows(x2, req.eps, req.eps_mode)
        feeds = {"input": rows.x, "gamma": gamma, "beta": beta, "eps_var": rows.eps_var, "eps_std": rows.eps_std}
        with np.errstate(over="ignore"):
            out, kernel_mean, kernel_inv_std = self.run(feeds, GRAPH_OUTPUTS)
            refine_rows(rows, out, kernel_mean, kernel_inv_std, gamma, beta)
        return out, rows.mean, rows.var


@functools.lru_cache(maxsize=64)
def _unit_affine(cols: int) -> tuple[np.ndarray, np.ndarray]:
    """gamma 1 and beta 0 of a row's length, read-only: built once, not per request (two NumPy calls, 3 us)."""
    ones, zeros = np.ones(cols, np.float32), np.zeros(cols, np.float32)
    ones.flags.writeable = zeros.flags.writeable = False
    return ones, zeros


def normalize(model: LayerNormModel, req: NormalizeInput) -> NormalizeOutput:
    """onnxruntime or the NumPy reference computes the output; `validate` runs the other and compares."""
    onnx = _normalize_onnx(model, req) if req.backend == "onnxruntime" or req.validate else None
    ref = _normalize_numpy(req) if req.backend == "numpy" or req.validate else None
    chosen = onnx if req.backend == "onnxruntime" else ref
    assert chosen is not None
    output, mean, var = chosen
    top = check_finite(output, "output")
    if req.dtype in HALF_DTYPES:
        output = _narrowed(req, output, mean, var, top)
    validation = None
    if onnx is not None and ref is not None:
        validation = _compare(req, onnx[0], ref[0])
    info = model.info if req.backend == "onnxruntime" else None
    return NormalizeOutput(output, mean, var, req.eps, req.eps_mode, req.backend, info, validation, req.warnings)


def _narrowed(req: NormalizeInput, output: np.ndarray, mean: np.ndarray, var: np.ndarray, top: float) -> np.ndarray:
    """The output rounded once to the request's half type, every element within one unit in its last place.

    onnxruntime's float32 answer is within NORMALIZE_ATOL (times |gamma|) of the float64 math: its rounding is
    faithful except for elements so small that their half spacing is not twice that (halfprecision.uncertain),
    which are computed in float64 from the float64 statistics (about 3% of the elements in FP16, 0.3% in BF16).
    top: the largest |output| (check_finite's)."""
    if output.dtype == np.float64:  # the NumPy backend: the float64 math itself
        return narrow(output, req.dtype, "output")
    # The promise may be exceeded by 1.5 * 2**-23 * max|out| in the analytic worst case (docs/fidelity.md: every
    # rounding the same way, on a row of over 2,500 values with an extreme outlier); the rounding must hold there too.
    err = _float32_bound(req, top) + 1.5 * FLOAT32_ULP * top
    # Within the range, round without narrow's own pass over the output for it; beyond, narrow refuses it.
    half = narrow_exact(output, req.dtype) if top < overflow_bound(req.dtype) else narrow(output, req.dtype, "output")
    idx = uncertain(output, err, req.dtype)
    if idx.size:
        rows = idx // req.cols  # into the (R, D) view
        den = reference.denominator(var.reshape(-1), req.eps, req.eps_mode)  # R: per row
        y = (req.x.reshape(-1)[idx].astype(np.float64) - mean.reshape(-1)[rows]) / den[rows]
        if req.gamma is not None or req.beta is not None:
            cols = idx - rows * req.cols  # cheaper than np.divmod's remainder
            if req.gamma is not None:
                y *= req.gamma.reshape(-1)[cols]
            if req.beta is not None:
                y += req.beta.reshape(-1)[cols]
        half.reshape(-1)[idx] = narrow(y, req.dtype, "output")
    return half


def _normalize_onnx(model: LayerNormModel, req: NormalizeInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x2 = np.ascontiguousarray(req.x).reshape(-1, req.cols)  # R,D view: any rank, any k
    out, mean, var = model.normalize_rows(x2, req)
    return out.reshape(req.x.shape), mean.reshape(req.batch_shape), var.reshape(req.batch_shape)


def _normalize_numpy(req: NormalizeInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = reference.layer_norm(req.x, req.k, req.eps, req.eps_mode, req.gamma, req.beta)
    return r.output, r.mean, r.var


def _float32_bound(req: NormalizeInput, top: float) -> float:
    """How far the float32 path's output may be from the float64 math: NORMALIZE_ATOL (times |gamma|), and
    float32 cannot hold the output closer than its own rounding: 2**-23 of the largest value (1-2 ulps)."""
    gamma_max = 1.0 if req.gamma is None else max(1.0, float(np.abs(req.gamma).max()))
    return NORMALIZE_ATOL * gamma_max + FLOAT32_ULP * top


def _compare(req: NormalizeInput, got: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    atol = _float32_bound(req, float(np.abs(ref).max()))
    diff = float(np.abs(got - ref).max())
    other = "numpy" if req.backend == "onnxruntime" else "onnxruntime"
    return {"reference": other, "max_abs_diff": diff, "atol": atol, "passed": diff <= atol}
