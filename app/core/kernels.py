"""The fast path of /normalize: onnxruntime's fused LayerNormalization on the raw rows, and which rows it may keep.

The fused op takes eps as an attribute, so each float32 eps gets its own session, built from the committed
graph app/core/layernorm_kernel.onnx (scripts/make_kernel.py) by replacing the four bytes of its template
epsilon: the serving install has no `onnx` to build a graph with. The kernel reports the mean and
1 / denominator it used; `check_kernel` compares them with the float64 statistics, which the response
reports anyway, and sends the rows where they stray by more than GATE to the exact (conditioned) path.
docs/fidelity.md has the argument.
"""

from __future__ import annotations

import math
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.core.conditioning import REFINE_TOL

KERNEL_FILE = Path(__file__).with_name("layernorm_kernel.onnx")
KERNEL_INPUTS = ("input", "gamma", "beta")
KERNEL_OUTPUTS = ("output", "mean", "inv_std_dev", "out_max", "out_min")
OPSET = 18  # LayerNormalization is opset 17; ReduceMax and ReduceMin take axes as an input from 18
TEMPLATE_EPS = 1e-5  # the graph's epsilon attribute, as committed: its float32 bytes occur once in the file
# Sessions per model, one per float32 eps (the model's default, then requests' own), each a few KiB.
# Building one takes 4-7 ms (measured), so there is no eviction to thrash: a further eps takes the exact path.
MAX_SESSIONS = 8
# The kernel keeps a row whose mean and denominator are within this fraction of the denominator of the
# float64 ones (refine_rows then corrects the rest exactly): its elementwise float32 roundings are then
# those of the conditioned path. Rows of plain data stray by 1e-7 (measured: 3e-7 at most over 2,000 normal
# rows of 4,096, 4e-6 at offset 100 std); cancellation, overflow and underflow stray far more, or to nan.
GATE = 2.0**-12
_MIN_EXP, _MAX_EPS_EXP = -126, 64  # the kernel's eps must be a normal float32 (as condition_rows's unscaled rows)
_NONE = np.zeros(0, np.intp)  # no row
FEW_ROWS = 16  # up to this many rows, check_kernel runs on Python floats (_check_few)
_OUTPUT_NAMES = list(KERNEL_OUTPUTS)


def _eps_bytes(eps: float) -> bytes:
    return struct.pack("<f", eps)


class FusedKernel:
    """The fused LayerNormalization graph as one session per float32 eps, built on first use."""

    def __init__(self, options: ort.SessionOptions, template: bytes | None = None) -> None:
        self.template = KERNEL_FILE.read_bytes() if template is None else template
        count = self.template.count(_eps_bytes(TEMPLATE_EPS))
        assert count == 1, f"{KERNEL_FILE}: the template epsilon occurs {count} times, expected once"
        self.options = options
        self.sessions: dict[bytes, ort.InferenceSession] = {}
        self.lock = threading.Lock()  # one build at a time; runs read the dict without it

    def session(self, eps: float) -> ort.InferenceSession | None:
        """The session whose epsilon is float32(eps); None where that is not a normal float32 below 2**64, or
        where MAX_SESSIONS other eps have one."""
        if not _MIN_EXP < math.frexp(eps)[1] < _MAX_EPS_EXP:
            return None
        key = _eps_bytes(eps)
        found = self.sessions.get(key)
        if found is not None:
            return found
        with self.lock:
            if key not in self.sessions:
                if len(self.sessions) >= MAX_SESSIONS:
                    return None
                graph = self.template.replace(_eps_bytes(TEMPLATE_EPS), key)
                session = ort.InferenceSession(graph, self.options, providers=["CPUExecutionProvider"])
                assert [o.name for o in session.get_outputs()] == _OUTPUT_NAMES, f"{KERNEL_FILE}: outputs changed"
                self.sessions = {**self.sessions, key: session}  # replaced whole: readers need no lock
            return self.sessions[key]


def run_kernel(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The kernel's outputs, in KERNEL_OUTPUTS order, for feeds of exactly KERNEL_INPUTS.

    Through InferenceSession.run, onnxruntime's public API: its checks of the feeds' names cost 3.3 us of a
    14.8 us run on (8, 64) rows against the binding it wraps (process time, best of 5 x 20,000 on one core),
    under 1% of a small /normalize's 0.39 ms of server CPU; the private binding is not worth an upgrade's risk."""
    return session.run(_OUTPUT_NAMES, feeds)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class KernelCheck:
    """The kernel's rows against the float64 statistics: which to redo, which to correct, and by how much."""

    exact: np.ndarray  # indices of rows the kernel got wrong: the conditioned path redoes them
    refine: np.ndarray  # indices of rows refine's formula corrects
    ratio: np.ndarray  # R: the kernel's denominator over the float64 one
    shift: np.ndarray  # R: (kernel mean - float64 mean) / float64 denominator, in units of y


def check_kernel(
    mean: np.ndarray, var: np.ndarray, eps: float, outputs: list[np.ndarray], g_max: float, b_max: float
) -> KernelCheck:
    """Judge each row of the kernel's outputs [output, mean, inv_std_dev, out_max, out_min] (mode var).

    A row is off by at most (max|out| + max|beta|) |ratio - 1| + max|gamma| |shift| before refinement
    (|gamma * y| <= |out| + |beta|); refine_rows's REFINE_TOL decides which rows to correct.
    """
    if len(mean) <= FEW_ROWS:
        few = _check_few(mean, var, eps, outputs, g_max, b_max)
        if few is not None:
            return few
    return _check_numpy(mean, var, eps, outputs, g_max, b_max)


def _check_numpy(
    mean: np.ndarray, var: np.ndarray, eps: float, outputs: list[np.ndarray], g_max: float, b_max: float
) -> KernelCheck:
    _, kernel_mean, kernel_inv, out_max, out_min = outputs
    den = np.sqrt(var + eps)  # R, float64, > 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ratio = 1.0 / (kernel_inv[:, 0] * den)  # R: nan or inf where the kernel overflowed
        shift = (kernel_mean[:, 0] - mean) / den  # R
        off, drift = np.abs(ratio - 1.0), np.abs(shift)  # R, R
        moved = (np.maximum(out_max[:, 0], -out_min[:, 0]) + b_max) * off + g_max * drift  # R
    stray = np.maximum(off, drift)  # R; nan where either is
    refine = moved > REFINE_TOL * max(1.0, g_max)  # R
    # The common case in fewer NumPy calls: each costs about 1 us on small inputs, where they add up (measured).
    if np.maximum.reduce(stray) <= GATE:
        return KernelCheck(_NONE, refine.nonzero()[0], ratio, shift)
    kept = stray <= GATE  # R: False for nan
    return KernelCheck((~kept).nonzero()[0], (kept & refine).nonzero()[0], ratio, shift)


def _check_few(
    mean: np.ndarray, var: np.ndarray, eps: float, outputs: list[np.ndarray], g_max: float, b_max: float
) -> KernelCheck | None:
    """_check_numpy's arithmetic on Python floats, row by row: the same IEEE float64 operations in the same order
    (a float32 value widens exactly; sqrt and the four operations round correctly in both), so the same verdict
    and the same ratio and shift. None where a row strays past GATE or is not finite: _check_numpy decides those.

    For a few rows its twenty NumPy calls cost more than their work: 12 us for 8 rows, this 7 (measured)."""
    kernel_mean, kernel_inv, out_max, out_min = (a.ravel().tolist() for a in outputs[1:])  # R each
    tol = REFINE_TOL * max(1.0, g_max)
    beta32 = _float32(b_max)  # NumPy adds b_max to a float32 array as a float32
    if beta32 is None:
        return None
    ratios, shifts, refine = [], [], []
    for i, (m, v, km, ki, hi, lo) in enumerate(
        zip(mean.tolist(), var.tolist(), kernel_mean, kernel_inv, out_max, out_min, strict=True)
    ):
        den = math.sqrt(v + eps)
        product = ki * den
        if not (0.0 < product < math.inf and math.isfinite(hi) and math.isfinite(lo)):
            return None  # a zero, inf or nan the vectorized check turns into inf or nan
        ratio, shift = 1.0 / product, (km - m) / den
        off, drift = abs(ratio - 1.0), abs(shift)
        if not (off <= GATE and drift <= GATE):  # False for nan
            return None
        top = hi if hi >= -lo else -lo  # float32 values: np.maximum of them, exact
        if beta32:  # a float32 sum, rounded once (rounding the exact float64 sum again to float32 is innocuous)
            top = _float32(top + beta32)
            if top is None:
                return None
        if top * off + g_max * drift > tol:
            refine.append(i)
        ratios.append(ratio)
        shifts.append(shift)
    return KernelCheck(_NONE, np.array(refine, np.intp), np.array(ratios), np.array(shifts))


def _float32(value: float) -> float | None:
    """value rounded to the nearest float32, or None past float32's range (NumPy's inf)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]  # type: ignore[no-any-return]
    except OverflowError:
        return None
