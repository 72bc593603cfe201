"""JSON and binary tensor codecs: every malformed tensor is an InvalidInput that names the field."""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest

from app.core.tensors import (
    DATATYPES,
    FLOAT32_MAX,
    binary_view,
    collector_paused,
    decode_binary,
    decode_json_tensor,
    encode_json_tensor,
    loads,
    to_finite_float,
)
from app.errors import InvalidInput, MalformedBody


def decode(value: Any, **kw: Any) -> np.ndarray:
    """As a request's tensor goes: decoded, then cast to float32 by the data plane's input."""
    arr = decode_json_tensor(value, "data", max_elements=kw.pop("max_elements", 1000), max_depth=8, **kw)
    return arr if arr.dtype == np.bool_ else to_finite_float(arr, "data")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param([[1, 2, 3], [4, 5]], "data: row 1 has 2 elements, expected 3", id="ragged"),
        pytest.param(
            [[1, 2], [3, 4], [5, 6], [7, 8, 9, 0, 1]], "data: row 3 has 5 elements, expected 2", id="ragged-row3"
        ),
        pytest.param([[[1], [2]], [[3], [4, 5]]], "data: row [1, 1] has 2 elements, expected 1", id="ragged-3d"),
        pytest.param(2.5, "rank >= 1, got a scalar", id="rank0"),
        pytest.param([], "dimension 0 is empty", id="empty"),
        pytest.param([[], []], "dimension 1 is empty", id="empty-inner"),
        pytest.param([1, "2"], "element [1] is a string, expected a number", id="string"),
        pytest.param(["1", "2"], "element [0] is a string, expected a number", id="all-strings"),
        pytest.param([1, None], "element [1] is null", id="null"),
        pytest.param([True, False], "booleans are not numbers", id="all-bools"),
        pytest.param([1.5, True], "booleans are not numbers", id="mixed-bool"),
        pytest.param([[1, {"a": 1}]], "element [0, 1] is an object", id="object"),
        pytest.param([[1, 2], 3], "row 1 is a number, expected an array of 2", id="number-for-row"),
        pytest.param([1e39], "element [0] = 1e+39 is outside float32's finite range", id="float32-overflow"),
        pytest.param([[[[[[[[[1]]]]]]]]], "nesting deeper than 8 (NORMSERVE_MAX_DEPTH)", id="too-deep"),
        pytest.param([0.0] * 1001, "1001 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)", id="too-many"),
    ],
)
def test_bad_json_tensor_is_invalid_input_naming_the_problem(value: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        decode(value)
    assert message in str(e.value)
    assert str(e.value).startswith("data: ")


@pytest.mark.parametrize(
    ("value", "shape"),
    [([1, 2, 3], (3,)), ([[0.5, -1e-3]], (1, 2)), ([[[1]], [[2]]], (2, 1, 1)), ([3.4e38, -3.4e38], (2,))],
)
def test_good_json_tensor_becomes_float32(value: Any, shape: tuple[int, ...]) -> None:
    arr = decode(value)
    assert arr.dtype == np.float32 and arr.shape == shape
    np.testing.assert_allclose(arr, np.asarray(value, dtype=np.float64), rtol=1e-7)


def test_bool_tensor_for_masks() -> None:
    mask = decode([[True, False]], boolean=True)
    assert mask.dtype == np.bool_ and mask.tolist() == [[True, False]]
    with pytest.raises(InvalidInput, match="expected an array of booleans"):
        decode([[1, 0]], boolean=True)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([[True, None]], "element [0, 1] is null, expected a boolean"),
        ([[True, "no"]], "expected an array of booleans (true/false)"),
        ([[True, [False]]], "element [0, 1] is an array, expected a boolean"),
        ([[True], [True, False]], "row 1 has 2 elements, expected 1"),
    ],
    ids=["null", "string", "array", "ragged"],
)
def test_a_bool_tensor_names_what_is_not_a_boolean(value: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        decode(value, boolean=True)
    assert str(e.value) == f"data: {message}"


def _rows(n: int, **changes: Any) -> list[Any]:
    """n rows of two numbers, with the rows (or elements, at "row.column") that `changes` names replaced."""
    rows: list[Any] = np.arange(2 * n, dtype=np.float64).reshape(n, 2).tolist()
    for where, value in changes.items():
        row, _, column = where.removeprefix("r").partition("_")
        if column:
            rows[int(row)][int(column)] = value
        else:
            rows[int(row)] = value
    return rows


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (_rows(100_000, r99999=[1.0], r0_1="a"), "row 99999 has 1 elements, expected 2"),
        (_rows(100_000, r99999=7, r0_1=None), "row 99999 is a number, expected an array of 2"),
        (_rows(100_000, r70000_0=None), "element [70000, 0] is null, expected a number"),
        (_rows(100_000, r99998_1=2**64), "element [99998, 1] is an integer outside 64 bits, expected a float32 number"),
        (_rows(100_000, r5_0=1e30, r6_1=1e30, r80000_1="x"), "element [80000, 1] is a string, expected a number"),
        (_rows(100_000, r90000_0=True), "booleans are not numbers; expected an array of numbers"),
        (_rows(100_000, r3_1=[2.0]), "element [3, 1] is an array, expected a number"),
        ([_rows(50_000), _rows(50_000, r49999=[])], "row [1, 49999] has 0 elements, expected 2"),
    ],
    ids=[
        "short-row-before-string",
        "number-row-before-null",
        "null",
        "big-int",
        "string-after-large-floats",
        "boolean",
        "array-element",
        "3d-empty-row",
    ],
)
def test_a_large_tensor_names_its_first_problem_level_by_level(value: Any, message: str) -> None:
    """Level by level: a wrong row anywhere is named before a wrong element in an earlier row."""
    with pytest.raises(InvalidInput) as e:
        decode_json_tensor(value, "data", max_elements=10**6, max_depth=8)
    assert str(e.value) == f"data: {message}"


@pytest.mark.parametrize("enabled", [True, False], ids=["collector-on", "collector-off"])
def test_collector_paused_restores_the_collector_once_the_last_thread_leaves(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        inside, leave = threading.Event(), threading.Event()

        def hold() -> None:
            with collector_paused():
                inside.set()
                leave.wait(10)

        other = threading.Thread(target=hold)
        other.start()
        assert inside.wait(10)
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the other thread is still inside
        leave.set()
        other.join(10)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("body", [b"[NaN]", b'{"data": [Infinity]}', b'{"data": [1e400]}', b"{", b"\xff"])
def test_json_that_is_not_json_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedBody):
        loads(body)


def test_deep_nesting_is_malformed_not_a_crash() -> None:
    with pytest.raises(MalformedBody, match="depth"):
        loads(b"[" * 150_000 + b"]" * 150_000)


@pytest.mark.parametrize("dtype", ["FP32", "FP64", "INT64", "BOOL"])
def test_binary_round_trip(dtype: str) -> None:
    arr = (np.arange(24).reshape(2, 3, 4) % 3).astype(
        {"FP32": "<f4", "FP64": "<f8", "INT64": "<i8", "BOOL": "?"}[dtype]
    )
    raw = bytes(binary_view(arr))
    back = decode_binary(memoryview(raw), dtype, [2, 3, 4], "input")
    np.testing.assert_array_equal(back, arr)


def test_binary_size_mismatch_is_malformed() -> None:
    with pytest.raises(MalformedBody, match="binary_data_size is 20 bytes, but shape \\[2, 3\\] of FP32 needs 24"):
        decode_binary(memoryview(b"\0" * 20), "FP32", [2, 3], "input")


def test_encode_json_tensor_gives_bare_number_for_rank0() -> None:
    assert encode_json_tensor(np.float64(2.5) * np.ones(())) == 2.5


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_binary_is_two_bytes_per_element_both_ways(datatype: str) -> None:
    x = np.array([[1.0, -2.5], [0.099975586, 65504.0]], np.float32).astype(DATATYPES[datatype])
    raw = bytes(binary_view(x))
    assert len(raw) == 8
    np.testing.assert_array_equal(
        decode_binary(raw, datatype, [2, 2], "inputs.input").view(np.uint16), x.view(np.uint16)
    )
    with pytest.raises(MalformedBody) as e:
        decode_binary(raw[:7], datatype, [2, 2], "inputs.input")
    assert str(e.value) == f"inputs.input: binary_data_size is 7 bytes, but shape [2, 2] of {datatype} needs 8"


CAST_LIMIT = 2.0**128 - 2.0**103  # FLOAT32_MAX plus half its spacing: the first float64 that rounds to inf
BELOW = float(np.nextafter(CAST_LIMIT, 0.0))


@pytest.mark.parametrize(
    ("values", "dtype", "expected"),
    [
        pytest.param([BELOW, -BELOW], np.float64, [FLOAT32_MAX, -FLOAT32_MAX], id="float64-rounding-to-max"),
        pytest.param([0.1, -2.5], np.float64, [np.float32(0.1), -2.5], id="float64"),
        pytest.param([FLOAT32_MAX, -FLOAT32_MAX], np.float32, [FLOAT32_MAX, -FLOAT32_MAX], id="float32-max"),
        pytest.param([2**63 - 1, -(2**63)], np.int64, [2.0**63, -(2.0**63)], id="int64"),
        pytest.param([2**64 - 1], np.uint64, [2.0**64], id="uint64"),
    ],
)
def test_every_value_that_rounds_to_a_finite_float32_is_taken(
    values: list[float], dtype: type[np.generic], expected: list[float]
) -> None:
    out = to_finite_float(np.array(values, dtype), "data")
    assert out.dtype == np.float32 and out.tolist() == expected


@pytest.mark.parametrize(
    ("values", "dtype", "message"),
    [
        pytest.param([1.0, CAST_LIMIT], np.float64, f"element [1] = {CAST_LIMIT} is outside", id="float64-at-limit"),
        pytest.param([-CAST_LIMIT, 1.0], np.float64, f"element [0] = {-CAST_LIMIT} is outside", id="float64-negative"),
        pytest.param([1.0, np.nan], np.float64, "element [1] = nan is outside", id="float64-nan"),
        pytest.param([np.inf], np.float32, "element [0] = inf is outside", id="float32-inf"),
        pytest.param([0.0, -np.inf], np.float32, "element [1] = -inf is outside", id="float32-negative-inf"),
    ],
)
def test_a_value_that_rounds_past_float32_is_refused_by_its_index(
    values: list[float], dtype: type[np.generic], message: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        to_finite_float(np.array(values, dtype), "data")
    assert str(e.value) == f"data: {message} float32's finite range (|x| <= 3.402823e+38)"
