"""rules.py: the Open Inference Protocol's infer-request rules, once for HTTP and gRPC; every message whole."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from app.core.halfprecision import HALF_DTYPES
from app.core.runtime import Runtime
from app.errors import InvalidInput, MalformedBody
from app.server.api.v2 import rules
from app.server.api.v2.request import Contents, Inline, JsonHeader, V2Input, V2Output, V2Request
from app.settings import Settings
from tests.server.api.v2.refusals import refused as _refused

SETTINGS = Settings(max_depth=4, max_elements=1000)
READS = "(it reads eps, eps_mode, normalized_ndim; other names are ignored)"


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        (None, (), "inputs[0]: expected an object with a string `name`"),
        ("x", (), "inputs.x: unknown input for model 'layernorm'; expected input, gamma, beta"),
        ("input", ("input",), "inputs.input: given twice"),
    ],
)
def test_an_input_must_be_named_known_and_given_once(runtime: Runtime, name: Any, given: Any, message: str) -> None:
    assert _refused(rules.input_spec, name, 0, runtime.get("layernorm"), given) == message


@pytest.mark.parametrize(
    ("datatype", "shape", "message"),
    [
        ("INT8", [2], "inputs.input: datatype 'INT8' is not supported; expected FP32, FP64, FP16 or BF16"),
        ("FP32", "2x3", "inputs.input.shape: expected a list of integers, got '2x3'"),
        ("FP32", [True], "inputs.input.shape: expected a list of integers, got [True]"),
        ("FP32", [1, 1, 1, 1, 1], "inputs.input.shape: rank 5; expected 1..4 (NORMSERVE_MAX_DEPTH)"),
        ("FP32", [0, 3], "inputs.input: dimension 0 is empty (shape [0, 3]); every dimension needs >= 1"),
        ("FP32", [100, 11], "inputs.input: 1100 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)"),
    ],
)
def test_an_inputs_datatype_and_shape_keep_the_limits(
    runtime: Runtime, datatype: str, shape: Any, message: str
) -> None:
    spec = runtime.get("layernorm").inputs[0]
    assert _refused(rules.tensor_header, spec, datatype, shape, SETTINGS) == message


def test_a_valid_header_is_returned_as_given(runtime: Runtime) -> None:
    assert rules.tensor_header(runtime.get("layernorm").inputs[0], "FP64", [10, 100], SETTINGS) == ("FP64", [10, 100])


@pytest.mark.parametrize(
    ("params", "allowed", "message"),
    [
        (
            {"shm": 1},
            ("binary_data_size",),
            "inputs.input: parameters {'shm': 1} are not supported; only binary_data_size or content_type is",
        ),
        ({"shm": 1}, (), "inputs.input: parameters {'shm': 1} are not supported; only content_type is"),
        (
            [1],
            ("binary_data_size",),
            "inputs.input: parameters [1] are not supported; only binary_data_size or content_type is",
        ),
        ({"content_type": 1}, (), "inputs.input.parameters.content_type: expected a string, got 1"),
        (
            {"content_type": None},
            ("binary_data_size",),
            "inputs.input.parameters.content_type: expected a string, got None",
        ),
    ],
)
def test_an_inputs_parameters_are_the_transports_and_content_type_only(
    runtime: Runtime, params: Any, allowed: Any, message: str
) -> None:
    assert _refused(rules.tensor_parameters, params, runtime.get("layernorm").inputs[0], allowed) == message


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (None, ("binary_data_size",)),
        ({"binary_data_size": 12}, ("binary_data_size",)),
        ({"content_type": "np"}, ()),
        ({"binary_data_size": 12, "content_type": "str"}, ("binary_data_size",)),
    ],
)
def test_an_inputs_allowed_parameters_are_returned_as_given(runtime: Runtime, params: Any, allowed: Any) -> None:
    assert rules.tensor_parameters(params, runtime.get("layernorm").inputs[0], allowed) == (params or {})


@pytest.mark.parametrize(
    ("entries", "allowed", "message"),
    [
        ([("out", None)], (), "outputs[0]: unknown output 'out'; expected one of output, mean, inv_std_dev"),
        ([("mean", None), ("mean", None)], (), "outputs.mean: requested twice"),
        ([("mean", {"classification": 2})], (), "outputs.mean: parameters {'classification': 2} are not supported"),
        (
            [("mean", {"binary_data": "yes"})],
            ("binary_data",),
            "outputs.mean.parameters.binary_data: expected true or false, got 'yes'",
        ),
    ],
)
def test_requested_outputs_must_be_known_and_once(runtime: Runtime, entries: Any, allowed: Any, message: str) -> None:
    assert _refused(rules.requested_outputs, entries, runtime.get("layernorm"), False, allowed) == message


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], [("output", True), ("mean", True), ("inv_std_dev", True)]),
        ([("mean", {"binary_data": False}), ("output", None)], [("mean", False), ("output", True)]),
    ],
)
def test_requested_outputs_in_order_or_every_output(runtime: Runtime, entries: Any, expected: Any) -> None:
    assert rules.requested_outputs(entries, runtime.get("layernorm"), True, ("binary_data",)) == expected


def test_outputs_are_cast_to_the_requests_datatype_and_must_fit_it(runtime: Runtime) -> None:
    model = runtime.get("layernorm")
    x = np.array([[1.0, 2.0, 4.0]], np.float32)
    req = rules.InferRequest(None, rules_input(model, x), "FP32", [("mean", False), ("output", True)])
    out = list(rules.output_tensors(model, req, model.infer(req.input)))
    assert [(n, a.dtype, a.shape, b) for n, a, b in out] == [
        ("mean", np.float32, (1,), False),
        ("output", np.float32, (1, 3), True),
    ]


class _Float64Result:
    """A model kind whose float64 result does not fit float32: the cast must refuse it, naming the output."""

    def to_tensors(self, result: Any) -> dict[str, np.ndarray]:
        return {"output": np.array([1.0, 1e300])}


def test_an_output_that_does_not_fit_the_requests_datatype_is_refused() -> None:
    req = rules.InferRequest(None, None, "FP32", [("output", False)])
    with pytest.raises(InvalidInput) as e:
        list(rules.output_tensors(_Float64Result(), req, None))  # type: ignore[arg-type]
    hint = "scale the input or gamma down, or use a larger eps"
    assert e.value.message == f"outputs.output: the result is not finite in FP32 (it overflows); {hint}"
    fp64 = rules.InferRequest(None, None, "FP64", [("output", False)])
    ((_, arr, _),) = rules.output_tensors(_Float64Result(), fp64, None)  # type: ignore[arg-type]
    assert arr.dtype == np.float64


def rules_input(model: Any, x: np.ndarray) -> Any:
    return model.from_tensors({"input": x}, {}, rules.FIELDS)


# ---- half precision (issue 26) ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "message"),
    [
        ("INT8", "inputs.input: datatype 'INT8' is not supported; expected FP32, FP64, FP16 or BF16"),
        ("fp16", "inputs.input: datatype 'fp16' is not supported; expected FP32, FP64, FP16 or BF16"),
    ],
)
def test_a_datatype_the_spec_does_not_take_is_refused_listing_what_it_takes(
    runtime: Runtime, datatype: str, message: str
) -> None:
    spec = runtime.get("layernorm").inputs[0]
    assert _refused(rules.check_datatype, datatype, spec, "inputs.input") == message
    for taken in ("FP32", "FP64", "FP16", "BF16"):
        rules.check_datatype(taken, spec, "inputs.input")


@pytest.mark.parametrize(
    ("entries", "datatype", "expected"),
    [
        ([], "FP32", {}),
        (
            [("mean", {"datatype": "FP64"}), ("output", {"datatype": "BF16", "binary_data": True})],
            "FP32",
            {"mean": "FP64", "output": "BF16"},
        ),
        ([("output", None), ("inv_std_dev", {})], "FP64", {}),
        # a half-precision input's statistics: FP32, as onnxruntime's LayerNormalization types them; asked, as asked
        ([], "FP16", {"mean": "FP32", "inv_std_dev": "FP32"}),
        ([("output", None), ("inv_std_dev", {})], "BF16", {"mean": "FP32", "inv_std_dev": "FP32"}),
        ([("mean", {"datatype": "FP16"})], "FP16", {"mean": "FP16", "inv_std_dev": "FP32"}),
        ([("output", {"datatype": "FP32"})], "BF16", {"output": "FP32", "mean": "FP32", "inv_std_dev": "FP32"}),
    ],
)
def test_output_datatypes_are_read_from_each_outputs_parameters(
    runtime: Runtime, entries: Any, datatype: str, expected: dict[str, str]
) -> None:
    assert rules.output_datatypes(entries, runtime.get("layernorm"), datatype) == expected


def test_an_output_datatype_the_output_does_not_take_is_refused(runtime: Runtime) -> None:
    entries = [("output", {"datatype": "FP8"})]
    assert _refused(rules.output_datatypes, entries, runtime.get("layernorm"), "FP32") == (
        "outputs.output.parameters.datatype: datatype 'FP8' is not supported; expected FP32, FP64, FP16 or BF16"
    )


def test_each_output_goes_in_its_asked_datatype_else_the_inputs(runtime: Runtime) -> None:
    model = runtime.get("layernorm")
    x = np.array([[1.0, 2.0, 4.0]], np.float16)
    asked = {"output": "FP32", "inv_std_dev": "BF16"}
    req = rules.InferRequest(None, None, "FP16", [("output", False), ("mean", False), ("inv_std_dev", True)], (), asked)
    assert (req.dtype, req.datatype_of("mean")) == ("FP32", "FP16")
    req = dataclasses.replace(req, input=model.from_tensors({"input": x}, {}, rules.FIELDS, req.dtype))
    out = list(rules.output_tensors(model, req, model.infer(req.input)))
    assert [(n, a.dtype, b) for n, a, b in out] == [
        ("output", np.float32, False),
        ("mean", np.float16, False),
        ("inv_std_dev", HALF_DTYPES["BF16"], True),
    ]
    assert float(out[1][1][0]) == float(np.float16(7 / 3))  # the float64 mean, rounded once


def test_an_output_beyond_its_half_range_is_refused_naming_it() -> None:
    req = rules.InferRequest(None, None, "FP16", [("output", False)])
    assert _refused(list, rules.output_tensors(_Float64Result(), req, None)) == (  # type: ignore[arg-type]
        "outputs.output: element [1] = 1e+300 is outside float16's finite range (|x| <= 65504)"
    )


# ---- decode: one V2Request, every rule in one pass (issue 34) -------------------------------------------------------

X = np.array([[1.0, 2.0, 4.0], [0.5, 0.25, 8.0]], np.float32)
X_DATA = X.ravel().tolist()


def _in(name: Any = "input", data: Any = X_DATA, datatype: str = "FP32", shape: Any = (2, 3), **fields: Any) -> V2Input:
    """An input with its elements inline (HTTP's JSON `data`), or none (None: raw bytes or a binary section)."""
    return V2Input(name, datatype, list(shape), fields.get("parameters"), None if data is None else Inline(data))


def _raw(name: str = "input", **fields: Any) -> V2Input:
    return _in(name, None, **fields)


def http(*inputs: V2Input, binary: bytes = b"", **fields: Any) -> V2Request:
    """As the HTTP codec reads a body: the binary part after its JSON header, outputs that may go binary."""
    return V2Request(fields.pop("id", None), fields.pop("parameters", None), inputs, binary=memoryview(binary),
                     binary_outputs=True, **fields)  # fmt: skip


def grpc(*inputs: V2Input, raw: tuple[bytes, ...] = (), **fields: Any) -> V2Request:
    """As the gRPC codec reads a ModelInferRequest: raw_input_contents beside the inputs, every output raw."""
    return V2Request(fields.pop("id", None), fields.pop("parameters", {}), inputs, raw=raw, **fields)


def _fp32s(*values: float) -> Contents:
    return Contents({"fp32_contents": list(values)})


@pytest.mark.parametrize(
    ("model", "request_", "message"),
    [
        ("layernorm", http(_in(), model_name="encoder"), "model_name: 'encoder' is not the model of the URL, 'layernorm'"),
        ("layernorm", http(_in(), model_version="2"), "model_version: '2' is not the version that serves this request, 1"),
        ("layernorm", http(_in(), parameters=[1]), "parameters: expected an object, got [1]"),
        ("layernorm", http(), "inputs: expected a non-empty list of input tensors"),
        ("layernorm", http(_in(None)), "inputs[0]: expected an object with a string `name`"),
        ("layernorm", http(_in("x")), "inputs.x: unknown input for model 'layernorm'; expected input, gamma, beta"),
        ("layernorm", http(_in(), _in()), "inputs.input: given twice"),
        ("layernorm", http(_in(datatype="INT8")), "inputs.input: datatype 'INT8' is not supported; expected FP32, FP64, FP16 or BF16"),
        ("layernorm", http(V2Input("input", "FP32", "2x3", None, Inline(X_DATA))), "inputs.input.shape: expected a list of integers, got '2x3'"),
        ("layernorm", http(_in(parameters={"shm": 1})), "inputs.input: parameters {'shm': 1} are not supported; only binary_data_size or content_type is"),
        ("layernorm", http(_in(data=None)), "inputs.input: expected `data`, or parameters.binary_data_size with binary data"),
        ("layernorm", http(_in(data=[1, 2])), "inputs.input.data: 2 elements, but shape [2, 3] needs 6"),
        ("layernorm", http(_in(data=[1, 2, 3, 4, 5, True])), "inputs.input.data: booleans are not numbers; expected an array of numbers"),
        ("layernorm", http(_in(parameters={"binary_data_size": 24})), "inputs.input: has both `data` and parameters.binary_data_size; send one"),
        ("layernorm", http(_in(data=None, parameters={"binary_data_size": -1})), "inputs.input.parameters.binary_data_size: expected a byte count, got -1"),
        ("layernorm", http(_in(data=None, parameters={"binary_data_size": 24}), binary=X.tobytes()[:20]), "inputs.input.parameters.binary_data_size: 24 bytes declared, but only 20 follow (is Inference-Header-Content-Length set?)"),
        ("layernorm", http(_in(data=None, parameters={"binary_data_size": 20}), binary=X.tobytes()[:20]), "inputs.input.parameters.binary_data_size: binary_data_size is 20 bytes, but shape [2, 3] of FP32 needs 24"),
        ("layernorm", http(_in(), binary=b"\0" * 4), "binary_data_size: the inputs' binary_data_size add up to 0 bytes, but 4 follow the JSON header"),
        ("layernorm", http(_in("gamma", shape=[3], data=[1, 1, 1])), "inputs.input: required input missing for model 'layernorm'"),
        ("layernorm", http(_in(), outputs=None), "outputs: expected a list of {name, parameters}"),
        ("layernorm", http(_in(), outputs=[V2Output("out")]), "outputs[0]: unknown output 'out'; expected one of output, mean, inv_std_dev"),
        ("layernorm", http(_in(), outputs=[V2Output("mean", {"binary_data": "yes"})]), "outputs.mean.parameters.binary_data: expected true or false, got 'yes'"),
        ("layernorm", http(_in(), outputs=[V2Output("mean", {"datatype": "FP8"})]), "outputs.mean.parameters.datatype: datatype 'FP8' is not supported; expected FP32, FP64, FP16 or BF16"),
        ("layernorm", http(_in(), parameters={"eps": -1}), "parameters.eps: expected a finite number > 0, got -1"),
        ("encoder", http(_in(shape=[1, 2, 3])), "inputs.input: last dimension is 3, expected d_model = 128 (model 'encoder', version 1)"),
        ("layernorm", grpc(_raw(), raw=(X.tobytes(), X.tobytes())), "raw_input_contents: 2 for 1 inputs; expected one per input, in order, or none"),
        ("layernorm", grpc(_raw()), "inputs.input: expected contents.fp32_contents, or raw_input_contents"),
        ("layernorm", grpc(_raw(), raw=(X.tobytes()[:8],)), "inputs.input: raw_input_contents is 8 bytes, but shape [2, 3] of FP32 needs 24"),
        ("layernorm", grpc(V2Input("input", "FP32", [2, 3], None, _fp32s(1)), raw=(X.tobytes(),)), "inputs.input: has both contents and raw_input_contents; send one"),
        ("layernorm", grpc(V2Input("input", "FP64", [2, 3], None, _fp32s(1))), "inputs.input.contents: fp32_contents cannot hold FP64; expected fp64_contents"),
        ("layernorm", grpc(V2Input("input", "FP32", [2, 3], None, _fp32s(1))), "inputs.input.contents.fp32_contents: 1 elements, but shape [2, 3] needs 6"),
        ("layernorm", grpc(_raw(), raw=(X.tobytes(),), outputs=[V2Output("mean", {"binary_data": True})]), "outputs.mean: parameters {'binary_data': True} are not supported; only datatype is"),
    ],
)  # fmt: skip
def test_decode_names_the_first_broken_rule_whole(
    runtime: Runtime, model: str, request_: V2Request, message: str
) -> None:
    with pytest.raises((InvalidInput, MalformedBody)) as e:
        rules.decode(request_, runtime.get(model), SETTINGS)
    assert e.value.message == message


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        # each rule in the order of the request: the body's model, parameters, inputs, outputs, then repeated keys
        (http(_in("x"), parameters=[1], model_name="encoder"), "model_name: 'encoder' is not the model of the URL, 'layernorm'"),
        (http(_in("x"), parameters=[1]), "parameters: expected an object, got [1]"),
        (http(_in("x"), _in(datatype="INT8"), outputs=None), "inputs.x: unknown input for model 'layernorm'; expected input, gamma, beta"),
        (http(_in(), outputs=None, json=JsonHeader(b'{"a": 1, "a": 2}', 16, False)), "outputs: expected a list of {name, parameters}"),
        (http(_in(), json=JsonHeader(b'{"a": 1, "a": 2}', 16, False)), "a: given more than once in one object; send each field once"),
        (http(_in(), parameters={"eps": -1}, json=JsonHeader(b'{"a": 1, "a": 2}', 16, False)), "a: given more than once in one object; send each field once"),
        (http(_in(data=None, parameters={"binary_data_size": 99}), _in("gamma", datatype="INT8"), binary=b"\0"), "inputs.input.parameters.binary_data_size: 99 bytes declared, but only 1 follow (is Inference-Header-Content-Length set?)"),
        (grpc(_raw("x"), raw=(b"", b""), parameters=[1]), "parameters: expected an object, got [1]"),
        (grpc(_raw("x"), raw=(b"", b"")), "raw_input_contents: 2 for 1 inputs; expected one per input, in order, or none"),
    ],
)  # fmt: skip
def test_decode_names_the_mistakes_in_the_order_of_the_request(
    runtime: Runtime, request_: V2Request, message: str
) -> None:
    with pytest.raises((InvalidInput, MalformedBody)) as e:
        rules.decode(request_, runtime.get("layernorm"), SETTINGS)
    assert e.value.message == message


G = np.array([2.0, 1.0, 0.5], np.float32)
PARAMS = {"eps": "0.001", "eps_mode": "std", "binary_data_output": True, "trace_id": "t"}


@pytest.mark.parametrize(
    ("request_", "binary"),
    [
        (http(_in(), _in("gamma", G.tolist(), shape=[3]), id="r", parameters=PARAMS), True),
        (http(_in(data=None, parameters={"binary_data_size": 24}), _in("gamma", None, shape=[3], parameters={"binary_data_size": 12}),
              binary=X.tobytes() + G.tobytes(), id="r", parameters=PARAMS), True),
        (grpc(_raw(), _raw("gamma", shape=[3]), raw=(X.tobytes(), G.tobytes()), id="r", parameters=PARAMS), False),
        (grpc(V2Input("input", "FP32", [2, 3], None, _fp32s(*X.ravel())), V2Input("gamma", "FP32", [3], None, _fp32s(*G)),
              id="r", parameters=PARAMS), False),
    ],
    ids=["http-json", "http-binary", "grpc-raw", "grpc-typed"],
)  # fmt: skip
def test_decode_reads_one_request_alike_from_every_transport(
    runtime: Runtime, request_: V2Request, binary: bool
) -> None:
    """binary_data_output sends every output binary over HTTP; gRPC sends every output raw whatever it says."""
    req = rules.decode(request_, runtime.get("layernorm"), SETTINGS)
    assert (req.id, req.datatype, req.ignored, req.output_datatypes) == ("r", "FP32", ("trace_id",), {})
    assert req.outputs == [("output", binary), ("mean", binary), ("inv_std_dev", binary)]
    assert (req.input.eps, req.input.eps_mode, req.input.k) == (0.001, "std", 1)
    np.testing.assert_array_equal(req.input.x, X)
    np.testing.assert_array_equal(req.input.gamma, G)


def test_decode_keeps_a_binary_input_a_view_of_the_body(runtime: Runtime) -> None:
    body = bytearray(X.tobytes())
    request_ = http(_in(data=None, parameters={"binary_data_size": 24}), binary=b"")
    req = rules.decode(request_._replace(binary=memoryview(body)), runtime.get("layernorm"), SETTINGS)
    assert np.shares_memory(req.input.x, np.frombuffer(body, np.uint8))  # no copy of a large tensor
