"""tritonclient.grpc and KServe's InferenceGRPCClient, unchanged, against a live server: every RPC, every model.

Answers are compared with the same request over HTTP (tritonclient.http on the same server) and with the
NumPy reference; errors with the HTTP message text, whole; after each error a valid request still answers.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from app import __version__
from app.core import reference
from app.core.model import Model
from app.core.runtime import Runtime
from app.errors import Timeout
from app.server.dataplane import INLINE_BODY_BYTES
from app.server.worker import Worker
from app.settings import Settings
from benchmarks.servers import ensure_peer_venv, peer_venv
from tests.live_server import MODELS as MODEL_DIR
from tests.live_server import ROOT
from tests.server import prometheus
from tests.server.api.v2.grpc.live import ADMIN, GrpcServer
from tests.server.stages import Stages

ENCODERS = ["encoder", "encoder-preln"]
MODELS = ["encoder", "encoder-preln", "layernorm"]
LN_OUTPUTS = ["output", "mean", "inv_std_dev"]
LN_ATOL = 2e-5  # the spec's 1e-5 fidelity plus float32 rounding of outputs near 1
DATATYPE = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(bool): "BOOL"}
Tensors = list[tuple[str, np.ndarray]]


@pytest.fixture(scope="module")
def http(live_grpc: GrpcServer) -> Any:
    client = th.InferenceServerClient(live_grpc.base.removeprefix("http://"), network_timeout=60)
    yield client
    client.close()


def grpc_inputs(tensors: Tensors, datatype: str | None = None) -> list[tg.InferInput]:
    out = []
    for name, arr in tensors:
        t = tg.InferInput(name, list(arr.shape), datatype or DATATYPE[arr.dtype])
        if datatype is None:
            t.set_data_from_numpy(arr)
        else:
            t._raw_content = arr.tobytes()  # tritonclient checks datatypes itself; the server must see the bad one
        out.append(t)
    return out


def http_inputs(tensors: Tensors, datatype: str | None = None) -> list[th.InferInput]:
    out = []
    for name, arr in tensors:
        t = th.InferInput(name, list(arr.shape), datatype or DATATYPE[arr.dtype])
        if datatype is None:
            t.set_data_from_numpy(arr, binary_data=True)
        else:
            t._raw_data = arr.tobytes()  # tritonclient.http checks datatypes itself; the server must see the bad one
            t._parameters = {"binary_data_size": arr.nbytes}
        out.append(t)
    return out


def both(triton: tg.InferenceServerClient, http: Any, model: str, tensors: Tensors, **kw: Any) -> tuple[Any, Any]:
    return triton.infer(model, grpc_inputs(tensors), **kw), http.infer(model, http_inputs(tensors), **kw)


def ln_reference(x: np.ndarray, k: int, eps: float, mode: str, gamma: Any = None, beta: Any = None) -> dict[str, Any]:
    ref = reference.layer_norm(x, k, eps, mode, gamma, beta)
    inv = 1 / np.sqrt(ref.var + eps) if mode == "var" else 1 / (np.sqrt(ref.var) + eps)
    return {"output": ref.output, "mean": ref.mean, "inv_std_dev": inv}


# ---- health, metadata, configuration ---------------------------------------------------------------------


def test_server_is_live_and_ready_and_names_itself(triton: tg.InferenceServerClient) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    meta = triton.get_server_metadata(as_json=True)
    assert meta == {
        "name": "normserve",
        "version": __version__,
        "extensions": ["parameters", "statistics", "model_configuration", "model_repository", "trace", "logging"],
    }


@pytest.mark.parametrize("model", MODELS)
def test_model_metadata_is_the_http_metadata(
    triton: tg.InferenceServerClient, live_grpc: GrpcServer, model: str
) -> None:
    assert triton.is_model_ready(model) and triton.is_model_ready(model, "1")
    got = triton.get_model_metadata(model, as_json=True)
    want = httpx.get(f"{live_grpc.base}/v2/models/{model}").json()
    for t in [*want["inputs"], *want["outputs"]]:
        t["shape"] = [str(d) for d in t["shape"]]  # protobuf's JSON writes int64 as strings
    assert got == want


@pytest.mark.parametrize("model", MODELS)
def test_model_config_is_tritons_with_the_models_tensors(
    triton: tg.InferenceServerClient, runtime: Runtime, model: str
) -> None:
    config = triton.get_model_config(model).config
    m = runtime.get(model)
    assert (config.name, config.platform, config.backend, config.max_batch_size) == (
        model,
        "onnxruntime_onnx",
        "onnxruntime",
        0,
    )
    types = {"FP32": "TYPE_FP32", "BOOL": "TYPE_BOOL"}
    got_inputs = [
        (i.name, tg.model_config_pb2.DataType.Name(i.data_type), list(i.dims), i.optional) for i in config.input
    ]
    assert got_inputs == [(s.name, types[s.datatypes[0]], list(s.shape), s.optional) for s in m.inputs]
    got_outputs = [(o.name, tg.model_config_pb2.DataType.Name(o.data_type), list(o.dims)) for o in config.output]
    assert got_outputs == [(s.name, types[s.datatypes[0]], list(s.shape)) for s in m.outputs]
    # data_type holds one datatype; the others every TYPE_FP32 tensor takes are listed, as over HTTP.
    assert config.parameters["datatypes"].string_value == "FP32,FP64,FP16,BF16"


def test_repository_index_lists_every_model_ready(triton: tg.InferenceServerClient) -> None:
    index = triton.get_model_repository_index(headers=ADMIN, as_json=True)
    assert index == {"models": [{"name": m, "version": "1", "state": "READY"} for m in MODELS]}


@pytest.mark.parametrize("action", ["load", "unload"])
def test_repository_load_and_unload_are_denied_without_explicit_model_control(
    triton: tg.InferenceServerClient, action: str
) -> None:
    call = triton.load_model if action == "load" else triton.unload_model
    with pytest.raises(InferenceServerException) as e:
        call("layernorm", headers=ADMIN)
    assert e.value.status() == "StatusCode.PERMISSION_DENIED"
    assert e.value.message() == (
        f"cannot {action} model 'layernorm': NORMSERVE_MODEL_CONTROL is 'none'; the repository API loads and "
        "unloads models only with NORMSERVE_MODEL_CONTROL=explicit"
    )


@pytest.mark.parametrize(("model", "version"), [("nope", ""), ("layernorm", "2"), ("encoder", "7")])
def test_model_ready_of_a_model_or_version_not_serving_is_false_not_an_error(
    triton: tg.InferenceServerClient, model: str, version: str
) -> None:
    """As Triton answers it: OK with ready false, so that tritonclient's is_model_ready() returns False."""
    assert triton.is_model_ready(model, version) is False
    assert triton.is_model_ready("layernorm", "1") is True


def shared_memory_message(extension: str) -> str:
    return (
        f"the {extension}_shared_memory extension is not supported: normserve reads every tensor from the request "
        "itself (binary data over HTTP, raw_input_contents over gRPC)"
    )


# (the call on tritonclient.grpc or tritonclient.http, the extension): both clients have the same methods.
SHARED_MEMORY_CALLS = [
    pytest.param(lambda c: c.get_system_shared_memory_status(), "system", id="system-status"),
    pytest.param(lambda c: c.get_system_shared_memory_status("r"), "system", id="system-region-status"),
    pytest.param(lambda c: c.register_system_shared_memory("r", "/key", 64), "system", id="system-register"),
    pytest.param(lambda c: c.unregister_system_shared_memory(), "system", id="system-unregister-all"),
    pytest.param(lambda c: c.unregister_system_shared_memory("r"), "system", id="system-unregister"),
    pytest.param(lambda c: c.get_cuda_shared_memory_status(), "cuda", id="cuda-status"),
    # the handle base64-encoded, as tritonclient wants it
    pytest.param(lambda c: c.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64), "cuda", id="cuda-register"),
    pytest.param(lambda c: c.unregister_cuda_shared_memory("r"), "cuda", id="cuda-unregister"),
]


@pytest.mark.parametrize(("call", "extension"), SHARED_MEMORY_CALLS)
def test_shared_memory_rpcs_are_unimplemented_naming_the_extension(
    triton: tg.InferenceServerClient, call: Callable[[Any], Any], extension: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        call(triton)
    assert (e.value.status(), e.value.message()) == ("StatusCode.UNIMPLEMENTED", shared_memory_message(extension))


@pytest.mark.parametrize(("call", "extension"), SHARED_MEMORY_CALLS)
def test_shared_memory_routes_are_400_naming_the_extension(
    http: Any, call: Callable[[Any], Any], extension: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        call(http)
    assert (e.value.status(), e.value.message()) == ("400", shared_memory_message(extension))


# ---- inference: the same answers as HTTP and as the reference --------------------------------------------


@pytest.mark.parametrize(
    ("shape", "k", "mode", "affine", "dtype"),
    [
        ((2, 3), 1, "var", False, np.float32),
        ((4, 5, 6), 2, "std", True, np.float32),
        ((3, 16), 1, "std", True, np.float64),
        ((7,), 1, "var", False, np.float32),
    ],
)
def test_layernorm_answers_as_http_and_the_reference(
    triton: tg.InferenceServerClient, http: Any, shape: tuple[int, ...], k: int, mode: str, affine: bool, dtype: Any
) -> None:
    rng = np.random.default_rng(len(shape) * 10 + k)
    x = (rng.standard_normal(shape) * 3 + 50).astype(dtype)
    tensors = [("input", x)]
    gamma = beta = None
    if affine:
        gamma, beta = rng.uniform(0.5, 2, shape[-k:]).astype(dtype), rng.uniform(-1, 1, shape[-k:]).astype(dtype)
        tensors += [("gamma", gamma), ("beta", beta)]
    params = {"eps": 1e-5, "eps_mode": mode, "normalized_ndim": k}
    got, over_http = both(triton, http, "layernorm", tensors, parameters=params, request_id="ln")
    want = ln_reference(x.astype(np.float32), k, 1e-5, mode, gamma, beta)
    assert got.get_response().id == "ln" and got.get_response().model_name == "layernorm"
    for name in LN_OUTPUTS:
        out = got.as_numpy(name)
        assert out.dtype == dtype and out.shape == want[name].shape
        np.testing.assert_array_equal(out, over_http.as_numpy(name))
        scale = 1.0 if gamma is None else float(np.abs(gamma).max())
        np.testing.assert_allclose(out, want[name], atol=LN_ATOL * scale * (1 if name == "output" else 1e3), rtol=1e-5)


@pytest.mark.parametrize("model", ENCODERS)
def test_encoders_answer_as_http_and_the_reference(
    triton: tg.InferenceServerClient, http: Any, runtime: Runtime, model: str
) -> None:
    m: Any = runtime.get(model)
    x = np.random.default_rng(3).standard_normal((2, 5, m.config.d_model)).astype(np.float32)
    mask = np.zeros((2, 5), bool)
    mask[1, 3:] = True
    got, over_http = both(triton, http, model, [("input", x), ("padding_mask", mask)])
    ref, _ = reference.encoder(x, m.weights, m.config, mask)
    assert [o.name for o in got.get_response().outputs] == m.output_names
    for name in m.output_names:
        np.testing.assert_array_equal(got.as_numpy(name), over_http.as_numpy(name))
    np.testing.assert_allclose(got.as_numpy("output"), ref, atol=1e-4)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_answer_as_plain_ones(triton: tg.InferenceServerClient, algorithm: str) -> None:
    x = np.random.default_rng(5).standard_normal((64, 128)).astype(np.float32)
    plain = triton.infer("layernorm", grpc_inputs([("input", x)]))
    packed = triton.infer("layernorm", grpc_inputs([("input", x)]), compression_algorithm=algorithm)
    np.testing.assert_array_equal(packed.as_numpy("output"), plain.as_numpy("output"))


def test_requested_outputs_come_in_the_order_asked(triton: tg.InferenceServerClient) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outputs = [tg.InferRequestedOutput("inv_std_dev"), tg.InferRequestedOutput("output")]
    result = triton.infer("layernorm", grpc_inputs([("input", x)]), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["inv_std_dev", "output"]
    np.testing.assert_allclose(result.as_numpy("output"), ln_reference(x, 1, 1e-5, "var")["output"], atol=LN_ATOL)


def test_a_stream_answers_each_request_in_order_and_an_error_in_its_message(
    triton: tg.InferenceServerClient, runtime: Runtime
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(6)]
    triton.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, x in enumerate(xs):
            triton.async_stream_infer("layernorm", grpc_inputs([("input", x)]), request_id=str(i))
            if i == 2:  # an invalid request in the middle of the stream
                triton.async_stream_infer(
                    "layernorm", grpc_inputs([("input", x)]), request_id="bad", parameters={"eps": 0}
                )
        e = np.zeros((1, 4, 128), np.float32)
        triton.async_stream_infer("encoder", grpc_inputs([("input", e)]), request_id="enc")
    finally:
        triton.stop_stream()
    got = [answers.get(timeout=30) for _ in range(len(xs) + 2)]
    ids = [r.get_response().id if r is not None else None for r, _ in got]
    assert ids == ["0", "1", "2", None, "3", "4", "5", "enc"]
    for (result, error), x in zip([g for g in got if g[0] is not None][:6], xs, strict=True):
        assert error is None
        np.testing.assert_allclose(result.as_numpy("output"), ln_reference(x, 1, 1e-5, "var")["output"], atol=LN_ATOL)
    _, error = got[3]
    assert error.message() == "parameters.eps: expected a finite number > 0, got 0"


def test_a_stream_loop_waiting_for_triton_final_response_gets_every_answer(triton: tg.InferenceServerClient) -> None:
    """Client loops of decoupled-aware code read responses until one carries triton_final_response, as Triton
    sets it on every stream response; without it such a loop waits for ever (bounded here by the queue's timeout)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    xs = {str(i): np.random.default_rng(i).standard_normal((2, 6)).astype(np.float32) for i in range(4)}
    triton.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, x in xs.items():
            triton.async_stream_infer("layernorm", grpc_inputs([("input", x)]), request_id=request_id)
            final = False
            while not final:
                result, error = answers.get(timeout=30)
                assert error is None
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                assert response.id == request_id
            want = ln_reference(x, 1, 1e-5, "var")["output"]
            np.testing.assert_allclose(result.as_numpy("output"), want, atol=LN_ATOL)
    finally:
        triton.stop_stream()
    assert answers.empty()


def test_statistics_are_the_ones_http_reports(triton: tg.InferenceServerClient, live_grpc: GrpcServer) -> None:
    before = triton.get_inference_statistics("layernorm", as_json=True)["model_stats"][0]
    for _ in range(3):
        triton.infer("layernorm", grpc_inputs([("input", np.ones((2, 4), np.float32))]))
    with pytest.raises(InferenceServerException):
        triton.infer("layernorm", grpc_inputs([("input", np.ones((2, 4), np.float32))]), parameters={"eps": -1})
    stats = triton.get_inference_statistics("layernorm")
    over_http = httpx.get(f"{live_grpc.base}/v2/models/layernorm/stats").json()
    assert json_format.MessageToDict(stats, preserving_proto_field_name=True, use_integers_for_enums=True)[
        "model_stats"
    ][0]["inference_count"] == str(over_http["model_stats"][0]["inference_count"])
    after = stats.model_stats[0]
    assert after.inference_count == int(before.get("inference_count", 0)) + 3
    assert after.inference_stats.fail.count == int(before["inference_stats"]["fail"].get("count", 0)) + 1
    every = triton.get_inference_statistics()
    assert [s.name for s in every.model_stats] == MODELS


# ---- errors: the HTTP message, whole; and the server still answers --------------------------------------

X23 = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], np.float32)
NAN = np.array([[1.0, np.nan, 2.0]], np.float32)
ERRORS = [
    pytest.param("gpt", [("input", X23)], {}, None, "StatusCode.NOT_FOUND", "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm", id="unknown-model"),
    pytest.param("layernorm", [("input", X23)], {}, "INT32", "StatusCode.INVALID_ARGUMENT", "inputs.input: datatype 'INT32' is not supported; expected FP32, FP64, FP16 or BF16", id="datatype"),
    pytest.param("layernorm", [("x", X23)], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.x: unknown input for model 'layernorm'; expected input, gamma, beta", id="input-name"),
    pytest.param("layernorm", [("gamma", X23[0])], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.input: required input missing for model 'layernorm'", id="missing-input"),
    pytest.param("layernorm", [("input", X23), ("gamma", X23[0, :2])], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.gamma: shape [2] does not match the normalized dims of inputs.input, [3]", id="gamma-shape"),
    pytest.param("layernorm", [("input", X23)], {"eps": -1}, None, "StatusCode.INVALID_ARGUMENT", "parameters.eps: expected a finite number > 0, got -1", id="eps"),
    pytest.param("layernorm", [("input", X23)], {"eps": "abc"}, None, "StatusCode.INVALID_ARGUMENT", "parameters.eps: expected a finite number > 0, got 'abc'", id="eps-not-a-number"),
    pytest.param("layernorm", [("input", X23)], {"eps": "1e999"}, None, "StatusCode.INVALID_ARGUMENT", "parameters.eps: expected a finite number > 0, got '1e999'", id="eps-string-overflows"),
    pytest.param("layernorm", [("input", X23)], {"eps": "-0.001"}, None, "StatusCode.INVALID_ARGUMENT", "parameters.eps: expected a finite number > 0, got -0.001", id="eps-string-negative"),
    pytest.param("layernorm", [("input", X23)], {"normalized_ndim": "2.0"}, None, "StatusCode.INVALID_ARGUMENT", "parameters.normalized_ndim: expected an integer in 1..2 (the input's rank), got '2.0'", id="normalized-ndim-string"),
    pytest.param("layernorm", [("input", X23)], {"eps_mode": "both"}, None, "StatusCode.INVALID_ARGUMENT", "parameters.eps_mode: expected 'var' or 'std', got 'both'", id="eps-mode"),
    pytest.param("layernorm", [("input", X23)], {"normalized_ndim": 3}, None, "StatusCode.INVALID_ARGUMENT", "parameters.normalized_ndim: expected an integer in 1..2 (the input's rank), got 3", id="normalized-ndim"),
    pytest.param("layernorm", [("input", X23)], {"epsilon": 1e-3}, None, "StatusCode.INVALID_ARGUMENT", "parameters.epsilon: unknown parameter for model 'layernorm'; did you mean 'eps'? (it reads eps, eps_mode, normalized_ndim; other names are ignored)", id="misspelt-parameter"),
    pytest.param("layernorm", [("input", NAN)], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.input: element [0, 1] = nan is outside float32's finite range (|x| <= 3.402823e+38)", id="nan"),
    pytest.param("encoder", [("input", np.zeros((1, 2, 3), np.float32))], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.input: last dimension is 3, expected d_model = 128", id="d-model"),
    pytest.param("encoder", [("input", np.zeros((4, 128), np.float32))], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.input: rank 2 (shape [4, 128]); expected [batch, seq, 128]", id="encoder-rank"),
    pytest.param("encoder", [("input", np.zeros((1, 2, 128), np.float32)), ("padding_mask", np.zeros((1, 3), bool))], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.padding_mask: shape [1, 3] does not match inputs.input's [batch, seq] = [1, 2]", id="mask-shape"),
    pytest.param("encoder", [("input", np.zeros((1, 513, 128), np.float32))], {}, None, "StatusCode.INVALID_ARGUMENT", "inputs.input: sequence length 513 exceeds max_sequence_length 512 (set at export: normserve export --max-sequence-length)", id="seq-len"),
    pytest.param("encoder-preln", [("input", np.tile(np.float32([1e20, -1e20]), (1, 1, 64)))], {}, None, "StatusCode.INVALID_ARGUMENT", "layers.0.norm1.std: the result is not finite in FP32 (it overflows); scale the input down", id="pre-ln-variance-overflow"),
]  # fmt: skip


def assert_still_answers(triton: tg.InferenceServerClient) -> None:
    result = triton.infer("layernorm", grpc_inputs([("input", X23)]))
    np.testing.assert_allclose(result.as_numpy("output"), ln_reference(X23, 1, 1e-5, "var")["output"], atol=LN_ATOL)


@pytest.mark.parametrize(("model", "tensors", "params", "datatype", "status", "message"), ERRORS)
def test_a_bad_request_gets_the_http_message_and_the_server_goes_on(
    triton: tg.InferenceServerClient,
    http: Any,
    model: str,
    tensors: Tensors,
    params: dict[str, Any],
    datatype: str | None,
    status: str,
    message: str,
) -> None:
    with pytest.raises(InferenceServerException) as over_grpc:
        triton.infer(model, grpc_inputs(tensors, datatype), parameters=params)
    with pytest.raises(InferenceServerException) as over_http:
        http.infer(model, http_inputs(tensors, datatype), parameters=params)
    assert (over_grpc.value.status(), over_grpc.value.message()) == (status, message)
    assert over_http.value.message() == message
    assert_still_answers(triton)


@pytest.mark.parametrize(
    ("params", "eps", "k"),
    [
        ({"eps": "0.001"}, 1e-3, 1),
        ({"eps": "1e-3", "eps_mode": "std"}, 1e-3, 1),
        ({"eps": ".25", "normalized_ndim": "2"}, 0.25, 2),
        ({"eps": "2"}, 2.0, 1),
    ],
    ids=["decimal", "exponent-std", "leading-dot-and-ndim", "integer"],
)
def test_numbers_sent_as_strings_are_read_as_numbers_over_grpc_and_http(
    triton: tg.InferenceServerClient, http: Any, params: dict[str, str], eps: float, k: int
) -> None:
    """KServe's and MLServer's gRPC parameters have no double: "0.001" is their only way to send eps."""
    x = np.random.default_rng(11).standard_normal((2, 3, 4)).astype(np.float32)
    got, over_http = both(triton, http, "layernorm", [("input", x)], parameters=params)
    want = ln_reference(x, k, eps, params.get("eps_mode", "var"))
    for name in LN_OUTPUTS:
        np.testing.assert_array_equal(got.as_numpy(name), over_http.as_numpy(name))
        np.testing.assert_allclose(got.as_numpy(name), want[name], atol=LN_ATOL * (1 if name == "output" else 1e3))
    assert "parameters" not in over_http.get_response()  # none ignored: eps was read


@pytest.mark.parametrize("params", [{"alpha": 1}, {"content_type": "np", "trace": "t1"}], ids=["one", "two"])
def test_unknown_parameters_are_ignored_and_http_answers_them_back(
    triton: tg.InferenceServerClient, http: Any, params: dict[str, Any]
) -> None:
    got, over_http = both(triton, http, "layernorm", [("input", X23)], parameters=params)
    assert over_http.get_response()["parameters"] == {"ignored_parameters": ",".join(sorted(params))}
    want = ln_reference(X23, 1, 1e-5, "var")
    for name in LN_OUTPUTS:
        np.testing.assert_array_equal(got.as_numpy(name), over_http.as_numpy(name))
        np.testing.assert_allclose(got.as_numpy(name), want[name], atol=LN_ATOL * (1 if name == "output" else 1e3))


def test_a_client_deadline_shorter_than_the_inference_is_deadline_exceeded(
    triton: tg.InferenceServerClient, live_grpc: GrpcServer
) -> None:
    x = np.zeros((8, 512, 128), np.float32)  # ~80 ms of encoder work on this machine, alone
    with pytest.raises(InferenceServerException) as e:
        triton.infer("encoder", grpc_inputs([("input", x)]), client_timeout=0.02, request_id="late")
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert live_grpc.request_line("late")["grpc_status"] == "DEADLINE_EXCEEDED"  # the server gave up too
    assert_still_answers(triton)


# ---- request ids, log lines, metrics --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_id", "metadata", "logged"),
    [("from-request", {}, "from-request"), ("", {"x-request-id": "from-metadata"}, "from-metadata"), ("a b", {}, None)],
)
def test_the_log_line_carries_the_request_id(
    triton: tg.InferenceServerClient,
    live_grpc: GrpcServer,
    request_id: str,
    metadata: dict[str, str],
    logged: str | None,
) -> None:
    result = triton.infer("layernorm", grpc_inputs([("input", X23)]), request_id=request_id, headers=metadata)
    assert result.get_response().id == request_id  # the answer's `id` is always the request's own
    if logged is None:  # not plain: a fresh id, as over HTTP
        return
    line = live_grpc.request_line(logged)
    assert {k: line[k] for k in ("method", "route", "status", "grpc_status", "model")} == {
        "method": "GRPC",
        "route": "/inference.GRPCInferenceService/ModelInfer",
        "status": 0,
        "grpc_status": "OK",
        "model": "layernorm",
    }
    assert line["bytes_in"] > X23.nbytes and line["bytes_out"] > 3 * X23.nbytes


def test_a_stream_messages_log_line_counts_the_bytes_of_its_answer(
    triton: tg.InferenceServerClient, live_grpc: GrpcServer
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    triton.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        triton.async_stream_infer("layernorm", grpc_inputs([("input", X23)]), request_id="streamed")
        result, error = answers.get(timeout=30)
    finally:
        triton.stop_stream()
    assert error is None and result.get_response().id == "streamed"
    line = live_grpc.request_line("streamed")
    assert (line["route"], line["grpc_status"]) == ("/inference.GRPCInferenceService/ModelStreamInfer", "OK")
    assert line["bytes_out"] > 3 * X23.nbytes


def test_metrics_count_calls_by_method_model_and_code(triton: tg.InferenceServerClient, live_grpc: GrpcServer) -> None:
    service = "inference.GRPCInferenceService"
    counted = {
        "unknown": {"service": service, "method": "ModelInfer", "model": "", "code": "NOT_FOUND"},
        "encoder": {"service": service, "method": "ModelInfer", "model": "encoder", "code": "OK"},
        "config": {"service": service, "method": "ModelConfig", "model": "layernorm", "code": "OK"},
    }
    with httpx.Client(base_url=live_grpc.base) as client:
        before = prometheus.scrape(client)
        with pytest.raises(InferenceServerException):
            triton.infer("gpt", grpc_inputs([("input", X23)]))
        triton.infer("encoder", grpc_inputs([("input", np.zeros((1, 2, 128), np.float32))]))
        triton.get_model_config("layernorm")
        after = prometheus.scrape_until_moved(client, before, "normserve_grpc_requests_total", 1, **counted["config"])
    for labels in counted.values():
        assert prometheus.delta(before, after, "normserve_grpc_requests_total", **labels) == 1, labels
    seconds = {"service": service, "method": "ModelInfer", "code": "OK"}
    assert prometheus.delta(before, after, "normserve_grpc_request_duration_seconds_count", **seconds) == 1


# ---- KServe's client ------------------------------------------------------------------------------------


def kserve_session(live_grpc: GrpcServer, binary: bool, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.server.api.v2.grpc.kserve_client", live_grpc.address, str(int(binary))]
    command += [] if parameters is None else [json.dumps(parameters)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


@pytest.mark.parametrize("binary", [True, False], ids=["raw_input_contents", "typed-contents"])
def test_kserves_grpc_client_reads_readiness_and_infers(live_grpc: GrpcServer, binary: bool) -> None:
    got = kserve_session(live_grpc, binary)
    assert (got["live"], got["ready"], got["model_ready"], got["id"]) == (True, True, True, "kserve")
    assert got["unknown_model_ready"] is False
    assert list(got["outputs"]) == LN_OUTPUTS
    want = ln_reference(X23, 1, 1e-5, "std")
    for name in LN_OUTPUTS:
        np.testing.assert_allclose(np.asarray(got["outputs"][name]), want[name], atol=LN_ATOL, rtol=1e-5)


@pytest.mark.parametrize(("eps", "mode"), [("0.001", "var"), ("0.25", "std")])
def test_kserves_grpc_client_sends_eps_as_the_string_it_can_send(live_grpc: GrpcServer, eps: str, mode: str) -> None:
    """KServe's client refuses a float parameter (InferParameter has no double): a string is its only way."""
    got = kserve_session(live_grpc, True, {"eps": eps, "eps_mode": mode})
    want = ln_reference(X23, 1, float(eps), mode)
    for name in LN_OUTPUTS:
        np.testing.assert_allclose(np.asarray(got["outputs"][name]), want[name], atol=LN_ATOL, rtol=1e-5)


def test_kserves_grpc_client_gets_a_string_that_is_no_number_refused_naming_the_parameter(
    live_grpc: GrpcServer,
) -> None:
    got = kserve_session(live_grpc, True, {"eps": "1e-3x"})
    assert got == {"code": "INVALID_ARGUMENT", "details": "parameters.eps: expected a finite number > 0, got '1e-3x'"}


@pytest.fixture(scope="module")
def mlserver_python() -> Path:
    """MLServer 1.7.1 in the benchmark's venv of its own (created once, about 2 minutes): it never enters ours."""
    ensure_peer_venv("mlserver")
    return peer_venv("mlserver") / "bin" / "python"


@pytest.mark.parametrize(
    ("parameters", "want"),
    [
        ({"eps": "0.001", "eps_mode": "std"}, {"sent": {"eps": "string_param", "eps_mode": "string_param"}, "eps": 1e-3}),
        ({"eps": "0.5"}, {"sent": {"eps": "string_param"}, "eps": 0.5}),
        ({"eps": "1e-3x"}, {"sent": {"eps": "string_param"}, "code": "INVALID_ARGUMENT", "details": "parameters.eps: expected a finite number > 0, got '1e-3x'"}),
    ],
    ids=["string-std", "string-var", "not-a-number"],
)  # fmt: skip
def test_mlservers_grpc_converters_send_eps_as_a_string_that_is_read_as_a_number(
    live_grpc: GrpcServer, mlserver_python: Path, parameters: dict[str, str], want: dict[str, Any]
) -> None:
    script = ROOT / "tests/server/api/v2/grpc/mlserver_client.py"
    command = [str(mlserver_python), str(script), live_grpc.address, json.dumps(parameters)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["sent"] == want["sent"]  # a string parameter, as MLServer's converter writes it
    if "code" in want:
        assert (got["code"], got["details"]) == (want["code"], want["details"])
        return
    assert got["id"] == "mlserver" and list(got["outputs"]) == LN_OUTPUTS
    ref = ln_reference(X23, 1, want["eps"], parameters.get("eps_mode", "var"))
    for name in LN_OUTPUTS:
        np.testing.assert_allclose(np.asarray(got["outputs"][name]), ref[name], atol=LN_ATOL, rtol=1e-5)


# ---- the effective timeout: min(NORMSERVE_REQUEST_TIMEOUT_S, the client's remaining deadline) ---------------


def sleeping(_: bytes) -> tuple[Model, Any, None]:
    """A decode stage that outlasts every bound the test sets: the request is answered before it returns."""
    time.sleep(0.5)
    raise AssertionError("the request was answered at its bound, before this stage ended")


@pytest.mark.parametrize(
    ("timeout_s", "deadline_s", "message"),
    [
        (0.05, 30.0, "inference took longer than 0.05 s (NORMSERVE_REQUEST_TIMEOUT_S)"),
        (30.0, 0.05, "inference took longer than the client's deadline (0.05 s)"),
        (0.05, None, "inference took longer than 0.05 s (NORMSERVE_REQUEST_TIMEOUT_S)"),
    ],
    ids=["request-timeout-first", "client-deadline-first", "no-deadline"],
)
def test_an_inference_ends_at_the_sooner_of_the_timeout_and_the_clients_deadline(
    timeout_s: float, deadline_s: float | None, message: str
) -> None:
    worker = Worker(Settings(model_dir=MODEL_DIR, request_timeout_s=timeout_s, grpc_port=0))
    worker.admission.ready = True
    started = time.monotonic()
    with pytest.raises(Timeout) as e:
        anyio.run(lambda: worker.plane.infer(Stages(sleeping, size=INLINE_BODY_BYTES + 1), b"", deadline_s=deadline_s))
    assert e.value.message == message
    assert time.monotonic() - started < 0.4  # it answered at the deadline, not when the work ended
