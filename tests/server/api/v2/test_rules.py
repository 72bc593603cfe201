"""rules.py: the Open Inference Protocol's infer-request rules, once for HTTP and gRPC; every message whole."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from app.core.halfprecision import HALF_DTYPES
from app.core.runtime import Runtime
from app.errors import InvalidInput
from app.server.api.v2 import rules
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
