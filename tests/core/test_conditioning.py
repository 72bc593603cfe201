"""app/core/conditioning.py in process: the kernel is handed the same problem, and refine_rows fixes its statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.core import reference
from app.core.conditioning import REFINE_TOL, condition_rows, moments, refine_rows

F32_MAX = float(np.finfo(np.float32).max)
RNG = np.random.default_rng(3)
ROWS = {
    "unit": RNG.standard_normal((3, 64)),
    "offset-1e8-at-1e30": 1e30 * (1 + RNG.standard_normal((3, 64)) * 1e-8),
    "two-level": 1e10 + (RNG.random((3, 768)) < 0.002) * 1024.0,
    "magnitude-1e37": 1e37 * RNG.standard_normal((3, 16)),
    "spanning-6e38": np.array([[-3e38, 3e38, 0.0], [F32_MAX, -F32_MAX, F32_MAX]]),
    "subnormal": np.array([[1e-45, 0.0, 3e-45, 1e-44]]),
    "constant": np.full((2, 5), 7.0),
}
EPSILONS = [1e-5, 1e-300, 1e300]


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("mode", ["var", "std"])
@pytest.mark.parametrize("name", list(ROWS))
def test_conditioned_rows_pose_the_same_problem_up_to_one_float32_rounding(name: str, mode: str, eps: float) -> None:
    x = ROWS[name].astype(np.float32)
    rows = condition_rows(x, eps, mode)
    ref = reference.layer_norm(x, 1, eps, mode)
    np.testing.assert_array_equal(rows.mean, x.mean(axis=1, dtype=np.float64))
    np.testing.assert_allclose(rows.var, ref.var, rtol=2**-22, atol=0)
    # What the kernel is asked: (x' - center) / den in its units, which must be the same y.
    y = (rows.x.astype(np.float64) - rows.center[:, None]) / rows.den[:, None]
    # One rounding to float32 of each kernel input: relative, or float32's underflow (half its smallest
    # subnormal, 2**-150) where a huge eps scales rows below float32's range and y is below it too.
    tol = 2**-22 * np.abs(ref.output).max(axis=1, keepdims=True) + 2**-150 / rows.den[:, None]
    assert (np.abs(y - ref.output) <= tol).all()
    # And the kernel cannot overflow or divide by zero on it.
    assert np.isfinite(rows.x).all() and (np.einsum("ij,ij->i", rows.x, rows.x) < F32_MAX).all()
    active, idle = (rows.eps_var, rows.eps_std) if mode == "var" else (rows.eps_std, rows.eps_var)
    assert (active > 0).all() and np.isfinite(active).all() and (idle == 0).all()


def kernel(x: np.ndarray, mean: np.ndarray, den: np.ndarray, g: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """A float32 kernel whose mean and denominator are the given ones: output, mean, inv_std_dev."""
    out = (g * (x - mean[:, None]) / den[:, None] + b).astype(np.float32)
    return [out, mean.astype(np.float32)[:, None], (1 / den).astype(np.float32)[:, None]]


@pytest.mark.parametrize(("den_error", "mean_error"), [(1e-3, 0.0), (-2e-6, 0.0), (0.0, 1e-3), (3e-5, -4e-4)])
def test_refine_rows_corrects_a_kernel_whose_statistics_are_off(den_error: float, mean_error: float) -> None:
    x = (1e4 + RNG.standard_t(2, (4, 3000))).astype(np.float32)
    g, b = RNG.uniform(0.5, 2, 3000).astype(np.float32), RNG.standard_normal(3000).astype(np.float32)
    rows = condition_rows(x, 1e-5, "var")
    out, m, inv = kernel(rows.x, rows.center + mean_error * rows.den, rows.den * (1 + den_error), g, b)
    ref = reference.layer_norm(x, 1, 1e-5, "var", g, b).output
    bound = 1e-5 * 2 + 2**-23 * np.abs(ref).max(axis=1, keepdims=True)  # the fidelity bound, |gamma| <= 2
    assert not (np.abs(out - ref) <= bound).all()  # the kernel's error, before
    refine_rows(rows, out, m, inv, g, b)
    assert (np.abs(out - ref) <= bound).all()


def test_refine_rows_leaves_rows_within_its_tolerance_and_overflowed_rows_alone() -> None:
    x = RNG.standard_normal((3, 50)).astype(np.float32)
    g, b = np.ones(50, np.float32), np.zeros(50, np.float32)
    rows = condition_rows(x, 1e-5, "var")
    out, m, inv = kernel(rows.x, rows.center, rows.den * (1 + REFINE_TOL / 100), g, b)
    out[2, 7] = np.inf  # a row whose result overflowed: it must reach the 422 as it is
    before = out.copy()
    refine_rows(rows, out, m, inv, g, b)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("outliers", [1, 50])
def test_one_outlier_in_12288_values_is_refined_to_within_the_bound(runtime: Any, outliers: int) -> None:
    """The real kernel sums 12,287 tiny squares onto one large one: its denominator is off by ~5e-6."""
    x = np.full((1, 12288), 1e30, np.float32)
    x[0, :outliers] = np.nextafter(x[0, 0], np.float32(np.inf))  # one float32 ulp above the rest
    rows = condition_rows(x, 1e-5, "var")
    g, b = np.ones(12288, np.float32), np.zeros(12288, np.float32)
    feeds = {"input": rows.x, "gamma": g, "beta": b, "eps_var": rows.eps_var, "eps_std": rows.eps_std}
    out, m, inv = runtime.get("layernorm").run(feeds, ["output", "mean", "inv_std_dev"])
    ref = reference.layer_norm(x, 1, 1e-5, "var").output
    bound = 1e-5 + 2**-23 * np.abs(ref).max()
    assert np.abs(out - ref).max() > bound  # the kernel alone misses the bound (by 20x with onnxruntime 1.31)
    refine_rows(rows, out, m, inv, g, b)
    assert np.abs(out - ref).max() <= bound


@pytest.mark.parametrize("shape", [(1, 3), (8, 64), (341, 768), (2, 10_000)])
@pytest.mark.parametrize("offset", [0.0, 1e4, -3e30])
def test_moments_are_the_references_statistics_bit_for_bit(shape: tuple[int, int], offset: float) -> None:
    """np.add.reduce and a division by the count are what ndarray.mean runs: the same float64 numbers."""
    x = (offset + np.abs(offset or 1) * 1e-3 * RNG.standard_normal(shape)).astype(np.float32)
    mean, var = moments(x)
    ref = reference.layer_norm(x, 1)
    np.testing.assert_array_equal(mean, ref.mean)
    np.testing.assert_array_equal(var, ref.var)
