"""The gRPC codec in process: raw and typed contents into the data plane, the gRPC-only rules, raw outputs out.

The rules both transports share are tested once, in tests/server/api/v2/test_rules.py; here the same request
decoded by the HTTP codec and by this one must give the same data plane input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from app.core import reference
from app.core.halfprecision import HALF_DTYPES, narrow, ulp_errors, widen
from app.core.runtime import Runtime
from app.errors import ExtensionNotSupported, InvalidInput
from app.server.api.v2.grpc import codec
from app.server.api.v2.grpc.wire import serialize_infer
from app.server.api.v2.http import codec as http_codec
from app.settings import Settings

SETTINGS = Settings()
X = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], np.float32)


def request(
    model: str = "layernorm", tensors: list[tuple[str, str, list[int]]] | None = None, raw: list[bytes] | None = None
) -> Any:
    r = pb.ModelInferRequest(model_name=model, id="1")
    for name, datatype, shape in tensors if tensors is not None else [("input", "FP32", [2, 3])]:
        r.inputs.add(name=name, datatype=datatype, shape=shape)
    r.raw_input_contents.extend([X.tobytes()] if raw is None else raw)
    return r


def decode(runtime: Runtime, r: Any) -> Any:
    return codec.decode(pb.ModelInferRequest.FromString(r.SerializeToString()), runtime.get(r.model_name), SETTINGS)


def test_raw_input_decodes_as_the_http_binary_request_does(runtime: Runtime) -> None:
    r = request(tensors=[("input", "FP32", [2, 3]), ("gamma", "FP32", [3])], raw=[X.tobytes(), X[0].tobytes()])
    r.parameters["eps_mode"].string_param = "std"
    r.parameters["eps"].double_param = 1e-3
    over_grpc = decode(runtime, r)
    tensors = [
        {"name": n, "datatype": "FP32", "shape": s, "parameters": {"binary_data_size": b}}
        for n, s, b in (("input", [2, 3], 24), ("gamma", [3], 12))
    ]
    head = orjson.dumps({"id": "1", "inputs": tensors, "parameters": {"eps_mode": "std", "eps": 1e-3}})
    body = bytearray(head + X.tobytes() + X[0].tobytes())
    over_http = http_codec.decode(body, str(len(head)), runtime.get("layernorm"), SETTINGS)
    assert (over_grpc.id, over_grpc.datatype) == (over_http.id, over_http.datatype) == ("1", "FP32")
    assert over_grpc.outputs == [(n, False) for n in ("output", "mean", "inv_std_dev")]
    a, b = over_grpc.input, over_http.input
    assert (a.k, a.eps, a.eps_mode) == (b.k, b.eps, b.eps_mode) == (1, 1e-3, "std")
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.gamma, b.gamma)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("FP32", "fp32_contents", [0.5, -1.0, 2.0, 0.25, 3.0, 1.0], np.float32),
        ("FP64", "fp64_contents", [0.5, -1.0, 2.0, 0.25, 3.0, 1e-300], np.float64),
    ],
)
def test_typed_contents_decode_like_raw_bytes(
    runtime: Runtime, datatype: str, field: str, values: list[float], dtype: Any
) -> None:
    r = request(tensors=[("input", datatype, [2, 3])], raw=[])
    getattr(r.inputs[0].contents, field).extend(values)
    typed = decode(runtime, r)
    raw = decode(runtime, request(tensors=[("input", datatype, [2, 3])], raw=[np.asarray(values, dtype).tobytes()]))
    assert typed.datatype == raw.datatype == datatype
    np.testing.assert_array_equal(typed.input.x, raw.input.x)


def test_a_bool_mask_in_typed_contents_reaches_the_encoder(runtime: Runtime) -> None:
    x = np.zeros((1, 2, 128), np.float32)
    r = request("encoder", [("input", "FP32", [1, 2, 128]), ("padding_mask", "BOOL", [1, 2])], raw=[])
    r.inputs[0].contents.fp32_contents.extend(x.ravel().tolist())
    r.inputs[1].contents.bool_contents.extend([False, True])
    assert decode(runtime, r).input.padding_mask.tolist() == [[False, True]]


# The rules that exist in gRPC alone; every message whole.
ERRORS = [
    pytest.param(request(raw=[X.tobytes(), X.tobytes()]), "raw_input_contents: 2 for 1 inputs; expected one per input, in order, or none", id="raw-count"),
    pytest.param(request(raw=[X.tobytes()[:20]]), "inputs.input: raw_input_contents is 20 bytes, but shape [2, 3] of FP32 needs 24", id="raw-bytes"),
    pytest.param(request(raw=[]), "inputs.input: expected contents.fp32_contents, or raw_input_contents", id="no-data"),
    pytest.param(request(tensors=[], raw=[]), "inputs: expected a non-empty list of input tensors", id="no-inputs"),
    pytest.param(request(tensors=[("", "FP32", [2, 3])]), "inputs.: unknown input for model 'layernorm'; expected input, gamma, beta", id="empty-name"),
    pytest.param(request(tensors=[("input", "FP32", [-2, 3])]), "inputs.input: dimension 0 is -2 (shape [-2, 3]); every dimension needs >= 1", id="negative-dim"),
    pytest.param(request(tensors=[("input", "FP32", [])]), "inputs.input.shape: rank 0; expected 1..32 (NORMSERVE_MAX_DEPTH)", id="rank-0"),
    pytest.param(request(tensors=[("input", "FP32", [1 << 20, 1 << 10])]), "inputs.input: 1073741824 elements exceed the limit of 16777216 (NORMSERVE_MAX_ELEMENTS)", id="elements"),
]  # fmt: skip


@pytest.mark.parametrize(("r", "message"), ERRORS)
def test_a_request_breaking_a_rule_is_refused_with_its_field(runtime: Runtime, r: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        decode(runtime, r)
    assert e.value.message == message


@pytest.mark.parametrize(
    ("fill", "message"),
    [
        (
            lambda t: t.contents.fp64_contents.extend([1.0] * 6),
            "inputs.input.contents: fp64_contents cannot hold FP32; expected fp32_contents",
        ),
        (
            lambda t: t.contents.fp32_contents.extend([1.0] * 5),
            "inputs.input.contents.fp32_contents: 5 elements, but shape [2, 3] needs 6",
        ),
        (
            lambda t: setattr(t.parameters["binary_data"], "bool_param", True),
            "inputs.input: parameters {'binary_data': True} are not supported; "
            "only binary_data_size or content_type is",
        ),
    ],
    ids=["wrong-typed-field", "count", "unknown-parameter"],
)
def test_typed_contents_must_be_the_datatypes_field_and_fill_the_shape(
    runtime: Runtime, fill: Any, message: str
) -> None:
    r = request(raw=[])
    fill(r.inputs[0])
    if not r.inputs[0].HasField("contents"):
        r.raw_input_contents.append(X.tobytes())
    with pytest.raises(InvalidInput) as e:
        decode(runtime, r)
    assert e.value.message == message


@pytest.mark.parametrize("name", ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"])
def test_a_shared_memory_region_is_refused_naming_the_extension(runtime: Runtime, name: str) -> None:
    r = request(raw=[X.tobytes()])
    r.inputs[0].parameters[name].string_param = "region0"
    with pytest.raises(ExtensionNotSupported) as e:
        decode(runtime, r)
    assert e.value.message == (
        f"inputs.input.parameters.{name}: the system_shared_memory or cuda_shared_memory extension is not supported: "
        "normserve reads every tensor from the request itself (binary data over HTTP, raw_input_contents over gRPC)"
    )


def test_raw_and_typed_contents_together_are_refused(runtime: Runtime) -> None:
    r = request()
    r.inputs[0].contents.fp32_contents.extend(X.ravel().tolist())
    with pytest.raises(InvalidInput) as e:
        decode(runtime, r)
    assert e.value.message == "inputs.input: has both contents and raw_input_contents; send one"


@pytest.mark.parametrize(
    ("param", "value"),
    [("bool_param", True), ("int64_param", -3), ("string_param", "x"), ("double_param", 0.5), ("uint64_param", 7)],
)
def test_parameters_read_whichever_value_is_set(param: str, value: Any) -> None:
    r = pb.ModelInferRequest()
    setattr(r.parameters["p"], param, value)
    r.parameters["empty"].SetInParent()
    assert codec.parameter_values(r.parameters) == {"p": value, "empty": None}


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_outputs_go_raw_in_the_requests_datatype(runtime: Runtime, datatype: str) -> None:
    model = runtime.get("layernorm")
    x = X.astype({"FP32": np.float32, "FP64": np.float64}[datatype])
    req = decode(runtime, request(tensors=[("input", datatype, [2, 3])], raw=[x.tobytes()]))
    response = pb.ModelInferResponse.FromString(serialize_infer(codec.encode(model, req, model.infer(req.input))))
    assert (response.model_name, response.model_version, response.id) == ("layernorm", "1", "1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("output", datatype, [2, 3]),
        ("mean", datatype, [2]),
        ("inv_std_dev", datatype, [2]),
    ]
    got = np.frombuffer(response.raw_output_contents[1], x.dtype)
    np.testing.assert_allclose(got, [0.2, 0.23333333], rtol=1e-6)


@pytest.mark.parametrize(("final", "parameters"), [(True, {"triton_final_response": True}), (False, {})])
def test_a_stream_response_is_marked_final_as_tritons_are(
    runtime: Runtime, final: bool, parameters: dict[str, bool]
) -> None:
    model = runtime.get("layernorm")
    req = decode(runtime, request(tensors=[("input", "FP32", [2, 3])], raw=[X.astype(np.float32).tobytes()]))
    encoded = codec.encode(model, req, model.infer(req.input), final=final)
    response = pb.ModelInferResponse.FromString(serialize_infer(encoded))
    assert codec.parameter_values(response.parameters) == parameters
    assert len(response.raw_output_contents) == 3


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_raw_input_answers_raw_in_its_datatype(runtime: Runtime, datatype: str) -> None:
    model, half = runtime.get("layernorm"), narrow(X, datatype, "x")
    req = decode(runtime, request(tensors=[("input", datatype, [2, 3])], raw=[half.tobytes()]))
    np.testing.assert_array_equal(req.input.x, widen(half))  # widened exactly
    assert (req.datatype, req.input.dtype) == (datatype, datatype)
    response = pb.ModelInferResponse.FromString(serialize_infer(codec.encode(model, req, model.infer(req.input))))
    # the statistics in FP32, as onnxruntime's LayerNormalization types them
    assert [(o.name, o.datatype) for o in response.outputs] == [
        ("output", datatype),
        ("mean", "FP32"),
        ("inv_std_dev", "FP32"),
    ]
    assert [len(raw) for raw in response.raw_output_contents] == [12, 8, 8]  # 2 bytes per element, then 4
    output = np.frombuffer(response.raw_output_contents[0], HALF_DTYPES[datatype]).reshape(2, 3)
    truth = reference.layer_norm(widen(half), 1, 1e-5, "var").output
    assert float(ulp_errors(output, truth, datatype).max()) <= 1.0


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_fp32_contents_for_a_half_datatype_are_rounded_to_it(runtime: Runtime, datatype: str) -> None:
    r = request(tensors=[("input", datatype, [2, 3])], raw=[])
    r.inputs[0].contents.fp32_contents.extend(X.ravel().tolist())
    np.testing.assert_array_equal(decode(runtime, r).input.x, widen(narrow(X, datatype, "x")))


def test_an_output_datatype_asked_in_a_string_param_is_honoured(runtime: Runtime) -> None:
    model = runtime.get("layernorm")
    r = request()
    r.outputs.add(name="output").parameters["datatype"].string_param = "FP16"
    r.outputs.add(name="mean").parameters["datatype"].string_param = "FP64"
    req = decode(runtime, r)
    assert (req.input.dtype, req.output_datatypes) == ("FP16", {"output": "FP16", "mean": "FP64"})
    response = pb.ModelInferResponse.FromString(serialize_infer(codec.encode(model, req, model.infer(req.input))))
    assert [(o.name, o.datatype) for o in response.outputs] == [("output", "FP16"), ("mean", "FP64")]
    assert [len(raw) for raw in response.raw_output_contents] == [12, 16]
