"""Exact per-row conditioning around the float32 LayerNorm kernel.

Plain float32 LayerNorm loses digits when a row's offset dwarfs its spread (the
mean cancels) and overflows when squares exceed float32. Both are avoided with
the invariances of the math, so onnxruntime still computes every output:

- shift: y is unchanged by subtracting any per-row center c from the row;
- scale: dividing a row by a > 0 leaves y unchanged if eps becomes eps / a**2
  (mode "var") or eps / a (mode "std"); powers of two make the division exact.

Rows are scaled first (exact: powers of two), then centered in float32, whose
rounding error is half an ulp of the centered value, as good as a float64 centering
and a third cheaper (measured). The statistics are accumulated in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Exponent bounds keep the scale factor and the rescaled eps finite float32 numbers.
_MIN_EXP = -126
_MAX_EPS_EXP = 64


@dataclass(frozen=True)
class ConditionedRows:
    x: np.ndarray  # R,D float32: rows scaled by 2**-e and centered
    eps_var: np.ndarray  # R,1 float32: eps for mode "var" after scaling, else 0
    eps_std: np.ndarray  # R,1 float32: eps for mode "std" after scaling, else 0
    mean: np.ndarray  # R float64: the rows' mean, of the float32 inputs
    var: np.ndarray  # R float64: the rows' population variance


def condition_rows(x: np.ndarray, eps: float, eps_mode: str) -> ConditionedRows:
    """Center and power-of-two scale each row of a (R, D) float32 array; eps follows the scale."""
    R, D = x.shape
    mean = x.mean(axis=1, dtype=np.float64)  # R
    span = np.maximum(x.max(axis=1) - mean, mean - x.min(axis=1))  # R, float64: no overflow
    e = np.frexp(span)[1]  # R: span / 2**e in [0.5, 1)
    # A lower bound on e keeps the rescaled eps below 2**64, and mean * 2**-e inside float32
    # for constant rows (span 0), whose centered values are zero whatever the scale.
    eps_exp = np.frexp(eps)[1]
    floor = (eps_exp - _MAX_EPS_EXP) // 2 if eps_mode == "var" else eps_exp - _MAX_EPS_EXP
    e = np.maximum(e, max(floor, _MIN_EXP))
    e = np.maximum(e, np.frexp(np.abs(mean))[1] - 100)
    scale = np.ldexp(1.0, -e)  # R float64, exact powers of two

    xs = x * scale.astype(np.float32)[:, None]  # R,D exact: a power of two within float32's range
    xs -= (mean * scale).astype(np.float32)[:, None]  # R,D one rounding, of the centered value
    # The float32 center leaves a residual offset r (half an ulp of the mean): var = E[xs^2] - r^2.
    residual = xs.mean(axis=1, dtype=np.float64)  # R
    var = np.maximum(np.einsum("ij,ij->i", xs, xs, dtype=np.float64) / D - residual**2, 0.0) / scale**2  # R

    scaled_eps = (eps * scale**2 if eps_mode == "var" else eps * scale).astype(np.float32)[:, None]  # R,1
    zeros = np.zeros_like(scaled_eps)
    if eps_mode == "var":
        return ConditionedRows(xs, scaled_eps, zeros, mean, var)
    return ConditionedRows(xs, zeros, scaled_eps, mean, var)
