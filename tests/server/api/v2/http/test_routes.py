"""The official tritonclient[http], unchanged, against a live server: metadata, infer, compression, statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as th

from app import __version__
from app.core import reference
from app.core.runtime import Runtime
from app.core.seeds import SEED003
from tests.triton_clients import TritonOn

LN_OUTPUTS = ["output", "mean", "inv_std_dev"]
ENCODERS = ["encoder", "encoder-preln"]
TRITON = TritonOn("server", "http", {"network_timeout": 60})  # tests/conftest.py's `triton`, on the shared server
LN_ATOL = 2e-5  # the spec's 1e-5 fidelity plus float32 rounding of outputs near 1


def _input(name: str, arr: np.ndarray, binary: bool = True) -> th.InferInput:
    datatype = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(bool): "BOOL"}[arr.dtype]
    t = th.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


def _ln_reference(x: np.ndarray, k: int, eps: float, mode: str, gamma: Any = None, beta: Any = None) -> dict[str, Any]:
    ref = reference.layer_norm(x, k, eps, mode, gamma, beta)
    inv = 1 / np.sqrt(ref.var + eps) if mode == "var" else 1 / (np.sqrt(ref.var) + eps)
    return {"output": ref.output, "mean": ref.mean, "inv_std_dev": inv}


def test_server_is_live_ready_and_lists_extensions(triton: th.InferenceServerClient) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    meta = triton.get_server_metadata()
    assert meta["name"] == "normserve" and meta["version"] == __version__
    assert {"binary_tensor_data", "statistics"} <= set(meta["extensions"])


def test_layernorm_metadata_has_variable_dims_and_three_outputs(triton: th.InferenceServerClient) -> None:
    meta = triton.get_model_metadata("layernorm", model_version="1")
    assert meta["name"] == "layernorm" and meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("input", "FP32", [-1, -1]),
        ("gamma", "FP32", [-1]),
        ("beta", "FP32", [-1]),
    ]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("output", "FP32", [-1, -1]),
        ("mean", "FP32", [-1]),
        ("inv_std_dev", "FP32", [-1]),
    ]


@pytest.mark.parametrize("model", ENCODERS)
def test_encoder_metadata_lists_every_layer_norm(
    triton: th.InferenceServerClient, runtime: Runtime, model: str
) -> None:
    m = runtime.get(model)
    assert m.config is not None
    meta = triton.get_model_metadata(model)
    d = m.config.d_model
    assert meta["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, -1, d]},
        {"name": "padding_mask", "datatype": "BOOL", "shape": [-1, -1]},
    ]
    stats = [f"{n}.{s}" for n in m.layer_norms for s in ("mean", "std")]
    assert [t["name"] for t in meta["outputs"]] == ["output", *stats]
    assert all(t["shape"] == [-1, -1] for t in meta["outputs"][1:])


@pytest.mark.parametrize("model", ["layernorm", *ENCODERS])
def test_known_models_are_ready_and_unknown_are_not(triton: th.InferenceServerClient, model: str) -> None:
    assert triton.is_model_ready(model) and triton.is_model_ready(model, "1")
    assert not triton.is_model_ready(model, "2")
    assert not triton.is_model_ready(model + "-nope")


@pytest.mark.parametrize(
    ("binary", "compression"),
    [(True, None), (False, None), (True, "gzip"), (False, "gzip"), (True, "deflate")],
    ids=["binary", "json", "binary-gzip", "json-gzip", "binary-deflate"],
)
def test_layernorm_seed003_golden_vector(
    triton: th.InferenceServerClient, binary: bool, compression: str | None
) -> None:
    x = np.array(SEED003.x, np.float32)
    outputs = [th.InferRequestedOutput(n, binary_data=binary) for n in LN_OUTPUTS]
    r = triton.infer(
        "layernorm",
        [_input("input", x, binary)],
        outputs=outputs,
        request_id="seed-003",
        request_compression_algorithm=compression,
        response_compression_algorithm=compression,
    )
    assert r.get_response()["id"] == "seed-003"
    assert all(("data" in o) != binary for o in r.get_response()["outputs"])
    np.testing.assert_allclose(r.as_numpy("output"), SEED003.output, atol=1e-4)
    for name, expected in _ln_reference(x, 1, 1e-5, "var").items():
        np.testing.assert_allclose(r.as_numpy(name), expected, rtol=1e-6, atol=LN_ATOL)
        assert r.as_numpy(name).dtype == np.float32


@pytest.mark.parametrize(
    ("eps", "eps_mode", "k", "affine"),
    [(1e-5, "var", 1, False), (1e-6, "std", 1, True), (1e-3, "var", 2, True), (1e-2, "std", 3, False)],
    ids=["var-k1", "std-k1-affine", "var-k2-affine", "std-k3"],
)
def test_layernorm_parameters_match_reference(
    triton: th.InferenceServerClient, eps: float, eps_mode: str, k: int, affine: bool
) -> None:
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((2, 3, 5)) * 3 + 50).astype(np.float32)
    inputs = [_input("input", x)]
    gamma = beta = None
    if affine:
        gamma = rng.uniform(0.5, 2, x.shape[-k:]).astype(np.float32)
        beta = rng.standard_normal(x.shape[-k:]).astype(np.float32)
        inputs += [_input("gamma", gamma), _input("beta", beta, binary=False)]
    params = {"eps": eps, "eps_mode": eps_mode, "normalized_ndim": k}
    r = triton.infer("layernorm", inputs, parameters=params)
    for name, expected in _ln_reference(x, k, eps, eps_mode, gamma, beta).items():
        assert r.as_numpy(name).shape == expected.shape
        np.testing.assert_allclose(r.as_numpy(name), expected, rtol=1e-6, atol=2 * LN_ATOL)


def test_no_outputs_named_returns_all_of_them_binary(triton: th.InferenceServerClient) -> None:
    r = triton.infer("layernorm", [_input("input", np.array(SEED003.x, np.float32), binary=False)])
    outputs = r.get_response()["outputs"]
    assert [o["name"] for o in outputs] == LN_OUTPUTS
    assert all("binary_data_size" in o["parameters"] and "data" not in o for o in outputs)
    np.testing.assert_allclose(r.as_numpy("output"), SEED003.output, atol=1e-4)


def test_one_named_output_is_the_only_one_sent(triton: th.InferenceServerClient) -> None:
    r = triton.infer(
        "layernorm", [_input("input", np.array(SEED003.x, np.float32))], outputs=[th.InferRequestedOutput("mean")]
    )
    assert [o["name"] for o in r.get_response()["outputs"]] == ["mean"]
    np.testing.assert_allclose(r.as_numpy("mean"), np.mean(SEED003.x, axis=1), rtol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp64_input_gives_fp64_outputs(triton: th.InferenceServerClient, binary: bool) -> None:
    x = np.array(SEED003.x, np.float64)
    r = triton.infer(
        "layernorm",
        [_input("input", x, binary)],
        parameters={"normalized_ndim": 2},
        outputs=[th.InferRequestedOutput(n, binary_data=binary) for n in LN_OUTPUTS],
    )
    assert {o["datatype"] for o in r.get_response()["outputs"]} == {"FP64"}
    # FP64 is converted once to float32 on the way in: the reference sees the same float32 values.
    for name, expected in _ln_reference(x.astype(np.float32), 2, 1e-5, "var").items():
        out = r.as_numpy(name)
        assert out.dtype == np.float64 and out.shape == expected.shape
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=LN_ATOL)
    assert r.as_numpy("mean").shape == ()  # k == rank: a scalar, as in POST /normalize


@pytest.mark.parametrize("model", ENCODERS)
@pytest.mark.parametrize(("binary", "compression"), [(True, None), (False, "gzip")], ids=["binary", "json-gzip"])
def test_encoder_matches_reference(
    triton: th.InferenceServerClient, runtime: Runtime, model: str, binary: bool, compression: str | None
) -> None:
    m = runtime.get(model)
    assert m.config is not None and m.weights is not None
    x = np.random.default_rng(7).standard_normal((2, 5, m.config.d_model)).astype(np.float32)
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, 3:] = True
    ref, stats = reference.encoder(x, m.weights, m.config, mask)
    names = ["output", *(f"{n}.{s}" for n in m.layer_norms for s in ("mean", "std"))]
    r = triton.infer(
        model,
        [_input("input", x, binary), _input("padding_mask", mask, binary)],
        outputs=[th.InferRequestedOutput(n, binary_data=binary) for n in names],
        request_compression_algorithm=compression,
        response_compression_algorithm=compression,
    )
    atol = runtime.settings.validate_atol
    np.testing.assert_allclose(r.as_numpy("output"), ref, atol=atol)
    for name, mean, std in stats:
        np.testing.assert_allclose(r.as_numpy(f"{name}.mean"), mean, atol=atol)
        np.testing.assert_allclose(r.as_numpy(f"{name}.std"), std, rtol=atol, atol=atol)


def test_unknown_model_and_version_are_404(triton: th.InferenceServerClient) -> None:
    x = _input("input", np.ones((1, 2), np.float32))
    for call in (
        lambda: triton.infer("gpt", [x]),
        lambda: triton.infer("layernorm", [x], model_version="7"),
        lambda: triton.get_model_metadata("gpt"),
        lambda: triton.get_inference_statistics("gpt"),
    ):
        with pytest.raises(th.InferenceServerException) as e:
            call()
        assert e.value.status() == "404"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"eps": -1.0}, "parameters.eps: expected a finite number > 0, got -1.0"),
        ({"eps_mode": "rms"}, "parameters.eps_mode: expected 'var' or 'std', got 'rms'"),
        ({"normalized_ndim": 3}, "parameters.normalized_ndim: expected an integer in 1..2 (the input's rank), got 3"),
    ],
)
def test_bad_parameters_are_400(triton: th.InferenceServerClient, params: dict[str, Any], message: str) -> None:
    with pytest.raises(th.InferenceServerException) as e:
        triton.infer("layernorm", [_input("input", np.ones((1, 2), np.float32))], parameters=params)
    assert e.value.status() == "400" and e.value.message() == message


def _counts(triton: th.InferenceServerClient, model: str) -> tuple[int, int, int, int]:
    (s,) = triton.get_inference_statistics(model, "1")["model_stats"]
    inf = s["inference_stats"]
    return s["inference_count"], s["execution_count"], inf["success"]["count"], inf["fail"]["count"]


@pytest.mark.parametrize("model", ["layernorm", "encoder"])
def test_statistics_count_exactly_the_calls(triton: th.InferenceServerClient, runtime: Runtime, model: str) -> None:
    d = runtime.get(model).config.d_model if model != "layernorm" else 4  # type: ignore[union-attr]
    x = np.ones((1, 2, d), np.float32)
    before = _counts(triton, model)
    for _ in range(3):
        triton.infer(model, [_input("input", x)])
    with pytest.raises(th.InferenceServerException):
        triton.infer(model, [_input("input", np.full((1, 2, d), np.nan, np.float32))])
    after = _counts(triton, model)
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 3, 3, 1]
    (s,) = triton.get_inference_statistics(model)["model_stats"]
    stages = s["inference_stats"]
    assert all(stages[k]["count"] == stages["success"]["count"] for k in ("queue", "compute_input", "compute_infer"))
    assert stages["compute_infer"]["ns"] > 0 and s["last_inference"] > 1.7e12  # ms since the epoch


def test_statistics_of_all_models_name_each_once(triton: th.InferenceServerClient, runtime: Runtime) -> None:
    stats = triton.get_inference_statistics()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [(m.name, m.version) for m in runtime.models]
    assert [(m.name, m.version) for m in runtime.models] == [
        ("encoder", "1"),
        ("encoder-preln", "1"),
        ("layernorm", "1"),
    ]
    # Every onnxruntime run is one execution, counted once (under batch size 1).
    assert all(sum(b["compute_infer"]["count"] for b in s["batch_stats"]) == s["execution_count"] for s in stats)


@pytest.mark.parametrize(("model", "shape"), [("layernorm", (6, 5, 4)), ("encoder", (3, 4, 128))])
def test_batch_stats_are_of_batch_size_one_as_the_config_says_max_batch_size_0(
    triton: th.InferenceServerClient, model: str, shape: tuple[int, ...]
) -> None:
    """An input's first dim is its own batch dim, not Triton's: Triton reports such a model's runs as batch size 1."""
    assert triton.get_model_config(model)["max_batch_size"] == 0
    triton.infer(model, [_input("input", np.ones(shape, np.float32))])
    (s,) = triton.get_inference_statistics(model)["model_stats"]
    assert [b["batch_size"] for b in s["batch_stats"]] == [1]
    assert s["batch_stats"][0]["compute_infer"]["count"] == s["execution_count"] > 0
