"""Tensors in and out: JSON (orjson straight into NumPy) and raw binary, around one datatype table.

Decoders do every check that names a field, so neither onnxruntime nor the JSON
layer ever sees a ragged, non-numeric, non-finite or oversized tensor.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from app.core.halfprecision import HALF_DTYPES, finfo, widen
from app.errors import InvalidInput, MalformedBody

# KServe V2 / Triton datatype names and their little-endian NumPy dtypes.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "BF16": HALF_DTYPES["BF16"],
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

FLOAT32_MAX = float(np.finfo(np.float32).max)
# Exactly the numbers that round to a finite float32 are below this in magnitude: FLOAT32_MAX plus half its
# spacing (2**104), where the tie rounds to even, which is up to inf. The bound itself is a float64.
_CAST_LIMIT = FLOAT32_MAX + 2.0**103
_EXACT_IN_FLOAT64 = (np.dtype(np.float32), np.dtype(np.float64))  # their min and max are exact as Python floats
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


_paused = 0  # how many threads are inside collector_paused
_paused_lock = threading.Lock()
_resume = False  # whether the first of them found the collector on (and the last turns it back on)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while building a tensor's Python lists: a list is a tracked object, and the
    collections its allocations trigger took 3/4 of the time of a million rows of two (0.40 s of orjson.loads,
    0.12 s paused; simdjson's as_list 0.36 and 0.09 s, measured). JSON values hold no cycles, so nothing the
    collector would free is created meanwhile by this thread; other threads' cycles wait for the next pass."""
    global _paused, _resume
    with _paused_lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()


def loads(body: bytes | bytearray | memoryview, what: str = "body") -> Any:
    """Parse JSON with orjson; NaN/Infinity tokens, bad UTF-8 and nesting past 1024 are a MalformedBody."""
    try:
        with collector_paused():
            return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise MalformedBody(f"not valid JSON ({e})", what) from None


def dumps(obj: Any) -> bytes:
    """Serialize a response; NumPy arrays go out without a detour through Python lists."""
    return orjson.dumps(obj, option=JSON_OPTIONS)


def decode_json_tensor(
    value: Any,
    field: str,
    *,
    max_elements: int,
    max_depth: int,
    may_hold_bools: bool = True,
    boolean: bool = False,
) -> np.ndarray:
    """A nested JSON array -> a rectangular array of numbers (or bools), or InvalidInput naming the field.

    Numbers come back as parsed (float64 or int): the data plane's inputs cast them (`to_finite_float`).
    may_hold_bools=False promises that the body has no `true`/`false` token, which skips the one check
    NumPy cannot do (it turns True into 1.0)."""
    if isinstance(value, np.ndarray | Ragged):  # from app/core/jsontensors.py: a rectangular array, or not one
        if value.ndim > max_depth:
            raise InvalidInput(f"nesting deeper than {max_depth} (NORMSERVE_MAX_DEPTH)", field)
        if isinstance(value, Ragged):
            raise InvalidInput(value.problem, field)
        check_shape(value.shape, field, max_elements)
        if boolean:
            raise InvalidInput("expected an array of booleans (true/false)", field)
        return value
    _check_depth(value, field, max_depth)
    # A ragged array first, at C speed: NumPy would refuse it only after reading all of it (0.12 s for a million
    # rows of two, measured), and the message would be this one.
    problem = _first_problem(value, "a number", leaves=False)
    if problem is not None:
        raise InvalidInput(problem, field)
    try:
        arr = np.asarray(value)
        if arr.dtype.kind == "O":  # ragged, or a null, object or array among the elements
            raise ValueError
    except (ValueError, OverflowError):
        raise InvalidInput(_describe_mismatch(value, "a boolean" if boolean else "a number"), field) from None
    check_shape(arr.shape, field, max_elements)
    if boolean:
        if arr.dtype.kind != "b":
            raise InvalidInput("expected an array of booleans (true/false)", field)
        return arr
    if arr.dtype.kind == "b" or (may_hold_bools and _holds_bool(value)):
        raise InvalidInput("booleans are not numbers; expected an array of numbers", field)
    if arr.dtype.kind in "US":
        raise InvalidInput(_describe_mismatch(value), field)
    if arr.dtype.kind not in "iuf":
        raise InvalidInput(f"expected an array of numbers, found {_kind_name(arr.dtype)}", field)
    return arr


class Ragged:
    """An array of numbers found not rectangular on its text (app/core/jsontensors.py), before it became Python
    lists: its rank (the depth of its first number) and its first problem, which decode_json_tensor names.
    (Not a dataclass: orjson would serialize one, where the fast path's skeleton needs it to be a placeholder.)"""

    __slots__ = ("ndim", "problem")

    def __init__(self, ndim: int, problem: str) -> None:
        self.ndim = ndim
        self.problem = problem


def to_finite_float(arr: np.ndarray, field: str) -> np.ndarray:
    """Cast to float32 (no copy when it already is) and refuse any element outside float32's finite range."""
    if (arr.dtype.kind in "iu" or arr.dtype in _EXACT_IN_FLOAT64) and arr.size:
        # Judged before the cast, which then cannot overflow: no np.errstate, 1.6 us of a small request's 5
        # (measured). As Python floats, so that no float32 comparison rounds the bound.
        lo, hi = float(np.minimum.reduce(arr, None)), float(np.maximum.reduce(arr, None))
        if -_CAST_LIMIT < lo and hi < _CAST_LIMIT:
            return np.asarray(arr, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        out = widen(arr) if arr.dtype in HALF_DTYPES.values() else np.asarray(arr, dtype=np.float32)
        # min and max carry any NaN or inf out: no temporaries the size of the tensor unless one is bad.
        if -FLOAT32_MAX <= out.min() and out.max() <= FLOAT32_MAX:
            return out
        bad = ~np.isfinite(out)
    index = [int(i) for i in np.argwhere(bad)[0]]
    value = arr[tuple(index)]
    # A half-precision tensor's bad element is its own type's inf or nan: the message names that type.
    half = arr.dtype in HALF_DTYPES.values()
    name, top = (arr.dtype.name, float(finfo(arr.dtype).max)) if half else ("float32", FLOAT32_MAX)
    raise InvalidInput(f"element {index} = {value} is outside {name}'s finite range (|x| <= {top:.7g})", field)


# What a layernorm request can change to bring its result into range (an encoder's has only its input).
OVERFLOW_HINT = "scale the input or gamma down, or use a larger eps"


def check_finite(arr: np.ndarray, field: str, datatype: str = "FP32", hint: str = OVERFLOW_HINT) -> float:
    """Refuse a result that does not fit the datatype it is sent in (it overflowed): the one output check.

    Returns the largest magnitude in arr, which a caller rounding it to a half type needs too (one pass less)."""
    limit = _limit(datatype)
    # NaN propagates through min and max and fails both comparisons; no temporary the size of the output.
    low, high = float(arr.min()), float(arr.max())
    if not (-limit <= low and high <= limit):
        raise InvalidInput(f"the result is not finite in {datatype} (it overflows); {hint}", field)
    return max(high, -low)


@functools.cache
def _limit(datatype: str) -> float:
    """The largest finite value of a datatype: once per datatype, not per answer (finfo takes 0.5 us a call)."""
    return float(finfo(DATATYPES[datatype]).max)


def check_shape(shape: Sequence[int], field: str, max_elements: int) -> None:
    """Every dimension at least 1, and at most max_elements in all: the one shape check of every tensor."""
    for i, d in enumerate(shape):
        if d < 1:
            raise InvalidInput(
                f"dimension {i} is {'empty' if d == 0 else d} (shape {list(shape)}); every dimension needs >= 1", field
            )
    count = math.prod(shape)
    if count > max_elements:
        raise InvalidInput(f"{count} elements exceed the limit of {max_elements} (NORMSERVE_MAX_ELEMENTS)", field)


def encode_json_tensor(arr: np.ndarray) -> Any:
    """An array as orjson serializes it natively; 0-d arrays become bare numbers."""
    if arr.ndim == 0:
        return arr.item()
    return np.ascontiguousarray(arr)


def decode_binary(
    buffer: memoryview | bytes, datatype: str, shape: Sequence[int], field: str, size_name: str = "binary_data_size"
) -> np.ndarray:
    """Raw little-endian row-major bytes -> an array, after checking the byte count against the shape.

    size_name: what the protocol calls the byte count (HTTP's binary_data_size, gRPC's raw_input_contents)."""
    dt = DATATYPES.get(datatype)
    if dt is None:
        raise InvalidInput(f"datatype {datatype!r} is not supported; expected one of {sorted(DATATYPES)}", field)
    expected = math.prod(shape) * dt.itemsize
    if len(buffer) != expected:
        raise MalformedBody(
            f"{size_name} is {len(buffer)} bytes, but shape {list(shape)} of {datatype} needs {expected}", field
        )
    return np.frombuffer(buffer, dtype=dt).reshape(shape)


def binary_view(arr: np.ndarray) -> memoryview:
    """An array as raw little-endian row-major bytes: a view, no copy when it is little-endian and contiguous."""
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    out = np.ascontiguousarray(arr, dtype=dt)
    if out.dtype == HALF_DTYPES["BF16"]:  # ml_dtypes' types have no buffer format: their bits as uint16
        out = out.view(np.uint16)
    return out.data.cast("B")


def _check_depth(value: Any, field: str, max_depth: int) -> None:
    depth = 0
    while isinstance(value, list):
        depth += 1
        if depth > max_depth:
            raise InvalidInput(f"nesting deeper than {max_depth} (NORMSERVE_MAX_DEPTH)", field)
        value = value[0] if value else None
    if depth == 0:
        raise InvalidInput("expected a nested array of numbers of rank >= 1, got a scalar", field)


def _holds_bool(value: Any) -> bool:
    # Re-serializing is a C-speed scan; only a JSON bool prints as true/false.
    text = orjson.dumps(value)
    return b"true" in text or b"false" in text


def _kind_name(dt: np.dtype[Any]) -> str:
    return {"U": "strings", "S": "strings", "b": "booleans"}.get(dt.kind, f"elements of type {dt}")


def _describe_mismatch(value: Any, expected: str = "a number") -> str:
    """Find the first place a nested list stops being a rectangular array of `expected` (error path only)."""
    return _first_problem(value, expected, leaves=True) or "not a rectangular array of numbers"


def _first_problem(value: Any, expected: str, leaves: bool) -> str | None:
    """The first node, level by level, that is not where a rectangular array of the first elements' shape has
    one (and with `leaves`, the first element that is not `expected`); None if there is none."""
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    # Level by level, each a flat list, screened at C speed (types and lengths) before any node is looked at in
    # Python: a million rows of two took 1.1 s in a call per node, 0.1 s screened (measured).
    level = [value]
    for depth in range(len(shape) + 1 if leaves else len(shape)):
        for i in _suspects(level, depth, shape, expected):
            problem = _node_problem(level[i], depth, shape, expected)
            if problem is not None:
                return _placed(problem, i, depth, shape)
        if depth < len(shape):
            level = list(itertools.chain.from_iterable(level))
    return None


def _suspects(level: list[Any], depth: int, shape: list[int], expected: str) -> Iterator[int]:
    """The positions in a level where _node_problem may find something, in order (a superset: it decides)."""
    if depth < len(shape):
        if set(map(type, level)) == {list} and set(map(len, level)) == {shape[depth]}:
            return iter(())
        size = shape[depth]
        return (i for i, node in enumerate(level) if type(node) is not list or len(node) != size)
    if expected == "a boolean":
        return (i for i, node in enumerate(level) if type(node) is not bool)
    kinds = set(map(type, level))
    if kinds <= {float, int} and (int not in kinds or (-(2**63) <= min(level) and max(level) < 2**64)):
        return iter(())
    return (
        i
        for i, node in enumerate(level)
        if type(node) is not float and (type(node) is not int or not -(2**63) <= node < 2**64)
    )


def _node_problem(node: Any, depth: int, shape: list[int], expected: str) -> str | None:
    """What is wrong with one node at a depth, as a template of {index} / {where}; None if nothing."""
    if depth == len(shape):
        if isinstance(node, list):
            return f"element {{index}} is an array, expected {expected}"
        if expected == "a boolean":
            return None if isinstance(node, bool) else f"element {{index}} is {_json_type(node)}, expected {expected}"
        if isinstance(node, bool) or not isinstance(node, int | float):
            return f"element {{index}} is {_json_type(node)}, expected {expected}"
        if isinstance(node, int) and not -(2**63) <= node < 2**64:
            return "element {index} is an integer outside 64 bits, expected a float32 number"
        return None
    if not isinstance(node, list):
        return _row_problem(_json_type(node), 0, shape[depth])
    return _row_problem(None, len(node), shape[depth])


def _row_problem(kind: str | None, length: int, size: int) -> str | None:
    """A row that is a `kind` (not an array), or an array of `length` where `size` was expected; or None."""
    if kind is not None:
        return f"row {{where}} is {kind}, expected an array of {size}"
    return f"row {{where}} has {length} elements, expected {size}" if length != size else None


def _placed(problem: str, i: int, depth: int, shape: list[int]) -> str:
    """A problem at position i of its level: every level above was rectangular, so i unravels over shape[:depth]."""
    index = [int(j) for j in np.unravel_index(i, shape[:depth])] if depth else []
    return problem.format(index=index, where=index[0] if depth == 1 else index)


def text_row_problem(text: bytes, shape: list[int]) -> str | None:
    """The first row, level by level, of the minified text of an array whose first numbers have `shape`, that is
    not a row of a rectangular array of that shape; None if there is none above the numbers. The text holds
    numbers, brackets and commas only. As _first_problem (the same rows, the same words) without a Python object
    per row: a million ragged rows of two became 3 million objects to be named (0.3 s), here NumPy's passes."""
    chars = np.frombuffer(text, np.uint8)
    opens, commas = chars == ord("["), chars == ord(",")
    # How many lists are open after each character: '[' of a level-k list (the root is level 0) reads k + 1.
    # int16: a row may nest past the first numbers' depth, up to simdjson's 1,024 levels (int8 wrapped at 128).
    steps = opens.astype(np.int16) - (chars == ord("]"))
    depth = np.cumsum(steps, dtype=np.int16)
    del steps
    inside = depth == 1
    for level in range(1, len(shape)):
        # The rows of this level, in order: what follows each '[' (unless it closes at once) and each comma
        # of the lists one level up.
        starts = np.flatnonzero((opens | commas) & inside) + 1
        starts = starts[chars[starts] != ord("]")]
        rows = chars[starts] == ord("[")
        # Each row that is a list: its commas + 1 elements (each comma is its list's, the last opened before
        # it), or none
        inside = depth == level + 1
        own = np.searchsorted(starts[rows], np.flatnonzero(commas & inside)) - 1
        lengths = np.bincount(own, minlength=int(rows.sum())) + 1
        lengths[chars[starts[rows] + 1] == ord("]")] = 0
        sizes = np.full(len(starts), -1)
        sizes[rows] = lengths
        bad = np.flatnonzero(sizes != shape[level])
        if len(bad):
            i = int(bad[0])
            problem = _row_problem(None if rows[i] else "a number", int(sizes[i]), shape[level])
            assert problem is not None
            return _placed(problem, i, level, shape)
    return None


def _json_type(node: Any) -> str:
    if node is None:
        return "null"
    if isinstance(node, bool):
        return "a boolean"
    if isinstance(node, str):
        return "a string"
    if isinstance(node, dict):
        return "an object"
    if isinstance(node, int | float):
        return "a number"
    return type(node).__name__
