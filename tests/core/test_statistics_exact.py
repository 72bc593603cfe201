"""The reported mean and var are the float64 ones on every backend: onnxruntime's equal the NumPy reference's.

A variance summed from the kernel's centered float32 rows would be off by up to 1.2e-7 relative (their
rounding); the statistics that a response reports are float64 sums of the float32 inputs, as
app.core.reference has them, to float64 rounding.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from app.core import reference
from app.core.dataplane import NormalizeInput
from app.core.seeds import SEED003

RTOL = 1e-15

SHAPES = [
    pytest.param((2, 3), 1, id="2x3"),
    pytest.param((4, 16), 1, id="4x16"),
    pytest.param((3, 5, 16), 2, id="3x5x16-k2"),
    pytest.param((8, 768), 1, id="8x768"),
    pytest.param((2, 3, 4, 5), 3, id="2x3x4x5-k3"),
    pytest.param((2, 10_000), 1, id="2x10000"),  # rows longer than NumPy's 8192-element reduction buffer
    pytest.param((1100, 256), 1, id="1100x256-chunked"),  # more rows than one kernel run takes
]
# (offset, scale): plain rows, offsets that dwarf the spread, and magnitudes that float32 squares overflow or lose.
DATA = [(0.0, 1.0), (100.0, 1.0), (-3e6, 0.5), (1e4, 1e-3), (0.0, 1e20), (0.0, 1e-20), (5.0, 0.0)]


def answers(runtime: Any, x: np.ndarray, k: int, eps: float, mode: str) -> tuple[Any, Any]:
    model = runtime.get("layernorm")
    onnx = model.infer(NormalizeInput(x, k, eps, mode))
    numpy = model.infer(NormalizeInput(x, k, eps, mode, backend="numpy"))
    return onnx, numpy


@pytest.mark.parametrize(("shape", "k"), SHAPES)
@pytest.mark.parametrize(("offset", "scale"), DATA, ids=[f"offset{o:g}-scale{s:g}" for o, s in DATA])
@pytest.mark.parametrize(("eps", "mode"), [(1e-5, "var"), (1e-6, "std")], ids=["var", "std"])
def test_onnxruntime_reports_the_numpy_backends_mean_and_var(
    runtime: Any, shape: tuple[int, ...], k: int, offset: float, scale: float, eps: float, mode: str
) -> None:
    rng = np.random.default_rng(sum(shape) + int(abs(offset)) % 1000)
    x = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
    onnx, numpy = answers(runtime, x, k, eps, mode)
    assert onnx.backend == "onnxruntime" and numpy.backend == "numpy"
    np.testing.assert_allclose(onnx.mean, numpy.mean, rtol=RTOL, atol=0)
    np.testing.assert_allclose(onnx.var, numpy.var, rtol=RTOL, atol=0)
    ref = reference.layer_norm(x, k, eps, mode)  # on the same float32 values
    np.testing.assert_allclose(onnx.var, ref.var, rtol=RTOL, atol=0)
    np.testing.assert_allclose(onnx.std, np.sqrt(ref.var), rtol=RTOL, atol=0)


def test_a_skewed_row_one_outlier_among_many_tiny_values(runtime: Any) -> None:
    x = np.full((3, 4096), 1e-3, np.float32)
    x[:, 17] = 3e4  # float32 sums of the squares would lose the tiny ones
    x[1] += np.float32(7e5)
    onnx, numpy = answers(runtime, x, 1, 1e-5, "var")
    np.testing.assert_allclose(onnx.var, numpy.var, rtol=RTOL, atol=0)
    np.testing.assert_allclose(onnx.mean, numpy.mean, rtol=RTOL, atol=0)


def test_seed_003_over_http_reports_the_float64_variance(client: httpx.Client) -> None:
    """Row 1, [0.5, 0.1, 0.1] in float32: var 0.035555555290646024, not the 0.035555551317003165 of float32 sums."""
    stats = {
        backend: client.post("/normalize", json={**SEED003.request(), "backend": backend}).json()["stats"]
        for backend in ("onnxruntime", "numpy")
    }
    ref = reference.layer_norm(np.asarray(SEED003.x, np.float32), 1, SEED003.eps, SEED003.eps_mode)
    assert stats["onnxruntime"]["var"][1] == 0.035555555290646024
    for backend in ("onnxruntime", "numpy"):
        np.testing.assert_allclose(stats[backend]["mean"], ref.mean, rtol=RTOL, atol=0)
        np.testing.assert_allclose(stats[backend]["var"], ref.var, rtol=RTOL, atol=0)
        np.testing.assert_allclose(stats[backend]["std"], np.sqrt(ref.var), rtol=RTOL, atol=0)
