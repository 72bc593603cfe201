"""Property tests (hypothesis): layer norm's invariants on the reference, the in-process service, and over HTTP.

For a non-constant row x and scalar gamma g, beta b:
    mean(out) = b,   var(out) = g^2 var / (var + eps)  (mode var)  or  g^2 var / (std + eps)^2  (mode std)
and out is unchanged by shifting x (x + c) and by scaling it (a x, a > 0, with eps scaled to match).
Every finite float32 input gives a finite answer that matches the float64 reference, or a 422.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from app.core import reference
from app.core.dataplane import NormalizeInput
from app.core.runtime import Runtime
from app.errors import InvalidInput

FLOAT32_MAX = float(np.finfo(np.float32).max)
SERVICE_ATOL = 1e-5  # spec section 1: the service matches the float64 math to 1e-5 (times |gamma|)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = st.tuples(st.integers(1, 6), st.integers(2, 48))
eps_modes = st.sampled_from(["var", "std"])
epsilons = st.sampled_from([1e-12, 1e-6, 1e-5, 1e-2])
scales = st.floats(-8, 8).filter(lambda g: abs(g) > 1e-3)


def rows(shape: tuple[int, int], magnitude: float = 1e4) -> st.SearchStrategy[np.ndarray]:
    """float32 rows of moderate magnitude, each non-constant."""
    elements = st.floats(-magnitude, magnitude, width=32, allow_subnormal=False)
    return arrays(np.float32, shape, elements=elements).filter(lambda x: bool((np.ptp(x, axis=-1) > 0).all()))


def service(runtime: Runtime, x: np.ndarray, eps: float, mode: str, g: float = 1.0, b: float = 0.0) -> np.ndarray:
    """The service's layer norm over the last dim, run by onnxruntime in process as a worker runs it."""
    cols = x.shape[-1]
    gamma, beta = np.full(cols, g, np.float32), np.full(cols, b, np.float32)
    return runtime.get("layernorm").infer(NormalizeInput(x, 1, eps, mode, gamma, beta)).output.astype(np.float64)


def expected_var(x: np.ndarray, eps: float, mode: str, g: float) -> np.ndarray:
    var = x.astype(np.float64).var(axis=-1)  # population variance
    return g * g * (var / (var + eps) if mode == "var" else var / (np.sqrt(var) + eps) ** 2)


@st.composite
def cases(draw: st.DrawFn, magnitude: float = 1e4) -> tuple[np.ndarray, float, str, float, float]:
    x = draw(rows(draw(shapes), magnitude))
    return (
        x,
        draw(epsilons),
        draw(eps_modes),
        float(np.float32(draw(scales))),
        float(np.float32(draw(st.floats(-8, 8)))),
    )


@PROPERTY
@given(cases())
def test_reference_mean_is_beta_and_variance_is_gamma_squared(
    case: tuple[np.ndarray, float, str, float, float],
) -> None:
    x, eps, mode, g, b = case
    out = reference.layer_norm(x, 1, eps, mode, np.full(x.shape[-1], g), np.full(x.shape[-1], b)).output
    np.testing.assert_allclose(out.mean(axis=-1), b, atol=1e-9 * (1 + abs(g)))
    np.testing.assert_allclose(out.var(axis=-1), expected_var(x, eps, mode, g), rtol=1e-9, atol=1e-12)


@PROPERTY
@given(case=cases())
def test_service_mean_is_beta_and_variance_is_gamma_squared(
    runtime: Runtime, case: tuple[np.ndarray, float, str, float, float]
) -> None:
    x, eps, mode, g, b = case
    out = service(runtime, x, eps, mode, g, b)
    atol = SERVICE_ATOL * max(1.0, abs(g))
    np.testing.assert_allclose(out.mean(axis=-1), b, atol=atol + 1e-6 * abs(b))
    # |y| <= sqrt(cols): an error of atol per element moves the variance by at most 2 sqrt(cols) |g| atol.
    var_atol = 2 * np.sqrt(x.shape[-1]) * abs(g) * atol + atol**2
    np.testing.assert_allclose(out.var(axis=-1), expected_var(x, eps, mode, g), atol=var_atol)


@PROPERTY
@given(x=rows((3, 16), magnitude=1000), shift=st.integers(-(10**6), 10**6), eps=epsilons, mode=eps_modes)
def test_service_is_invariant_to_shifting_a_row(
    runtime: Runtime, x: np.ndarray, shift: int, eps: float, mode: str
) -> None:
    x = (np.round(x * 8) / 8).astype(np.float32)  # multiples of 1/8: x + shift stays exact in float32
    assume(bool((np.ptp(x, axis=-1) > 0).all()))
    shifted = (x.astype(np.float64) + shift).astype(np.float32)
    assert np.array_equal(shifted.astype(np.float64) - shift, x.astype(np.float64))
    np.testing.assert_allclose(
        service(runtime, shifted, eps, mode), service(runtime, x, eps, mode), atol=2 * SERVICE_ATOL
    )


@PROPERTY
@given(x=rows((3, 16)), a=st.floats(1e-3, 1e3), eps=epsilons, mode=eps_modes)
def test_service_is_invariant_to_positive_scaling_with_eps_scaled_to_match(
    runtime: Runtime, x: np.ndarray, a: float, eps: float, mode: str
) -> None:
    scaled = (x.astype(np.float64) * a).astype(np.float32)
    # (a x - a m) / sqrt(a^2 var + a^2 eps) = (x - m) / sqrt(var + eps); in mode std eps scales by a alone.
    eps_scaled = eps * a * a if mode == "var" else eps * a
    # The reference on the float32-rounded scaled values is the ground truth; rounding moves it by ~1e-7.
    want = reference.layer_norm(scaled, 1, eps_scaled, mode).output
    np.testing.assert_allclose(want, reference.layer_norm(x, 1, eps, mode).output, atol=1e-5)
    np.testing.assert_allclose(service(runtime, scaled, eps_scaled, mode), want, atol=SERVICE_ATOL)


extremes = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([FLOAT32_MAX, -FLOAT32_MAX, 1e-45, -1e-45, 1.1754944e-38, 0.0, -0.0, 3e38, 1e30]),
)


@PROPERTY
@given(
    x=arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 16)), elements=extremes),
    mode=eps_modes,
    g=st.sampled_from([1.0, -1.0, 1e-3, 1e3, 3e38]),
)
def test_float32_extremes_give_a_finite_right_answer_or_a_422(
    runtime: Runtime, x: np.ndarray, mode: str, g: float
) -> None:
    cols = x.shape[-1]
    want = reference.layer_norm(x, 1, 1e-5, mode, np.full(cols, g), np.zeros(cols)).output
    try:
        got = service(runtime, x, 1e-5, mode, g)
    except InvalidInput as e:
        # Refused only when the exact answer itself is past float32's range.
        assert "not finite" in str(e)
        assert not (np.abs(want) <= FLOAT32_MAX).all()
        return
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=SERVICE_ATOL * max(1.0, abs(g)))


# ---- the same over HTTP, a few examples each ----


@settings(max_examples=15, deadline=None)
@given(x=arrays(np.float32, shapes, elements=extremes), mode=eps_modes)
def test_http_answers_are_finite_or_a_422(client: httpx.Client, x: np.ndarray, mode: str) -> None:
    r = client.post("/normalize", json={"data": x.tolist(), "eps_mode": mode, "gamma": [2.0] * x.shape[-1]})
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        assert r.json()["error"] == (
            "output: the result is not finite in FP32 (it overflows); scale the input or gamma down, or use a larger eps"
        )
        return
    out = np.asarray(r.json()["output"], dtype=np.float64)  # a null would make this an object array and fail
    assert out.shape == x.shape and np.isfinite(out).all()
    np.testing.assert_allclose(out, reference.layer_norm(x, 1, 1e-5, mode, np.full(x.shape[-1], 2.0)).output, atol=2e-5)


@settings(max_examples=15, deadline=None)
@given(case=cases())
@pytest.mark.parametrize("protocol", ["rest", "v2"])
def test_http_mean_is_beta_and_variance_is_gamma_squared(
    client: httpx.Client, protocol: str, case: tuple[np.ndarray, float, str, float, float]
) -> None:
    x, eps, mode, g, b = case
    cols = x.shape[-1]
    if protocol == "rest":
        doc = {"data": x.tolist(), "eps": eps, "eps_mode": mode, "gamma": [g] * cols, "beta": [b] * cols}
        out = np.asarray(client.post("/normalize", json=doc).json()["output"])
    else:
        inputs = [
            {"name": name, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
            for name, v in (
                ("input", x),
                ("gamma", np.full(cols, g, np.float32)),
                ("beta", np.full(cols, b, np.float32)),
            )
        ]
        doc = {"inputs": inputs, "parameters": {"eps": eps, "eps_mode": mode}}
        out = np.asarray(client.post("/v2/models/layernorm/infer", json=doc).json()["outputs"][0]["data"]).reshape(
            x.shape
        )
    atol = SERVICE_ATOL * max(1.0, abs(g))
    np.testing.assert_allclose(out.mean(axis=-1), b, atol=atol + 1e-6 * abs(b))
    var_atol = 2 * np.sqrt(cols) * abs(g) * atol + atol**2
    np.testing.assert_allclose(out.var(axis=-1), expected_var(x, eps, mode, g), atol=var_atol)
