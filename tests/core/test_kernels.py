"""app/core/kernels.py: the committed fused graph, its sessions per eps, and which rows it may keep."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from app.core import kernels, reference
from app.core.conditioning import moments
from app.core.dataplane import NormalizeInput
from app.core.halfprecision import CAST_FILES
from app.core.kernels import (
    FEW_ROWS,
    GATE,
    KERNEL_FILE,
    KERNEL_OUTPUTS,
    MAX_SESSIONS,
    TEMPLATE_EPS,
    FusedKernel,
    check_kernel,
)

ROOT = Path(__file__).resolve().parents[2]
F32_MAX = float(np.finfo(np.float32).max)


def _make_kernel() -> Any:
    spec = importlib.util.spec_from_file_location("make_kernel", ROOT / "scripts/make_kernel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_graph_is_what_the_script_writes() -> None:
    pytest.importorskip("onnx")
    assert _make_kernel().kernel_graph().SerializeToString() == KERNEL_FILE.read_bytes()


def test_the_committed_fp16_casts_are_what_the_script_writes() -> None:
    pytest.importorskip("onnx")
    for direction, path in CAST_FILES.items():
        assert _make_kernel().cast_graph(direction).SerializeToString() == path.read_bytes(), path


def test_the_template_eps_occurs_once_and_a_session_runs_with_the_requested_eps() -> None:
    assert KERNEL_FILE.read_bytes().count(struct.pack("<f", TEMPLATE_EPS)) == 1
    kernel = FusedKernel(ort.SessionOptions())
    x = np.array([[0.0, 1.0], [2.0, 2.0]], np.float32)
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    session = kernel.session(0.25)
    assert session is not None
    assert [o.name for o in session.get_outputs()] == list(KERNEL_OUTPUTS)
    out, mean, inv, out_max, out_min = session.run(None, {"input": x, "gamma": ones, "beta": zeros})
    # var 0.25 + eps 0.25: y = +-0.5 / sqrt(0.5); the constant row divides 0 by sqrt(eps).
    np.testing.assert_allclose(out, [[-0.5 / 0.5**0.5, 0.5 / 0.5**0.5], [0, 0]], rtol=1e-6)
    np.testing.assert_allclose(inv[:, 0], [1 / 0.5**0.5, 1 / 0.25**0.5], rtol=1e-6)
    np.testing.assert_array_equal(mean[:, 0], [0.5, 2.0])
    np.testing.assert_array_equal(out_max[:, 0], out.max(axis=1))
    np.testing.assert_array_equal(out_min[:, 0], out.min(axis=1))


@pytest.mark.parametrize("eps", [1e-39, 2.0**-127, 2.0**64, 1e300])
def test_an_eps_that_is_no_normal_float32_below_2_64_has_no_session(eps: float) -> None:
    assert FusedKernel(ort.SessionOptions()).session(eps) is None


def test_sessions_are_kept_per_float32_eps_up_to_a_bound() -> None:
    kernel = FusedKernel(ort.SessionOptions())
    first = kernel.session(1e-5)
    assert first is not None and kernel.session(float(np.float32(1e-5))) is first  # the same float32
    for i in range(MAX_SESSIONS - 1):
        assert kernel.session(2.0 ** -(i + 2)) is not None
    assert kernel.session(3e-3) is None  # one more eps: the exact path, no session built
    assert len(kernel.sessions) == MAX_SESSIONS and kernel.session(1e-5) is first


def _judge(x: np.ndarray, eps: float = 1e-5) -> tuple[Any, list[np.ndarray]]:
    D = x.shape[1]
    session = FusedKernel(ort.SessionOptions()).session(eps)
    assert session is not None
    outputs = session.run(None, {"input": x, "gamma": np.ones(D, np.float32), "beta": np.zeros(D, np.float32)})
    mean, var = moments(x)
    return check_kernel(mean, var, eps, outputs, 1.0, 0.0), outputs


RNG = np.random.default_rng(11)
# Rows the fused kernel gets wrong, each beside a plain row it keeps: (name, row of 256 values).
STRAYS = {
    "offset-1e6-std": 1e4 + 1e-2 * RNG.standard_normal(256),  # its float32 mean cancels the spread
    "squares-overflow": 1e20 * RNG.standard_normal(256),  # sums of squares beyond float32
    "spanning-6e38": np.resize([-3e38, 3e38], 256),
    "one-outlier-at-1e30": np.r_[np.nextafter(np.float32(1e30), np.float32(np.inf)), np.full(255, 1e30)],
}


@pytest.mark.parametrize("name", list(STRAYS))
def test_rows_the_kernel_gets_wrong_take_the_exact_path(name: str) -> None:
    plain = RNG.standard_normal(256)
    x = np.stack([plain, STRAYS[name], plain + 3]).astype(np.float32)
    check, _ = _judge(x)
    np.testing.assert_array_equal(check.exact, [1])
    assert not np.isin(check.refine, check.exact).any()


def test_plain_rows_stay_on_the_kernel_within_the_gate() -> None:
    x = (RNG.standard_normal((64, 768)) * RNG.uniform(1e-3, 1e3, (64, 1)) + RNG.uniform(-5, 5, (64, 1))).astype(
        np.float32
    )
    check, _ = _judge(x)
    assert check.exact.size == 0
    assert np.abs(check.ratio - 1).max() <= GATE and np.abs(check.shift).max() <= GATE


def test_the_kernel_subtracts_the_mean_it_reports_and_divides_by_the_denominator_it_reports() -> None:
    """refine's formula holds only if out = (x - mean) / d with the reported mean and d = 1 / inv_std_dev."""
    x = (1000 + RNG.standard_normal((16, 512))).astype(np.float32)  # the mean's float32 rounding shows
    _, (out, kernel_mean, kernel_inv, _, _) = _judge(x)
    by_reported = (x - kernel_mean.astype(np.float64)) * kernel_inv.astype(np.float64)
    by_float64 = (x - x.mean(axis=1, dtype=np.float64, keepdims=True)) * kernel_inv.astype(np.float64)
    assert np.abs(out - by_reported).max() < 1e-6 < np.abs(out - by_float64).max()


CASES = [
    pytest.param(1e4 + 1e-2 * RNG.standard_normal((4, 768)), 1e-5, id="cancellation"),
    pytest.param(np.r_[RNG.standard_normal((3, 768)), 1e20 * RNG.standard_normal((1, 768))], 1e-5, id="mixed"),
    pytest.param(1e-20 * RNG.standard_normal((4, 64)), 1e-30, id="tiny-var-tiny-eps"),
    pytest.param(1e8 + RNG.standard_t(2, (4, 3000)), 3e-3, id="heavy-tails-other-eps"),
]


@pytest.mark.parametrize(("x", "eps"), CASES)
@pytest.mark.parametrize("affine", [False, True])
def test_infer_with_strays_matches_the_reference_within_the_bound(
    runtime: Any, x: np.ndarray, eps: float, affine: bool
) -> None:
    x = x.astype(np.float32)
    D = x.shape[1]
    g = RNG.uniform(0.5, 2, D).astype(np.float32) * RNG.choice([-1, 1], D) if affine else None
    b = RNG.standard_normal(D).astype(np.float32) if affine else None
    out = runtime.get("layernorm").infer(NormalizeInput(x, 1, eps, "var", g, b))
    ref = reference.layer_norm(x, 1, eps, "var", g, b)
    g_max = 1.0 if g is None else max(1.0, float(np.abs(g).max()))
    bound = 1e-5 * g_max + 2**-23 * np.abs(ref.output).max(axis=1, keepdims=True)
    assert (np.abs(out.output - ref.output) <= bound).all()
    np.testing.assert_array_equal(out.mean, ref.mean)
    np.testing.assert_array_equal(out.var, ref.var)


def test_rows_that_reach_overflow_in_the_output_are_left_for_the_422() -> None:
    x = np.array([[0.0, 1.0], [0.0, 2.0]], np.float32)
    session = FusedKernel(ort.SessionOptions()).session(1e-5)
    assert session is not None
    big = np.full(2, F32_MAX, np.float32)
    outputs = session.run(None, {"input": x, "gamma": big, "beta": big})
    mean, var = moments(x)
    check = check_kernel(mean, var, 1e-5, outputs, F32_MAX, F32_MAX)
    assert check.exact.size == 0 and np.isinf(outputs[0]).any()


def _synthetic_outputs(rows: int, stray: float, seed: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Float64 statistics and kernel outputs whose mean and denominator differ from them by up to `stray`."""
    rng = np.random.default_rng(seed)
    mean, var = rng.standard_normal(rows) * 10.0 ** rng.integers(-3, 4, rows), rng.uniform(1e-3, 1e3, rows)
    den = np.sqrt(var + 1e-5)
    kernel_mean = (mean + stray * den * rng.uniform(-1, 1, rows)).astype(np.float32)[:, None]
    kernel_inv = (1 / (den * (1 + stray * rng.uniform(-1, 1, rows)))).astype(np.float32)[:, None]
    top = rng.uniform(0.1, 50, (rows, 1)).astype(np.float32)
    return mean, var, [np.zeros((rows, 4), np.float32), kernel_mean, kernel_inv, top, -top * rng.uniform(0, 2)]


# Kernel statistics off by up to `stray`: kept as they are, refined (float32's own rounding of the mean is enough
# for some rows), or past the gate.
STRAY_VERDICTS = [
    pytest.param(0.0, {"kept", "refine"}, id="exact"),
    pytest.param(1e-9, {"kept", "refine"}, id="1e-9"),
    pytest.param(1e-7, {"kept", "refine"}, id="1e-7"),
    pytest.param(3e-6, {"refine"}, id="3e-6"),
    pytest.param(1e-4, {"refine"}, id="1e-4"),
    pytest.param(1e-3, {"gate"}, id="1e-3"),
]


@pytest.mark.parametrize(("stray", "expected_verdicts"), STRAY_VERDICTS)
@pytest.mark.parametrize(("g_max", "b_max"), [(1.0, 0.0), (3.5, 0.1), (0.25, 7.0)])
def test_the_check_of_a_few_rows_on_python_floats_is_numpys_bit_for_bit(
    stray: float, expected_verdicts: set[str], g_max: float, b_max: float
) -> None:
    b_max = float(np.float32(b_max))  # max |beta| of a float32 beta
    verdicts = set()
    for seed in range(40):
        mean, var, outputs = _synthetic_outputs(1 + seed % FEW_ROWS, stray, seed)
        few, vectorized = (
            kernels._check_few(mean, var, 1e-5, outputs, g_max, b_max),
            kernels._check_numpy(mean, var, 1e-5, outputs, g_max, b_max),
        )
        if few is None:  # a row past the gate: the vectorized check decides, and check_kernel returns its verdict
            assert vectorized.exact.size > 0
            verdicts.add("gate")
            continue
        verdicts.add("refine" if few.refine.size else "kept")
        for name in ("exact", "refine", "ratio", "shift"):
            got, expected = getattr(few, name), getattr(vectorized, name)
            assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes(), name
    assert verdicts == expected_verdicts


def test_a_few_rows_with_a_kernel_overflow_are_judged_by_numpy() -> None:
    mean, var, outputs = _synthetic_outputs(4, 0.0, 1)
    outputs[2][1, 0] = 0.0  # an inverse std of 0: the vectorized check's ratio is inf, the row goes exact
    assert kernels._check_few(mean, var, 1e-5, outputs, 1.0, 0.0) is None
    np.testing.assert_array_equal(check_kernel(mean, var, 1e-5, outputs, 1.0, 0.0).exact, [1])
