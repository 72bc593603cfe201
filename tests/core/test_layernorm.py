"""app/core/layernorm.py: the graph's signature, V2 tensors in and out, both backends against the reference, row chunks."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
import pytest

from app.core import reference
from app.core.dataplane import NormalizeInput, NormalizeOutput
from app.core.halfprecision import HALF_DTYPES, limit, narrow, ulp_errors, widen
from app.core.layernorm import (
    CHUNK_ELEMENTS,
    FLOAT32_ULP,
    INPUTS,
    KERNEL_OUTPUTS,
    NORMALIZE_ATOL,
    OUTPUTS,
    WARM_UP_ATOL,
    LayerNormModel,
)
from app.core.model import Loaded
from app.core.runtime import Runtime
from app.errors import InvalidInput
from app.server.api.v2.codec import FIELDS as V2_FIELDS
from app.settings import Settings
from tests.halfcases import CASES as HALF_CASES
from tests.halfcases import HalfCase
from tests.live_server import MODELS
from tests.repositories import learned_layernorm

Backend = Literal["onnxruntime", "numpy"]


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(str(MODELS / "layernorm/1/model.onnx"), providers=["CPUExecutionProvider"])


@pytest.fixture
def model(runtime: Runtime) -> LayerNormModel:
    m = runtime.get("layernorm")
    assert isinstance(m, LayerNormModel)
    return m


def _counting_model(session: ort.InferenceSession, runs: list[int]) -> LayerNormModel:
    """The layernorm kind on the repo's graph, appending each run's row count to `runs`."""
    manifest = json.loads((MODELS / "layernorm/1/manifest.json").read_text())
    entry = {**manifest, "name": "layernorm", "sha256": manifest["files"]["model.onnx"]}
    path, settings = MODELS / "layernorm/1/model.onnx", Settings(model_dir=MODELS)
    loaded = Loaded(entry, path, session, settings, lambda *r: runs.append(r[3]))
    return LayerNormModel(loaded)


def _case(shape: tuple[int, ...], k: int, affine: bool, offset: float, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + offset).astype(np.float32)
    gamma = beta = None
    if affine:
        gamma = (1 + 0.5 * rng.standard_normal(shape[-k:])).astype(np.float32)
        beta = rng.standard_normal(shape[-k:]).astype(np.float32)
    return {"x": x, "k": k, "gamma": gamma, "beta": beta}


def test_signature_is_the_exported_graphs(session: ort.InferenceSession) -> None:
    assert [(v.name, v.shape) for v in session.get_inputs()] == INPUTS
    assert [(v.name, v.shape) for v in session.get_outputs()] == OUTPUTS
    assert KERNEL_OUTPUTS == [o.name for o in session.get_outputs()]


def test_v2_view_takes_input_gamma_beta_and_the_three_parameters(model: LayerNormModel) -> None:
    assert [(t.name, t.datatypes, t.shape, t.optional) for t in model.inputs] == [
        ("input", ("FP32", "FP64", "FP16", "BF16"), (-1, -1), False),
        ("gamma", ("FP32", "FP64", "FP16", "BF16"), (-1,), True),
        ("beta", ("FP32", "FP64", "FP16", "BF16"), (-1,), True),
    ]
    assert [(t.name, t.shape) for t in model.outputs] == [("output", (-1, -1)), ("mean", (-1,)), ("inv_std_dev", (-1,))]
    assert model.parameters == ("eps", "eps_mode", "normalized_ndim")


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> tuple[LayerNormModel, np.ndarray, np.ndarray]:
    """A learned LayerNorm of normalized_shape (2, 8), eps 1e-3, with gamma and beta of its own."""
    rng = np.random.default_rng(7)
    gamma, beta = (1 + 0.3 * rng.standard_normal((2, 8))), rng.standard_normal((2, 8))
    root = tmp_path_factory.mktemp("repository")
    learned_layernorm(root, "ln-learned", 1, gamma, beta, eps=1e-3)
    model = Runtime(Settings(model_dir=root)).build("ln-learned", 1)
    assert isinstance(model, LayerNormModel)
    return model, gamma.astype(np.float32), beta.astype(np.float32)


def test_a_learned_layernorm_describes_its_normalized_shape(learned: tuple[LayerNormModel, Any, Any]) -> None:
    model = learned[0]
    assert [(t.name, t.shape) for t in model.inputs] == [("input", (-1, 2, 8)), ("gamma", (2, 8)), ("beta", (2, 8))]
    assert [(t.name, t.shape) for t in model.outputs] == [
        ("output", (-1, 2, 8)),
        ("mean", (-1,)),
        ("inv_std_dev", (-1,)),
    ]


@pytest.mark.parametrize(
    ("override", "eps"),
    [({}, 1e-3), ({"eps": 0.5}, 0.5), ({"gamma": True}, 1e-3), ({"gamma": True, "beta": True}, 1e-3)],
)
def test_a_learned_layernorm_uses_its_own_weights_and_eps_unless_the_request_passes_some(
    learned: tuple[LayerNormModel, np.ndarray, np.ndarray], override: dict[str, Any], eps: float
) -> None:
    model, gamma, beta = learned
    x = (np.random.default_rng(1).standard_normal((3, 2, 8)) * 5 + 40).astype(np.float32)
    mine = np.full((2, 8), 2.0, np.float32)
    g = mine if override.get("gamma") else gamma
    b = -mine if override.get("beta") else beta
    req = model.request(
        x,
        None,
        override.get("eps"),
        "var",
        mine if "gamma" in override else None,
        -mine if "beta" in override else None,
    )
    out = model.infer(req)
    expected = reference.layer_norm(x, 2, eps, "var", g, b)
    np.testing.assert_allclose(out.output, expected.output, atol=2e-5 * max(1.0, float(np.abs(g).max())))
    np.testing.assert_allclose(out.mean, expected.mean, rtol=1e-12)


@pytest.mark.parametrize(("shape", "k"), [((3, 8), None), ((3, 2, 4), None), ((3, 2, 8), 1), ((8,), None)])
def test_a_learned_layernorm_refuses_inputs_not_ending_in_its_normalized_shape(
    learned: tuple[LayerNormModel, Any, Any], shape: tuple[int, ...], k: int | None
) -> None:
    with pytest.raises(InvalidInput) as e:
        learned[0].request(np.zeros(shape, np.float32), k, fields=V2_FIELDS)
    with_k = "" if k is None else f" with {k} normalized dims"
    assert str(e.value) == (
        f"inputs.input: model 'ln-learned' normalizes trailing dims [2, 8]; got shape {list(shape)}{with_k}"
    )


def test_a_learned_layernorm_warms_up_within_its_gamma_scaled_tolerance(
    learned: tuple[LayerNormModel, Any, Any],
) -> None:
    diff, atol = learned[0].warm_up()
    assert 0 < diff <= atol


def test_from_tensors_reads_inputs_and_parameters(model: LayerNormModel) -> None:
    x, g = np.ones((2, 3, 4)), np.full((3, 4), 2.0)
    req = model.from_tensors({"input": x, "gamma": g}, {"eps": 0.5, "eps_mode": "std", "normalized_ndim": 2}, V2_FIELDS)
    assert (req.k, req.eps, req.eps_mode, req.backend, req.validate) == (2, 0.5, "std", "onnxruntime", False)
    assert req.gamma is not None and req.beta is None
    assert (req.x.dtype, req.gamma.dtype) == (np.dtype(np.float32), np.dtype(np.float32))
    np.testing.assert_array_equal(req.gamma, g)


def test_from_tensors_defaults_are_eps_1e_5_mode_var_one_dim(model: LayerNormModel) -> None:
    req = model.from_tensors({"input": np.ones((2, 3))}, {}, V2_FIELDS)
    assert (req.k, req.eps, req.eps_mode, req.gamma, req.beta) == (1, 1e-5, "var", None, None)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"normalized_ndim": 3}, "parameters.normalized_ndim: expected an integer in 1..2 (the input's rank), got 3"),
        ({"eps": -1}, "parameters.eps: expected a finite number > 0, got -1"),
        ({"eps_mode": "sigma"}, "parameters.eps_mode: expected 'var' or 'std', got 'sigma'"),
    ],
)
def test_from_tensors_errors_name_the_v2_fields(model: LayerNormModel, params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        model.from_tensors({"input": np.ones((2, 3))}, params, V2_FIELDS)
    assert str(e.value) == message


@pytest.mark.parametrize("eps_mode", ["var", "std"])
def test_tensors_round_trip_through_infer(model: LayerNormModel, eps_mode: str) -> None:
    c = _case((4, 2, 6), 2, affine=True, offset=5)
    tensors = {"input": c["x"], "gamma": c["gamma"], "beta": c["beta"]}
    req = model.from_tensors(tensors, {"eps": 1e-3, "eps_mode": eps_mode, "normalized_ndim": 2}, V2_FIELDS)
    out = model.to_tensors(model.infer(req))
    ref = reference.layer_norm(c["x"], 2, 1e-3, eps_mode, c["gamma"], c["beta"])
    assert list(out) == ["output", "mean", "inv_std_dev"]
    assert (out["output"].shape, out["mean"].shape, out["inv_std_dev"].shape) == ((4, 2, 6), (4,), (4,))
    np.testing.assert_allclose(out["output"], ref.output, rtol=0, atol=2e-5)
    np.testing.assert_allclose(out["mean"], ref.mean, rtol=1e-12)
    den = np.sqrt(ref.var + 1e-3) if eps_mode == "var" else np.sqrt(ref.var) + 1e-3
    # The variance comes from the conditioned float32 rows, summed in float64: float32-close, not float64-exact.
    np.testing.assert_allclose(out["inv_std_dev"], 1 / den, rtol=1e-6)


CASES = [
    pytest.param((5, 16), 1, False, 0.0, id="k1"),
    pytest.param((3, 4, 8), 2, True, 0.0, id="k2-affine"),
    pytest.param((2, 2, 3, 5), 3, True, 1000.0, id="k3-affine-offset-1000"),
    pytest.param((7,), 1, False, -50.0, id="rank1"),
]


@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
@pytest.mark.parametrize(("shape", "k", "affine", "offset"), CASES)
def test_infer_matches_the_reference_and_validates_against_the_other_backend(
    model: LayerNormModel, backend: Backend, eps_mode: str, shape: tuple[int, ...], k: int, affine: bool, offset: float
) -> None:
    c = _case(shape, k, affine, offset)
    req = NormalizeInput(c["x"], k, 1e-5, eps_mode, c["gamma"], c["beta"], backend=backend, validate=True)
    out = model.infer(req)
    ref = reference.layer_norm(c["x"], k, 1e-5, eps_mode, c["gamma"], c["beta"])
    gamma_max = 1.0 if c["gamma"] is None else max(1.0, float(np.abs(c["gamma"]).max()))
    atol = NORMALIZE_ATOL * gamma_max + FLOAT32_ULP * float(np.abs(ref.output).max())
    assert (out.backend, out.eps, out.eps_mode) == (backend, 1e-5, eps_mode)
    assert out.output.dtype == (np.float32 if backend == "onnxruntime" else np.float64)
    assert out.model == (model.info if backend == "onnxruntime" else None)
    np.testing.assert_allclose(out.output, ref.output, rtol=0, atol=atol)
    np.testing.assert_allclose(out.mean, ref.mean, rtol=1e-12)
    np.testing.assert_allclose(out.var, ref.var, rtol=1e-6)
    assert out.validation is not None
    assert out.validation == {
        "reference": "numpy" if backend == "onnxruntime" else "onnxruntime",
        "max_abs_diff": out.validation["max_abs_diff"],
        "atol": pytest.approx(atol, rel=1e-12),
        "passed": True,
    }
    assert 0 <= out.validation["max_abs_diff"] <= atol


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
def test_infer_without_validate_runs_one_backend_and_reports_no_validation(
    model: LayerNormModel, backend: Backend
) -> None:
    out = model.infer(NormalizeInput(np.ones((2, 3)), backend=backend))
    assert isinstance(out, NormalizeOutput) and out.validation is None


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
def test_an_output_that_overflows_float32_is_refused(model: LayerNormModel, backend: Backend) -> None:
    big = np.full(2, 3e38, np.float32)  # |normalized| = 1, so gamma * 1 + beta = 6e38
    req = NormalizeInput(np.array([[0.0, 1.0]]), 1, gamma=big, beta=big, backend=backend)
    with pytest.raises(InvalidInput) as e:
        model.infer(req)
    assert str(e.value) == (
        "output: the result is not finite in FP32 (it overflows); scale the input or gamma down, or use a larger eps"
    )


@pytest.mark.parametrize(
    ("shape", "k", "eps_mode"),
    [((3, 700, 512), 1, "var"), ((5000, 70), 1, "std"), ((40, 64, 128), 2, "var")],
    ids=["rows-of-512", "short-rows", "k2"],
)
def test_an_input_larger_than_a_chunk_matches_the_reference(
    runtime: Runtime, shape: tuple[int, ...], k: int, eps_mode: str
) -> None:
    assert np.prod(shape) > CHUNK_ELEMENTS  # several runs of the graph
    x = (100 + np.random.default_rng(5).standard_normal(shape) * 3).astype(np.float32)
    gamma = np.linspace(0.5, 2, int(np.prod(shape[-k:])), dtype=np.float32).reshape(shape[-k:])
    out = runtime.get("layernorm").infer(NormalizeInput(x, k, 1e-5, eps_mode, gamma, -gamma))
    ref = reference.layer_norm(x, k, 1e-5, eps_mode, gamma, -gamma)
    assert out.output.shape == shape and out.mean.shape == shape[:-k]
    np.testing.assert_allclose(out.output, ref.output, rtol=0, atol=2e-5)
    np.testing.assert_allclose(out.mean, ref.mean, rtol=1e-9)
    np.testing.assert_allclose(out.var, ref.var, rtol=1e-6)


@pytest.mark.parametrize(
    ("rows", "cols", "runs"),
    [
        (CHUNK_ELEMENTS // 512, 512, [512]),  # exactly one chunk: one run
        (1100, 512, [512, 512, 76]),
        (3, CHUNK_ELEMENTS + 1, [1, 1, 1]),  # a row longer than a chunk still runs whole
        (CHUNK_ELEMENTS // 70 + 1, 70, [CHUNK_ELEMENTS // 70, 1]),
    ],
    ids=["one-chunk", "three-chunks", "one-row-per-run", "remainder-of-one"],
)
def test_large_inputs_run_the_graph_in_row_chunks(
    session: ort.InferenceSession, rows: int, cols: int, runs: list[int]
) -> None:
    observed: list[int] = []
    model = _counting_model(session, observed)
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    out = model.infer(NormalizeInput(x, 1, 1e-5, "var"))
    assert observed == runs
    assert sum(runs) == rows and max(runs) <= max(1, CHUNK_ELEMENTS // cols)
    ref = reference.layer_norm(x, 1)
    np.testing.assert_allclose(out.output, ref.output, rtol=0, atol=2e-5)
    np.testing.assert_allclose(out.var, ref.var, rtol=1e-6)
    assert math.isclose(float(out.mean[-1]), float(ref.mean[-1]), rel_tol=1e-9, abs_tol=1e-12)


def test_warm_up_figure_is_under_its_tolerance_and_reproducible(model: LayerNormModel) -> None:
    diff, atol = model.warm_up()
    assert atol == WARM_UP_ATOL == 2 * NORMALIZE_ATOL
    assert 0 < diff <= atol
    assert model.warm_up() == (diff, atol)


# ---- half precision (issue 26): FP16 and BF16 in, rounded once out, within one unit in the last place -------


@pytest.mark.parametrize("case", HALF_CASES, ids=[c.id for c in HALF_CASES])
@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize("eps", [1e-5, 1e-12, 1000.0])
@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
def test_half_precision_output_is_within_one_ulp_of_the_float64_truth(
    model: LayerNormModel, case: HalfCase, eps_mode: str, eps: float, backend: Backend
) -> None:
    req = NormalizeInput(case.x, 1, eps, eps_mode, case.gamma, case.beta, backend, dtype=case.datatype)
    out = model.infer(req)
    assert out.output.dtype == HALF_DTYPES[case.datatype]
    assert float(ulp_errors(out.output, case.truth(eps, eps_mode), case.datatype).max()) <= 1.0
    # The statistics stay float64, of the exact half-precision values.
    ref = reference.layer_norm(widen(case.x), 1, eps, eps_mode)
    np.testing.assert_array_equal(out.mean, ref.mean)
    np.testing.assert_array_equal(out.var, ref.var)


@pytest.mark.parametrize("datatype", list(HALF_DTYPES))
@pytest.mark.parametrize("source", [np.float32, "half"])
def test_many_rows_round_faithfully_to_a_half_output(model: LayerNormModel, datatype: str, source: Any) -> None:
    """Thousands of rows with gamma and beta, so that outputs near 0 (computed exactly) occur by the hundred; a
    float32 input asked for a half output too."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((512, 768)) * 5 + 40
    x = narrow(x, datatype, "x") if source == "half" else x.astype(np.float32)
    gamma, beta = (narrow(rng.standard_normal(768) * s, datatype, "g") for s in (2.0, 1.0))
    out = model.infer(NormalizeInput(x, 1, 1e-5, "var", gamma, beta, dtype=datatype)).output
    truth = reference.layer_norm(np.asarray(x, np.float32), 1, 1e-5, "var", widen(gamma), widen(beta)).output
    assert float(ulp_errors(out, truth, datatype).max()) <= 1.0


@pytest.mark.parametrize(
    ("datatype", "beta", "message"),
    [
        ("FP16", 65504.0, "output: element [0, 1] = 131008 is outside float16's finite range (|x| <= 65504)"),
        # Past BF16's largest value by more than half its spacing, and still a finite float32.
        (
            "BF16",
            1.5 * 2.0**119,
            "output: element [0, 1] = 3.3995006e+38 is outside bfloat16's finite range (|x| <= 3.389531e+38)",
        ),
    ],
)
def test_an_output_beyond_the_half_range_is_refused(
    model: LayerNormModel, datatype: str, beta: float, message: str
) -> None:
    # y = [-1, 1] exactly (eps negligible), so out = gamma * y + beta leaves no digit to the kernel.
    gamma, b = (narrow(np.full(2, v), datatype, "g") for v in (limit(datatype), beta))
    req = NormalizeInput(narrow(np.array([[-1.0, 1.0]]), datatype, "x"), 1, 1e-30, "std", gamma, b, dtype=datatype)
    with pytest.raises(InvalidInput) as e:
        model.infer(req)
    assert str(e.value) == message
