"""The simdjson fast path: the same arrays as orjson + NumPy, and a fallback for everything it is unsure of."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest

from app.core import jsontensors
from app.core.rowshape import Ragged
from app.core.tensors import decode_json_tensor, to_finite_float
from app.errors import InvalidInput


def _data(path: tuple[str | int, ...]) -> bool:
    return path == ("data",)


def _v2(path: tuple[str | int, ...]) -> bool:
    return len(path) == 3 and path[0] == "inputs" and path[2] == "data"


def _slow(value: Any) -> np.ndarray:
    return to_finite_float(decode_json_tensor(value, "data", max_elements=10**8, max_depth=32), "data")


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2, 3]",
        "[[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]",
        "[[[1e-45, -0.0, 3.4028234e38]], [[-3.4028234e38, 1.17549435e-38, 0.1]]]",
        "[[9007199254740993, -9223372036854775808, 18446744073709551615]]",
        "[0.30000000000000004, 1.0000001192092896, 16777217, 1e-320]",
        "[[1E5, 2e-3, -4.5E+2]]",
    ],
    ids=["ints", "seed003", "float32-extremes", "big-ints", "rounding", "exponents"],
)
def test_fast_path_gives_the_same_float32_array_as_orjson(text: str) -> None:
    body = f'{{"data": {text}, "eps": 1e-5}}'.encode()
    fast = jsontensors.loads(body, _data)
    assert fast is not None and isinstance(fast["data"], np.ndarray)
    assert fast["eps"] == 1e-5
    got, want = _slow(fast["data"]), _slow(orjson.loads(body)["data"])
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(5))
def test_random_tensors_round_trip_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 7, size=int(rng.integers(1, 5))))
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
    body = orjson.dumps({"data": x, "normalized_shape": [shape[-1]]}, option=orjson.OPT_SERIALIZE_NUMPY)
    fast = jsontensors.loads(body, _data)
    assert fast is not None and fast["normalized_shape"] == [shape[-1]]
    np.testing.assert_array_equal(_slow(fast["data"]), x)


@pytest.mark.parametrize(
    "body",
    [
        b'{"data": [[1, [2]], [3, 4]]}',  # an extra level that flattens to the same count
        b'{"data": [1e400]}',  # out of double range
        b'{"data": [NaN]}',  # not JSON
        b'{"data": [01]}',  # not JSON
        b'{"data": [1, 2]',  # truncated
        b'{"data": [1, 2], "a\\u0000b": 1}',  # a key simdjson cannot look up: a NUL ends its C string
        b'{"data": ' + b"[" * 33 + b"1" + b"]" * 33 + b"}",  # past NumPy 1's 32 dims: reshape would raise
        b'{"data": [1], "x": ' + b"[" * 65 + b"]" * 65 + b"}",  # deeper than any field: _convert would recurse
        b'{"data": [[1, "a"], ' + b"[" * 300 + b"]" * 300 + b"]}",  # a list past orjson's 255 levels
        b'{"data": [1], ' + b", ".join(b'"k%d": 1' % i for i in range(65)) + b"}",  # keys² lookups
    ],
    ids=[
        "hidden-level",
        "overflow",
        "nan-token",
        "leading-zero",
        "truncated",
        "nul-in-key",
        "rank-33",
        "field-65-deep",
        "ragged-300-deep",
        "65-keys",
    ],
)
def test_unsure_bodies_fall_back_to_orjson(body: bytes) -> None:
    assert jsontensors.loads(body, _data) is None


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"data": [1, 2], "data": [3, 4]}', "data"),
        (b'{"inputs": [{"name": "input", "data": [1], "name": "gamma"}]}', "name"),
        (b'{"data": [1], "p": {"eps": 1, "mode": 2, "eps": 3}}', "eps"),
    ],
    ids=["top-level", "in-a-list", "nested"],
)
def test_a_repeated_key_is_refused_naming_it(body: bytes, key: str) -> None:
    with pytest.raises(InvalidInput) as e:
        jsontensors.loads(body, _v2)
    assert str(e.value) == f"{key}: given more than once in one object; send each field once"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"data": [[1, 2], [3, 4, 5]]}', [[1, 2], [3, 4, 5]]),  # ragged: the codec names the row
        (b'{"data": [[true, 2]]}', [[True, 2]]),  # booleans: the codec refuses them
        (b'{"data": [[1, "2"]]}', [[1, "2"]]),
        (b'{"data": [[]]}', [[]]),
    ],
    ids=["ragged", "boolean", "string", "empty"],
)
def test_arrays_that_are_not_rectangular_numbers_stay_lists_for_the_codec(body: bytes, expected: Any) -> None:
    doc = jsontensors.loads(body, _data)
    assert doc == {"data": expected}


def test_strings_holding_brackets_do_not_confuse_the_shape_check() -> None:
    body = json.dumps({"id": "[[[", "inputs": [{"name": "x]", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}).encode()
    doc = jsontensors.loads(memoryview(bytearray(body)), _v2)
    assert doc is not None and doc["id"] == "[[[" and doc["inputs"][0]["shape"] == [2, 2]
    np.testing.assert_array_equal(doc["inputs"][0]["data"], [[1, 2], [3, 4]])


def test_only_tensor_paths_become_arrays() -> None:
    doc = jsontensors.loads(b'{"data": [1, 2], "gamma": [3, 4]}', _data)
    assert doc is not None and isinstance(doc["data"], np.ndarray) and doc["gamma"] == [3, 4]


def _outcome(body: bytes) -> Any:
    """What loads makes of a body, comparable: arrays as (dtype, shape, bytes), a refusal as its message."""

    def plain(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return (str(value.dtype), value.shape, value.tobytes())
        if isinstance(value, dict):
            return [(k, plain(v)) for k, v in value.items()]
        if isinstance(value, list):
            return [plain(v) for v in value]
        return (type(value).__name__, value)

    try:
        return plain(jsontensors.loads(bytearray(body), _data))
    except InvalidInput as e:
        return ("refused", e.field, str(e))


@pytest.mark.parametrize(
    ("body", "in_pieces"),
    [
        (b'{"data": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "eps": 1e-5}', True),
        (b'{"eps": 1e-5, "data" : [ -0, 0.5,\n1e5, 16777217, 3.4028234e38, 1e-45, 7, 8 ] }', True),
        (b'{"data": [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]], "normalized_shape": [2, 2]}', True),
        (b'{"x": {"data": [[0, 0], [0, 0], [0, 0]]}, "data": [[1, 2], [3, 4], [5, 6]]}', True),
        (b'{"data": [[1, 2], [3, 4], [5, 6]], "data": [[1, 2], [3, 4], [5, 6]]}', True),
        (b'{"data": [[1, 2], [3, [4]], [5, 6]]}', False),
        (b'{"data": [[1, 2], [3, 4], [5, true]]}', False),
        (b'{"data": [[1, 2], [3, 4, 5], [5, 6]]}', False),
        (b'{"data": [[1, 2], [3, 4], [5, 6],]}', False),
        (b'{"data": [[1, 2], [3, 4], [5, 6]]', False),
        (b'{"a": "]", "data": [[1, 2], [3, 4], [5, 6]], "b": "[\\"}"}', True),
    ],
    ids=[
        "2d",
        "1d-spaces",
        "3d",
        "nested-key-first",
        "repeated-key",
        "hidden-level",
        "boolean",
        "ragged",
        "trailing-comma",
        "unclosed",
        "brackets-in-strings",
    ],
)
def test_a_large_body_parsed_in_pieces_gives_the_same_document_as_one_parse(
    monkeypatch: pytest.MonkeyPatch, body: bytes, in_pieces: bool
) -> None:
    whole = _outcome(body)
    monkeypatch.setattr(jsontensors, "_SPLIT_BYTES", 8)
    monkeypatch.setattr(jsontensors, "_PIECE_BYTES", 4)
    assert _outcome(body) == whole
    try:
        split = jsontensors._loads_split(bytearray(body), _data, lambda: None)
    except InvalidInput:
        split = "refused"
    assert (split is not None) is in_pieces


@pytest.mark.parametrize(
    "text",
    [
        "[[1, 2], [3, 4], [5, 6]]",
        "[[-0.5e-3, 1E+5], [-7, 3.4028234e38], [18446744073709551615, -9223372036854775808]]",
        "[[[1, 2]], [[3, 4]], [[5, 6]]]",
        "[[1], [2], [3]]",
        "[ [ 1 ,2 ] ,\n [3, 4] ]",
    ],
    ids=["2d", "number-forms", "3d", "rows-of-one", "spaces"],
)
def test_many_short_rows_are_checked_on_their_text_and_parsed_as_an_array(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setattr(jsontensors, "_SHORT_ROWS", 1)
    body = f'{{"data": {text}}}'.encode()
    fast = jsontensors.loads(body, _data)
    assert fast is not None and isinstance(fast["data"], np.ndarray)
    np.testing.assert_array_equal(_slow(fast["data"]), _slow(orjson.loads(body)["data"]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[1, 2], [3, true], [4, 5]]", [[1, 2], [3, True], [4, 5]]),
        ("[[1, 2], [3, null], [4, 5]]", [[1, 2], [3, None], [4, 5]]),
        ('[[1, 2], [3, "4"], [4, 5]]', [[1, 2], [3, "4"], [4, 5]]),
        ("[[1, 2], [3, {}], [4, 5]]", [[1, 2], [3, {}], [4, 5]]),
        ("[[1, 2], [3, [4]]]", [[1, 2], [3, [4]]]),
        ("[[1, 2], [3], [true, 5]]", [[1, 2], [3], [True, 5]]),
    ],
    ids=["boolean", "null", "string", "object", "hidden-level", "ragged-and-boolean"],
)
def test_many_short_rows_that_are_not_all_numbers_stay_lists_for_the_codec(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: Any
) -> None:
    monkeypatch.setattr(jsontensors, "_SHORT_ROWS", 1)
    assert jsontensors.loads(f'{{"data": {text}}}'.encode(), _data) == {"data": expected}


def _refusal(value: Any) -> str:
    with pytest.raises(InvalidInput) as e:
        decode_json_tensor(value, "data", max_elements=10**8, max_depth=32)
    return str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[1, 2], [3, 4], [5]]", "data: row 2 has 1 elements, expected 2"),
        ("[[1], [2, 3], [4]]", "data: row 1 has 2 elements, expected 1"),
        ("[[1, 2], 3, [4, 5]]", "data: row 1 is a number, expected an array of 2"),
        ("[[1, 2], [], [4, 5]]", "data: row 1 has 0 elements, expected 2"),
        ("[[1, 2], [3, 4], [[5, 6]]]", "data: row 2 has 1 elements, expected 2"),
        ("[[[1], [2]], [[3], [4, 5]]]", "data: row [1, 1] has 2 elements, expected 1"),
        ("[[[1], [2]], [[3], 4], [5]]", "data: row 2 has 1 elements, expected 2"),
        ("[[[1], [2]], [[3], 4]]", "data: row [1, 1] is a number, expected an array of 1"),
        ("[[1, 2], [3, [4]], [5]]", "data: row 2 has 1 elements, expected 2"),
        ("[[1], [1], []]", "data: row 2 has 0 elements, expected 1"),
        ("[[[1]], [[]]]", "data: row [1, 0] has 0 elements, expected 1"),
        ("[[1, " + "[" * 300 + "7" + "]" * 300 + "], [3, 4], [5]]", "data: row 2 has 1 elements, expected 2"),
    ],
    ids=[
        "last-row-short",
        "first-row-short",
        "row-a-number",
        "row-empty",
        "row-too-deep",
        "3d",
        "3d-shallow-problem-first",
        "3d-number-for-row",
        "row-before-element",
        "empty-row-of-one",
        "3d-empty-row-of-one",
        "300-deep-row-first",
    ],
)
def test_a_ragged_array_of_many_short_rows_is_named_from_its_text_as_from_its_lists(
    monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.setattr(jsontensors, "_SHORT_ROWS", 1)
    body = f'{{"data": {text}, "eps": 0.5}}'.encode()
    fast = jsontensors.loads(body, _data)
    assert fast is not None and isinstance(fast["data"], Ragged) and fast["eps"] == 0.5
    assert _refusal(fast["data"]) == _refusal(orjson.loads(body)["data"]) == message


def _mutated(rng: np.random.Generator) -> Any:
    """A random rectangular array of numbers (small integers, or floats of any exponent) with one random row or
    element made wrong."""
    shape = [int(d) for d in rng.integers(1, 4, size=int(rng.integers(2, 5)))]
    numbers = (
        rng.integers(0, 10, shape) if rng.integers(0, 2) else rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30)
    )
    value: Any = numbers.tolist()
    node, path = value, [int(rng.integers(0, shape[0]))]
    for size in shape[1 : int(rng.integers(1, len(shape)))]:
        node = node[path[-1]]
        path.append(int(rng.integers(0, size)))
    how = int(rng.integers(0, 5))
    if how == 0:
        node[path[-1]] = 7  # a number where a row goes (or a number stays a number)
    elif how == 1:
        node[path[-1]] = []
    elif how == 2 and isinstance(node[path[-1]], list):
        node[path[-1]].append(1)
    elif how == 3 and isinstance(node[path[-1]], list) and len(node[path[-1]]) > 1:
        node[path[-1]].pop()
    else:
        node[path[-1]] = [node[path[-1]]]
    return value


@pytest.mark.parametrize("seed", range(300))
def test_any_array_of_many_short_rows_reads_as_orjson_and_the_codec_read_it(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(jsontensors, "_SHORT_ROWS", 1)
    body = orjson.dumps({"data": _mutated(np.random.default_rng(seed))})
    slow = orjson.loads(body)
    fast = jsontensors.loads(body, _data) or slow  # None: the codec parses it with orjson
    try:
        want = ("ok", decode_json_tensor(slow["data"], "data", max_elements=10**8, max_depth=32).tolist())
    except InvalidInput as e:
        want = ("refused", str(e))
    try:
        got = ("ok", decode_json_tensor(fast["data"], "data", max_elements=10**8, max_depth=32).tolist())
    except InvalidInput as e:
        got = ("refused", str(e))
    assert got == want


@pytest.mark.parametrize("shape", [(70_000, 2), (300, 300, 1)], ids=["70000x2", "300x300x1"])
def test_a_body_of_many_narrow_rows_is_parsed_as_an_array(shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    body = orjson.dumps({"data": x}, option=orjson.OPT_SERIALIZE_NUMPY)
    fast = jsontensors.loads(bytearray(body), _data)
    assert fast is not None and isinstance(fast["data"], np.ndarray)
    np.testing.assert_array_equal(_slow(fast["data"]), x)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (69_999, "data: row 69999 has 1 elements, expected 2"),
        (0, "data: row 1 has 2 elements, expected 1"),
    ],
    ids=["last-row-short", "first-row-short"],
)
def test_a_body_of_many_narrow_rows_with_a_short_one_is_refused_naming_the_row(row: int, message: str) -> None:
    rows = np.arange(140_000).reshape(70_000, 2).tolist()
    rows[row] = rows[row][:1]
    doc = jsontensors.loads(bytearray(orjson.dumps({"data": rows})), _data)
    assert doc is not None and isinstance(doc["data"], Ragged)
    assert _refusal(doc["data"]) == _refusal(rows) == message
