"""Half precision (FP16, BF16): exact widening to float32, one correct rounding back, shortest JSON numbers.

Inputs in a half type widen to float32 exactly (both are subsets of it), so the model computes from the
values the client sent. Outputs round once, from float32 or float64, to the nearest half value; a finite
value beyond the half type's range is refused naming the field, never answered as inf. Large FP16 arrays
convert in onnxruntime's Cast (F16C): NumPy converts one element at a time, 10-20x slower (measured).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort

from app.errors import InvalidInput

# V2 datatype names and their NumPy dtypes (bfloat16 from ml_dtypes: NumPy has none).
HALF_DTYPES: dict[str, np.dtype[Any]] = {"FP16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16)}
# The `dtype` field of /normalize and /encode: its names (NumPy's) and the V2 datatypes they mean.
JSON_DTYPES: dict[str, str] = {"float16": "FP16", "bfloat16": "BF16"}
NAMES: dict[str, str] = {"FP16": "float16", "BF16": "bfloat16", "FP32": "float32", "FP64": "float64"}
# Every FP16 value as float32, by its bits (256 KiB): widening is a lookup.
_FP16_VALUES = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
# FP16 <-> float32 as onnxruntime Cast graphs (scripts/make_kernel.py writes them), for arrays of at least
# CAST_ELEMENTS: a session run costs 20-30 us, what a table lookup or NumPy cast takes on about 8,000 elements.
CAST_FILES = {direction: Path(__file__).with_name(f"{direction}_fp16.onnx") for direction in ("widen", "narrow")}
CAST_ELEMENTS = 1 << 13
# Significant decimal digits that always round-trip: ceil(p * log10(2)) + 1 for p bits of precision.
ROUND_TRIP_DIGITS: dict[str, int] = {"FP16": 5, "BF16": 4}


def finfo(dt: np.dtype[Any]) -> Any:
    """NumPy's finfo for any float type, bfloat16 included."""
    return ml_dtypes.finfo(dt)  # type: ignore[no-untyped-call]


def limit(datatype: str) -> float:
    """The largest finite value of a half type."""
    return float(finfo(HALF_DTYPES[datatype]).max)


def widen(x: np.ndarray) -> np.ndarray:
    """A half-precision array as float32: exact, every half value is a float32."""
    if x.dtype == np.float16:
        if x.size >= CAST_ELEMENTS:
            return _cast("widen", x)
        # NumPy's cast converts one element at a time; a table lookup is 2-10x faster
        out: np.ndarray = np.take(_FP16_VALUES, x.view(np.uint16))
        return out
    return np.asarray(x, dtype=np.float32)


@functools.cache
def _cast_session(direction: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # 0.1 ms on 786K elements: no threads to wake
    return ort.InferenceSession(CAST_FILES[direction].read_bytes(), options, providers=["CPUExecutionProvider"])


def _cast(direction: str, x: np.ndarray) -> np.ndarray:
    """onnxruntime's Cast: exact FP16 -> float32, or float32 -> FP16 rounded to nearest, ties to even, past the
    range to inf (tests/core/test_halfprecision.py compares it with NumPy's on every FP16 value and their ties)."""
    out: np.ndarray = _cast_session(direction).run(None, {"x": x.reshape(-1)})[0]
    return out.reshape(x.shape)


def narrow(y: np.ndarray, datatype: str, field: str) -> np.ndarray:
    """float32 or float64 values rounded once to the nearest value of a half type (ties to even).

    A finite value beyond the type's range is an InvalidInput naming the field (and the element), not inf."""
    y = np.asarray(y)
    if y.dtype == HALF_DTYPES[datatype]:
        return y
    # Checked on y, before rounding: NumPy's min and max of a half-precision array are 40x slower than of float32.
    # min and max carry any nan out, and they make no temporaries the size of the tensor unless a value is bad.
    bound = overflow_bound(datatype)
    with np.errstate(invalid="ignore"):
        if y.size and not (-bound < float(y.min()) and float(y.max()) < bound):
            index = [int(i) for i in np.argwhere(~(np.abs(y) < bound))[0]]
            value = float(y[tuple(index)])
            raise InvalidInput(
                f"element {index} = {value:.9g} is outside {NAMES[datatype]}'s finite range ({range_text(datatype)})",
                field,
            )
    return narrow_exact(y, datatype)


def overflow_bound(datatype: str) -> float:
    """Half a spacing past the largest value: what rounds to inf in the half type (ties go to inf, the even one)."""
    info = finfo(HALF_DTYPES[datatype])
    return limit(datatype) + math.ldexp(1.0, int(info.maxexp) - 2 - int(info.nmant))


def uncertain(z: np.ndarray, err: float, datatype: str) -> np.ndarray:
    """Flat indices of the elements of an answer z, each within err of its exact value, that rounding to the half
    type might not round faithfully; the others round to within one unit in the last place of the exact value.

    Where |z| >= T + err, the exact value is at least T, whose spacing in the half type exceeds 2 * err: z and
    the exact value then have no half value between them, or z is within err of it, so z's rounding is one of
    the two half values around the exact one. Only the small elements below that need their exact value."""
    nmant = int(finfo(HALF_DTYPES[datatype]).nmant)
    # The smallest power of two T = 2**k whose spacing 2**(k - nmant) exceeds 2 * err.
    k = math.floor(math.log2(err)) + nmant + 2 if err > 0 else -1000
    return sparse_nonzero(np.abs(z) < math.ldexp(1.0, k) + err)


def sparse_nonzero(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero of a boolean array, faster when few elements are set: eight at a time as one uint64 word,
    NumPy's nonzero then visits only the words that hold one (0.30 -> 0.18 ms at 786,432 elements, 2.5% set)."""
    flat = mask.reshape(-1)
    n = flat.size - flat.size % 8
    words = flat[:n].view(np.uint64)
    hit = np.flatnonzero(words != 0)
    if 4 * hit.size > words.size:  # dense: the words do not skip enough to pay for themselves
        return np.flatnonzero(flat)
    k = np.flatnonzero(words[hit].view(np.bool_))
    found: np.ndarray = hit[k >> 3] * 8 + (k & 7)
    if n < flat.size:
        found = np.concatenate((found, np.flatnonzero(flat[n:]) + n))
    return found


def ulp_errors(got: np.ndarray, truth: np.ndarray, datatype: str) -> np.ndarray:
    """|got - truth| in units in the last place of the half type at truth (its spacing in truth's binade; the
    subnormal spacing below the smallest normal): at most 1 is faithful, at most 0.5 correctly rounded."""
    info = finfo(HALF_DTYPES[datatype])
    t = np.abs(np.asarray(truth, dtype=np.float64))
    exponent = np.frexp(np.maximum(t, float(info.smallest_normal)))[1] - 1  # floor(log2 |truth|), at least emin
    spacing = np.ldexp(1.0, exponent - int(info.nmant))
    errors: np.ndarray = np.abs(widen(got).astype(np.float64) - truth) / spacing
    return errors


def range_text(datatype: str) -> str:
    """`|x| <= 65504` for FP16: the finite range a message names."""
    return f"|x| <= {limit(datatype):.7g}"


def _to_odd_float32(y: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd: truncated, its last bit set when inexact.

    float32 has 16 bits more than bfloat16, so rounding the odd-rounded value to bfloat16 is the correct
    rounding of y itself (ml_dtypes casts float64 through float32 by nearest, which can round twice)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = y.astype(np.float32)
        wide = np.abs(f.astype(np.float64)) > np.abs(y)  # rounded away from zero: step back towards it
        f[wide] = np.nextafter(f[wide], np.float32(0))
        inexact = f.astype(np.float64) != y
        bits = f.view(np.uint32)
        bits[inexact & np.isfinite(f)] |= np.uint32(1)
    return f


def shortest(x: np.ndarray, datatype: str) -> np.ndarray:
    """Each half value as the float64 nearest the shortest decimal that rounds back to it.

    JSON printers write float64's shortest repr, which for a half value is its full binary expansion
    (0.0999755859375 for FP16's 0.1); this float64 prints as `0.1` and still reads back as the same value."""
    wide = widen(x).astype(np.float64)
    out = wide.copy()
    todo = np.flatnonzero(wide)  # 0 prints as 0.0 already
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for digits in range(1, ROUND_TRIP_DIGITS[datatype] + 1):
            v = wide.flat[todo]
            k = digits - 1 - np.floor(np.log10(np.abs(v))).astype(np.int64)  # decimal places kept
            # Powers of ten up to 1e22 are exact, so each candidate is the float64 nearest its decimal.
            up, down = np.float64(10.0) ** np.clip(k, 0, 22), np.float64(10.0) ** np.clip(-k, 0, 22)
            candidate = np.round(v * up / down) * down / up
            same = (narrow_exact(candidate, datatype) == x.flat[todo]) & (np.abs(k) <= 22)
            out.flat[todo[same]] = candidate[same]
            todo = todo[~same]
    for i in todo:  # BF16 beyond 1e+-22, where powers of ten are inexact: Python's decimal formatting, one by one
        out.flat[i] = _shortest_one(float(wide.flat[i]), x.flat[i], datatype)
    return out


def printable(arr: np.ndarray) -> np.ndarray:
    """An array for a JSON printer: a half-precision one as its values' shortest decimals, any other as it is."""
    for datatype, dt in HALF_DTYPES.items():
        if arr.dtype == dt:
            return shortest(arr, datatype)
    return arr


def _shortest_one(v: float, value: Any, datatype: str) -> float:
    for digits in range(1, ROUND_TRIP_DIGITS[datatype] + 1):
        candidate = float(f"{v:.{digits - 1}e}")
        if narrow_exact(np.array([candidate]), datatype)[0] == value:
            return candidate
    return v


def narrow_exact(y: np.ndarray, datatype: str) -> np.ndarray:
    """Values rounded once to a half type, inf past its range (no check: `narrow` checks)."""
    dt = HALF_DTYPES[datatype]
    if y.dtype.kind != "f":  # integers (JSON numbers may be): exact in float64 up to 2**53, far past the range
        y = y.astype(np.float64)
    if dt == np.float16 and y.dtype == np.float32 and y.size >= CAST_ELEMENTS:
        return _cast("narrow", y)
    # NumPy rounds float64 to float16 directly; ml_dtypes goes through float32, which could round twice.
    wide = y.dtype != np.float32 and dt != np.float16
    with np.errstate(over="ignore", invalid="ignore"):
        return (_to_odd_float32(np.asarray(y, dtype=np.float64)) if wide else y).astype(dt)
