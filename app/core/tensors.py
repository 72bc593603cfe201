"""Tensors in and out: JSON (orjson straight into NumPy) and raw binary, around one datatype table.

Decoders do every check that names a field, so neither onnxruntime nor the JSON
layer ever sees a ragged, non-numeric, non-finite or oversized tensor.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from app.core.halfprecision import HALF_DTYPES, finfo, widen
from app.core.rowshape import Ragged, describe_mismatch, first_problem
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
        return _checked_prebuilt(value, field, max_elements=max_elements, max_depth=max_depth, boolean=boolean)
    _check_depth(value, field, max_depth)
    # A ragged array first, at C speed: NumPy would refuse it only after reading all of it (0.12 s for a million
    # rows of two, measured), and the message would be this one.
    problem = first_problem(value, "a number", leaves=False)
    if problem is not None:
        raise InvalidInput(problem, field)
    try:
        arr = np.asarray(value)
        if arr.dtype.kind == "O":  # ragged, or a null, object or array among the elements
            raise ValueError
    except (ValueError, OverflowError):
        raise InvalidInput(describe_mismatch(value, "a boolean" if boolean else "a number"), field) from None
    check_shape(arr.shape, field, max_elements)
    if boolean:
        if arr.dtype.kind != "b":
            raise InvalidInput("expected an array of booleans (true/false)", field)
        return arr
    if arr.dtype.kind == "b" or (may_hold_bools and _holds_bool(value)):
        raise InvalidInput("booleans are not numbers; expected an array of numbers", field)
    if arr.dtype.kind in "US":
        raise InvalidInput(describe_mismatch(value), field)
    if arr.dtype.kind not in "iuf":
        raise InvalidInput(f"expected an array of numbers, found {_kind_name(arr.dtype)}", field)
    return arr


def _checked_prebuilt(
    value: np.ndarray | Ragged, field: str, *, max_elements: int, max_depth: int, boolean: bool
) -> np.ndarray:
    """decode_json_tensor's checks of what the simdjson path already built: the same refusals, in the same order."""
    if value.ndim > max_depth:
        raise InvalidInput(f"nesting deeper than {max_depth} (NORMSERVE_MAX_DEPTH)", field)
    if isinstance(value, Ragged):
        raise InvalidInput(value.problem, field)
    check_shape(value.shape, field, max_elements)
    if boolean:
        raise InvalidInput("expected an array of booleans (true/false)", field)
    return value


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
