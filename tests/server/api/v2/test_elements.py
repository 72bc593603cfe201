"""elements.py: an input's elements from JSON data, binary sections, raw bytes or typed contents; messages whole."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.core.model import TensorSpec
from app.core.runtime import Runtime
from app.errors import MalformedBody
from app.server.api.v2 import elements
from app.server.api.v2.request import Contents, Inline
from app.settings import Settings
from tests.server.api.v2.refusals import refused as _refused


def test_raw_bytes_must_fill_the_shape(runtime: Runtime) -> None:
    spec = runtime.get("layernorm").inputs[0]
    with pytest.raises(MalformedBody) as e:
        elements.from_raw(b"\0" * 8, spec, "FP32", [3], "inputs.input", "raw_input_contents")
    assert e.value.message == "inputs.input: raw_input_contents is 8 bytes, but shape [3] of FP32 needs 12"
    raw = np.arange(3, dtype=np.float32).tobytes()
    assert elements.from_raw(raw, spec, "FP32", [3], "f").tolist() == [0, 1, 2]


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
    flags = elements.from_raw(bytearray(raw), mask, "BOOL", [2, 2], "f")
    assert flags.dtype == np.bool_ and flags.tolist() == expected
    assert flags.view(np.uint8).max() <= 1  # each element is a real NumPy bool, whatever byte was sent
    assert flags.flags.writeable  # a copy, not the request's memory


def test_inline_elements_must_fill_the_shape() -> None:
    assert (
        _refused(elements.check_count, 5, [2, 3], "inputs.input.data")
        == "inputs.input.data: 5 elements, but shape [2, 3] needs 6"
    )
    elements.check_count(6, [2, 3], "inputs.input.data")


@pytest.mark.parametrize(
    ("datatype", "numbers", "expected"),
    [
        ("FP16", [0.1, 1000.3, 3], [0.0999755859375, 1000.5, 3.0]),  # the nearest FP16 values
        ("BF16", [0.1, 1000.3, 3], [0.10009765625, 1000.0, 3.0]),
        ("FP32", [0.1, 1000.3, 3], [0.1, 1000.3, 3.0]),  # as sent: the data plane casts it
    ],
)
def test_inline_numbers_are_rounded_to_a_half_type(datatype: str, numbers: list[float], expected: list[float]) -> None:
    arr = elements.from_numbers(np.array(numbers), datatype, "inputs.input")
    assert arr.astype(np.float64).tolist() == expected


def test_inline_numbers_beyond_the_half_range_are_refused_naming_the_tensor() -> None:
    message = _refused(elements.from_numbers, np.array([[1.0, -65520.0]]), "FP16", "inputs.gamma")
    assert message == "inputs.gamma: element [0, 1] = -65520 is outside float16's finite range (|x| <= 65504)"


TEXT = TensorSpec("text", ("BYTES",), (-1,))
TWO_TEXTS = (b"\x02\0\0\0hi" + b"\x03\0\0\0you", ["hi", "you"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (Inline("hi"), "inputs.text.data: 'hi'; expected a list of strings"),
        (Inline(["hi", 3]), "inputs.text.data[1]: 3; expected a string"),
        (Inline(["hi"]), "inputs.text.data: 1 elements, but shape [2] needs 2"),
        (None, "inputs.text: expected `data`, or parameters.binary_data_size with binary data"),
    ],
)
def test_json_strings_of_a_bytes_input_must_be_a_flat_list_filling_the_shape(data: Any, message: str) -> None:
    assert _refused(elements.of_body, data, {}, memoryview(b""), TEXT, ("BYTES", [2]), Settings(), True) == message


@pytest.mark.parametrize(
    ("data", "params", "binary"),
    [
        (Inline(TWO_TEXTS[1]), {}, b""),
        (None, {"binary_data_size": len(TWO_TEXTS[0])}, TWO_TEXTS[0]),
    ],
    ids=["json", "binary"],
)
def test_a_bytes_input_reads_as_texts_from_json_or_a_binary_section(data: Any, params: Any, binary: bytes) -> None:
    arr, taken = elements.of_body(data, params, memoryview(binary), TEXT, ("BYTES", [2]), Settings(), True)
    assert (arr.tolist(), taken) == (TWO_TEXTS[1], len(binary))


@pytest.mark.parametrize(
    ("data", "raw", "expected"),
    [
        (Contents({"bytes_contents": [b"hi", b"you"]}), None, TWO_TEXTS[1]),
        (None, TWO_TEXTS[0], TWO_TEXTS[1]),
        (Contents({"bytes_contents": [b"hi", b"\xff"]}), None, "inputs.text[1]: invalid UTF-8 at byte 0; expected UTF-8 text"),
        (Contents({"fp32_contents": [1.0, 2.0]}), None, "inputs.text.contents: fp32_contents cannot hold BYTES; expected bytes_contents"),
    ],
    ids=["typed", "raw", "typed-not-utf8", "typed-wrong-field"],
)  # fmt: skip
def test_a_bytes_input_over_grpc_reads_as_texts_from_typed_or_raw_contents(data: Any, raw: Any, expected: Any) -> None:
    if isinstance(expected, str):
        assert _refused(elements.of_message, data, raw, TEXT, ("BYTES", [2])) == expected
    else:
        assert elements.of_message(data, raw, TEXT, ("BYTES", [2])).tolist() == expected
