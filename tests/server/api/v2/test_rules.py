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
from app.settings import Settings

SETTINGS = Settings(max_depth=4, max_elements=1000)
READS = "(it reads eps, eps_mode, normalized_ndim; other names are ignored)"


def _refused(fn: Any, *args: Any) -> str:
    with pytest.raises(InvalidInput) as e:
        fn(*args)
    return e.value.message


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([1], "parameters: expected an object, got [1]"),
        ({"binary_data_output": 1}, "parameters.binary_data_output: expected true or false, got 1"),
        *(
            (
                {"alpha": 1, name: 1},
                f"parameters.{name}: unknown parameter for model 'layernorm'; did you mean {known!r}? {READS}",
            )
            for name, known in [
                ("epsilon", "eps"),  # difflib's ratio 0.6
                ("Eps", "eps"),  # the same name in another case
                ("EPS", "eps"),
                ("eps2", "eps"),
                ("mode", "eps_mode"),
                ("eps_mod", "eps_mode"),  # 0.93 to eps_mode, 0.6 to eps: the closer one is meant
                ("normalized-ndim", "normalized_ndim"),  # '-' for '_'
                ("norm", "normalized_ndim"),  # a prefix of it
            ]
        ),
    ],
    ids=lambda v: str(v) if isinstance(v, (list, dict)) else None,
)
def test_parameters_close_to_the_models_own_are_refused(runtime: Runtime, params: Any, message: str) -> None:
    assert _refused(rules.parameters, params, runtime.get("layernorm")) == message


@pytest.mark.parametrize(
    ("model", "params", "ignored"),
    [
        ("layernorm", {"eps": 1e-3, "priority": 2, "binary_data_output": True}, ()),
        ("layernorm", {"alpha": 1, "eps": 1e-3, "content_type": "np", "e": 2}, ("alpha", "content_type", "e")),
        ("layernorm", {"trace_id": "t1", "ndim": 2, "beta": [1]}, ("beta", "ndim", "trace_id")),
        ("encoder", {"eps": 1, "eps_mode": "std", "timeout": 5}, ("eps", "eps_mode")),  # an encoder reads none
    ],
    ids=["known", "far-from-eps", "far-from-all", "encoder"],
)
def test_other_parameters_pass_through_and_are_listed_as_ignored(
    runtime: Runtime, model: str, params: dict[str, Any], ignored: tuple[str, ...]
) -> None:
    assert rules.parameters(params, runtime.get(model)) == params
    assert rules.ignored(params, runtime.get(model)) == ignored


def test_no_parameters_are_none_ignored(runtime: Runtime) -> None:
    assert rules.parameters(None, runtime.get("layernorm")) == {}
    assert rules.ignored({}, runtime.get("layernorm")) == ()


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


def test_raw_bytes_must_fill_the_shape(runtime: Runtime) -> None:
    spec = runtime.get("layernorm").inputs[0]
    with pytest.raises(MalformedBody) as e:
        rules.from_raw(b"\0" * 8, spec, "FP32", [3], "inputs.input", "raw_input_contents")
    assert e.value.message == "inputs.input: raw_input_contents is 8 bytes, but shape [3] of FP32 needs 12"
    raw = np.arange(3, dtype=np.float32).tobytes()
    assert rules.from_raw(raw, spec, "FP32", [3], "f").tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\0\1\0\1", [[False, True], [False, True]]),
        (b"\0\2\xff\x80", [[False, True], [True, True]]),  # perf_analyzer's random bytes: nonzero is true, as in C
    ],
    ids=["zero-one", "any-nonzero"],
)
def test_raw_bool_bytes_are_true_when_nonzero(runtime: Runtime, raw: bytes, expected: list[list[bool]]) -> None:
    mask = runtime.get("encoder").inputs[1]
    flags = rules.from_raw(bytearray(raw), mask, "BOOL", [2, 2], "f")
    assert flags.dtype == np.bool_ and flags.tolist() == expected
    assert flags.view(np.uint8).max() <= 1  # each element is a real NumPy bool, whatever byte was sent
    assert flags.flags.writeable  # a copy, not the request's memory


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"eps": "0.001"}, {"eps": 0.001}),
        ({"eps": "1E-5", "normalized_ndim": "2"}, {"eps": 1e-5, "normalized_ndim": 2}),
        ({"eps": "+.5", "normalized_ndim": "-1"}, {"eps": 0.5, "normalized_ndim": -1}),  # -1: refused by the model
        ({"eps": "abc", "normalized_ndim": "2.0"}, {"eps": "abc", "normalized_ndim": "2.0"}),  # named by the model
        ({"eps": "nan"}, {"eps": "nan"}),
        ({"eps": "1e999"}, {"eps": "1e999"}),  # not finite: stays as sent
        ({"eps": " 0.1"}, {"eps": " 0.1"}),
        ({"eps": "\u0661e-3", "normalized_ndim": "\u0661"}, {"eps": "\u0661e-3", "normalized_ndim": "\u0661"}),
        ({"eps": "\uff11e-3", "normalized_ndim": "\uff12"}, {"eps": "\uff11e-3", "normalized_ndim": "\uff12"}),
        ({"eps_mode": "1"}, {"eps_mode": "1"}),  # a string parameter stays a string
        ({"sequence_id": "7"}, {"sequence_id": "7"}),  # the protocol's own: unread, unchanged
        ({"eps": 0.25, "normalized_ndim": 1}, {"eps": 0.25, "normalized_ndim": 1}),
    ],
)
def test_strings_that_spell_numbers_are_read_as_numbers_where_the_parameter_is_one(
    runtime: Runtime, params: dict[str, Any], expected: dict[str, Any]
) -> None:
    got = rules.parameters(params, runtime.get("layernorm"))
    assert got == expected and [type(v) for v in got.values()] == [type(v) for v in expected.values()]


def test_inline_elements_must_fill_the_shape() -> None:
    assert (
        _refused(rules.check_count, 5, [2, 3], "inputs.input.data")
        == "inputs.input.data: 5 elements, but shape [2, 3] needs 6"
    )
    rules.check_count(6, [2, 3], "inputs.input.data")


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
    ("datatype", "numbers", "expected"),
    [
        ("FP16", [0.1, 1000.3, 3], [0.0999755859375, 1000.5, 3.0]),  # the nearest FP16 values
        ("BF16", [0.1, 1000.3, 3], [0.10009765625, 1000.0, 3.0]),
        ("FP32", [0.1, 1000.3, 3], [0.1, 1000.3, 3.0]),  # as sent: the data plane casts it
    ],
)
def test_inline_numbers_are_rounded_to_a_half_type(datatype: str, numbers: list[float], expected: list[float]) -> None:
    arr = rules.from_numbers(np.array(numbers), datatype, "inputs.input")
    assert arr.astype(np.float64).tolist() == expected


def test_inline_numbers_beyond_the_half_range_are_refused_naming_the_tensor() -> None:
    message = _refused(rules.from_numbers, np.array([[1.0, -65520.0]]), "FP16", "inputs.gamma")
    assert message == "inputs.gamma: element [0, 1] = -65520 is outside float16's finite range (|x| <= 65504)"


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
