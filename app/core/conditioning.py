"""Exact per-row conditioning and refinement around the float32 LayerNorm kernel.

Plain float32 LayerNorm loses digits when a row's offset dwarfs its spread (the
mean cancels) and overflows when squares exceed float32. Both are avoided with
the invariances of the math, so onnxruntime still computes every output:

- shift: y is unchanged by subtracting any per-row center c from the row;
- scale: dividing a row by a > 0 leaves y unchanged if eps becomes eps / a**2
  (mode "var") or eps / a (mode "std"); powers of two make the division exact.

`condition_rows` centers each row on the float32 nearest its float64 mean, and
scales by a power of two only the rows whose squares would leave float32's normal
range. The kernel's own float32 reductions still err on skewed rows (one outlier
among D values sums D tiny squares into one large one), so `refine_rows` compares
the kernel's mean and denominator, which the graph outputs, with the float64 ones
and rescales the few rows where the difference shows. docs/fidelity.md has the proof.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Kernel rows stay unscaled while their sum of squares is below 2**100 and their variance
# above 2**-100 (or negligible next to eps): every square and sum is then a normal float32.
# Both are judged on the float64 statistics, whose 1e-7 difference from the kernel's own sums is far
# inside these margins.
_SAFE = 2.0**100
_TINY = 2.0**-100
_NEGLIGIBLE = 2.0**-40  # var (mode "var") or std (mode "std") below eps * this cannot move y
# Unscaled rows need eps in [2**-126, 2**64), so that the kernel's eps is a normal float32; scaled
# rows keep 2**-e <= 2**126 and their rescaled eps below 2**64.
_MIN_EXP = -126
_MAX_EPS_EXP = 64
_F32_NORMAL = 2.0**-126  # float32's smallest normal number
# refine_rows corrects a row when the kernel's statistics move its output by more than this
# (times max(1, |gamma|)): a tenth of the 1e-5 fidelity bound, far above float64's own error.
REFINE_TOL = 1e-6


@dataclass(frozen=True)
class ConditionedRows:
    x: np.ndarray  # R,D float32: the kernel's input, rows centered (and scaled by 2**-e where needed)
    eps_var: np.ndarray  # R,1 float32: eps for mode "var" in the kernel's units, else 0
    eps_std: np.ndarray  # R,1 float32: eps for mode "std" in the kernel's units, else 0
    mean: np.ndarray  # R float64: the rows' mean, of the float32 inputs
    var: np.ndarray  # R float64: the rows' population variance
    center: np.ndarray  # R float64: the exact mean of the kernel's rows (the centering residual)
    den: np.ndarray  # R float64: the exact denominator in the kernel's units: sqrt(var + eps_var) + eps_std


def condition_rows(x: np.ndarray, eps: float, eps_mode: str) -> ConditionedRows:
    """Center each row of a (R, D) float32 array; power-of-two scale the rows that need it, eps following."""
    R, D = x.shape
    mean, var = moments(x)  # R, R: the statistics every backend reports
    m32 = mean.astype(np.float32)  # R: nearest float32; |mean - m32| <= half its ulp
    with np.errstate(over="ignore", invalid="ignore"):
        xs = x - m32[:, None]  # R,D: exact where x is near m32 (Sterbenz), else half an ulp of the result
    center = mean - m32  # R: exact in float64, the mean of x - m32
    # The sum of squares of x - m32, from the float64 statistics; the kernel squares xs, which differ from
    # x - m32 by their rounding (1e-7 relative), far inside the factor 2**28 that _SAFE leaves below overflow.
    ss = D * (var + center**2)  # R; a row whose xs overflowed float32 has ss >= 2**256
    scale = np.ones(R)  # R: 2**-e, 1 for the rows the kernel takes as they are
    if _MIN_EXP < np.frexp(eps)[1] < _MAX_EPS_EXP:  # eps is a normal float32 below 2**64
        small = np.sqrt(var) if eps_mode == "std" else var
        safe = (ss <= _SAFE) & ((var >= _TINY) | (small <= eps * _NEGLIGIBLE))  # R; False for inf and nan
        unsafe = np.flatnonzero(~safe)
    else:
        unsafe = np.arange(R)
    if unsafe.size:
        xs[unsafe], scale[unsafe], center[unsafe] = _scaled(x[unsafe], mean[unsafe], eps, eps_mode)
    zeros = np.zeros(R)
    ev, es = (eps * scale**2, zeros) if eps_mode == "var" else (zeros, eps * scale)  # R, R: eps in kernel units
    den = np.sqrt(var * scale**2 + ev) + es  # R
    den[den == 0] = 1.0  # constant rows with eps below float64's range: y is 0 whatever divides it
    # The kernel's eps is at least float32's smallest normal, so that a constant row divides 0 by
    # a positive number; the rows where that raises eps have var >= 2**-26 / D in kernel units, far above.
    ev32, es32 = (np.maximum(ev, _F32_NORMAL), zeros) if eps_mode == "var" else (zeros, np.maximum(es, _F32_NORMAL))
    eps_var, eps_std = ev32.astype(np.float32)[:, None], es32.astype(np.float32)[:, None]  # R,1 each
    return ConditionedRows(xs, eps_var, eps_std, mean, var, center, den)


def moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's float64 mean and population variance, by the very operations of app.core.reference.layer_norm.

    So the statistics that onnxruntime's answers report equal the NumPy backend's, bit for bit. A variance
    summed from the kernel's centered float32 rows is off by about 1e-7 relative (their rounding), and an
    einsum that casts them to float64 as it sums costs more than these four passes. `ndarray.mean` is
    np.add.reduce and a division by the count, which this calls directly: 3 us less per call on small rows.
    """
    D = x.shape[1]
    d = x.astype(np.float64)  # R,D
    mean = np.add.reduce(d, axis=1) / D  # R
    d -= mean[:, None]
    np.square(d, out=d)
    return mean, np.add.reduce(d, axis=1) / D


def _scaled(x: np.ndarray, mean: np.ndarray, eps: float, eps_mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale rows by 2**-e (span / 2**e in [0.5, 1)) and center them, in float64: (xs, 2**-e, center)."""
    span = np.maximum(x.max(axis=1) - mean, mean - x.min(axis=1))  # R, float64: no overflow
    e = np.frexp(span)[1]  # R
    # A lower bound on e keeps the rescaled eps below 2**64: where it binds, eps dominates and y is ~0.
    eps_exp = np.frexp(eps)[1]
    floor = (eps_exp - _MAX_EPS_EXP) // 2 if eps_mode == "var" else eps_exp - _MAX_EPS_EXP
    e = np.maximum(e, max(floor, _MIN_EXP))
    scale = np.ldexp(1.0, -e)  # R float64, exact powers of two
    # x * 2**-e and its mean are exact in float64, their difference nearly so: one rounding, to float32.
    xs = ((x.astype(np.float64) - mean[:, None]) * scale[:, None]).astype(np.float32)  # R,D
    return xs, scale, np.zeros_like(mean)


def refine_rows(
    rows: ConditionedRows,
    out: np.ndarray,
    kernel_mean: np.ndarray,
    kernel_inv_std: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
) -> None:
    """Correct in place the kernel's output (R, D) where its float32 mean or denominator strayed.

    The kernel computed out = gamma * (xs - m) / d + beta with its own m = kernel_mean and
    d = 1 / kernel_inv_std; the exact values are rows.center and rows.den, so
    out' = (out - beta) * d / den + gamma * (m - center) / den + beta.
    """
    den = rows.den
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ratio = 1.0 / (kernel_inv_std[:, 0].astype(np.float64) * den)  # R: d / den
        shift = (kernel_mean[:, 0].astype(np.float64) - rows.center) / den  # R, in units of y
        g_max, b_max = float(np.abs(gamma).max()), float(np.abs(beta).max())
        out_max = np.maximum(out.max(axis=1), -out.min(axis=1)).astype(np.float64)  # R
        # |gamma * y| <= |out| + |beta| bounds what an uncorrected row is off by.
        moved = (out_max + b_max) * np.abs(ratio - 1.0) + g_max * np.abs(shift)  # R
    idx = np.flatnonzero(moved > REFINE_TOL * max(1.0, g_max))  # nan (an overflowed row) stays as it is
    correct_rows(out, idx, ratio, shift, gamma, beta)


def correct_rows(
    out: np.ndarray, idx: np.ndarray, ratio: np.ndarray, shift: np.ndarray, gamma: np.ndarray, beta: np.ndarray
) -> None:
    """out[idx] = (out - beta) * ratio + gamma * shift + beta in float64, rounded once: the kernel's output with
    its denominator and mean replaced by the float64 ones (ratio = its denominator / theirs, shift in units of y)."""
    if idx.size:
        g, b = gamma.astype(np.float64), beta.astype(np.float64)  # D each
        fixed = (out[idx] - b) * ratio[idx, None] + g * shift[idx, None] + b  # r,D float64
        with np.errstate(over="ignore"):
            out[idx] = fixed  # rounds once to float32; a true overflow stays inf (then 422)
