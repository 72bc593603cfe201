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
                self.sessions = {**self.sessions, key: session}  # replaced whole: readers need no lock
            return self.sessions[key]


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
