"""app/core/halfprecision.py: exact widening, one correct rounding, refused overflow, shortest decimals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import orjson
import pytest

from app.core.halfprecision import (
    CAST_ELEMENTS,
    HALF_DTYPES,
    JSON_DTYPES,
    limit,
    narrow,
    narrow_exact,
    shortest,
    sparse_nonzero,
    ulp_errors,
    uncertain,
    widen,
)
from app.errors import InvalidInput

DATATYPES = tuple(HALF_DTYPES)


def every_finite(datatype: str) -> np.ndarray:
    """Every finite value of a half type: all 65,536 bit patterns but inf and nan."""
    values = np.arange(1 << 16, dtype=np.uint16).view(HALF_DTYPES[datatype])
    return values[np.isfinite(values.astype(np.float32))]


def test_the_tables_name_fp16_and_bf16() -> None:
    assert HALF_DTYPES == {"FP16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
    assert JSON_DTYPES == {"float16": "FP16", "bfloat16": "BF16"}
    assert (limit("FP16"), limit("BF16")) == (65504.0, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))


@pytest.mark.parametrize("datatype", DATATYPES)
def test_widen_is_exact_for_every_finite_value(datatype: str) -> None:
    values = every_finite(datatype)
    wide = widen(values)
    assert wide.dtype == np.float32
    assert np.array_equal(narrow(wide, datatype, "x").view(np.uint16), values.view(np.uint16))  # -0.0 too


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("source", [np.float32, np.float64])
def test_narrow_rounds_to_nearest_within_half_an_ulp(datatype: str, source: type) -> None:
    rng = np.random.default_rng(3)
    top = np.log(limit(datatype)) - 0.01
    y = (rng.choice([-1.0, 1.0], 200_000) * np.exp(rng.uniform(-top - 10, top, 200_000))).astype(source)
    out = narrow(y, datatype, "y")
    assert out.dtype == HALF_DTYPES[datatype]
    # The nearest value is at most half a unit away; the spacing below is the smaller one at a power of two.
    assert float(ulp_errors(out, y.astype(np.float64), datatype).max()) <= 0.5


def test_large_fp16_arrays_convert_as_numpy_does_every_value_and_every_tie() -> None:
    # Arrays of CAST_ELEMENTS or more convert in onnxruntime's Cast; NumPy's own cast is the reference: every FP16
    # value widens to the same float32, and every float32 halfway between two FP16 values (subnormal ones too) and
    # just either side of it rounds to the same FP16 bits, and past the range to the same inf.
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    assert values.size >= CAST_ELEMENTS
    assert np.array_equal(widen(values), values.astype(np.float32), equal_nan=True)
    finite = np.sort(values[np.isfinite(values)].astype(np.float64))
    ties = (finite[1:] + finite[:-1]) / 2
    near = np.concatenate([ties, ties * (1 + 2**-20), ties * (1 - 2**-20), [65519.0, 65520.0, 1e30, -1e30]])
    y = near.astype(np.float32)
    with np.errstate(over="ignore"):
        expected = y.astype(np.float16)
    assert np.array_equal(narrow_exact(y, "FP16").view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize(
    ("datatype", "value", "expected"),
    [
        # Halfway between 1 and 1 + 2**-7 plus 2**-30: nearest is up; rounding through float32 first would tie to 1.
        pytest.param("BF16", 1 + 2**-8 + 2**-30, 1 + 2**-7, id="bf16-just-above-a-tie"),
        pytest.param("BF16", 1 + 2**-8, 1.0, id="bf16-tie-to-even"),
        pytest.param("BF16", -(1 + 3 * 2**-8), -(1 + 2**-6), id="bf16-tie-to-even-up"),
        pytest.param("FP16", 1 + 2**-11 + 2**-40, 1 + 2**-10, id="fp16-just-above-a-tie"),
        pytest.param("FP16", 2**-25 + 2**-40, 2**-24, id="fp16-to-the-smallest-subnormal"),
        pytest.param("FP16", 65519.0, 65504.0, id="fp16-below-the-overflow-threshold"),
    ],
)
def test_narrow_rounds_float64_once(datatype: str, value: float, expected: float) -> None:
    assert float(widen(narrow(np.array([value]), datatype, "y"))[0]) == expected


@pytest.mark.parametrize(
    ("datatype", "value", "message"),
    [
        ("FP16", 65520.0, "output: element [1, 0] = 65520 is outside float16's finite range (|x| <= 65504)"),
        ("FP16", -1e6, "output: element [1, 0] = -1000000 is outside float16's finite range (|x| <= 65504)"),
        ("FP16", np.inf, "output: element [1, 0] = inf is outside float16's finite range (|x| <= 65504)"),
        ("FP16", np.nan, "output: element [1, 0] = nan is outside float16's finite range (|x| <= 65504)"),
        ("BF16", 3.4e38, "output: element [1, 0] = 3.4e+38 is outside bfloat16's finite range (|x| <= 3.389531e+38)"),
    ],
)
def test_narrow_refuses_values_beyond_the_half_range_naming_the_field(
    datatype: str, value: float, message: str
) -> None:
    y = np.array([[1.0, 2.0], [value, 3.0]])
    with pytest.raises(InvalidInput) as e:
        narrow(y, datatype, "output")
    assert str(e.value) == message
    assert e.value.field == "output"


@pytest.mark.parametrize("datatype", DATATYPES)
def test_shortest_reads_back_as_the_same_value_for_every_finite_value(datatype: str) -> None:
    values = every_finite(datatype)
    text = orjson.dumps(shortest(values, datatype), option=orjson.OPT_SERIALIZE_NUMPY)
    back = narrow(np.array(orjson.loads(text), dtype=np.float64), datatype, "x")
    assert np.array_equal(back.view(np.uint16), values.view(np.uint16))


@pytest.mark.parametrize(
    ("datatype", "values", "printed"),
    [
        ("FP16", [0.1, 1 / 3, -2.5, 1000.5, 65504, 6e-8], b"[0.1,0.3333,-2.5,1000.5,65500.0,6e-8]"),
        ("BF16", [0.1, 1 / 3, -2.5, 1000.5, 3e38, 1e-39], b"[0.1,0.334,-2.5,1000.0,3e+38,1e-39]"),
    ],
)
def test_shortest_prints_the_fewest_digits_that_round_trip(datatype: str, values: list[float], printed: bytes) -> None:
    x = narrow(np.array(values), datatype, "x")
    assert orjson.dumps(shortest(x, datatype), option=orjson.OPT_SERIALIZE_NUMPY) == printed


@pytest.mark.parametrize(
    ("datatype", "err", "threshold"),
    [("FP16", 1e-5, 2**-5), ("BF16", 1e-5, 2**-8), ("FP16", 2**-20, 2**-8)],
)
def test_uncertain_elements_are_those_below_the_magnitude_whose_spacing_is_twice_the_error(
    datatype: str, err: float, threshold: float
) -> None:
    z = np.array([threshold + err, threshold + err * 0.99, -threshold, 0.0, 1.0, -(threshold + err)], np.float32)
    assert uncertain(z, err, datatype).tolist() == [1, 2, 3]


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 64, 1001, 786_432])
@pytest.mark.parametrize("density", [0.0, 0.025, 0.5, 1.0])  # below and above the dense fallback's 1 word in 4
def test_sparse_nonzero_finds_the_indices_flatnonzero_does(size: int, density: float) -> None:
    mask = np.random.default_rng(size).random(size) < density
    assert np.array_equal(sparse_nonzero(mask), np.flatnonzero(mask))


def test_sparse_nonzero_reads_a_strided_mask_in_row_major_order() -> None:
    mask = (np.random.default_rng(3).random((6, 40)) < 0.05)[::2, 1::3]
    assert np.array_equal(sparse_nonzero(mask), np.flatnonzero(mask))


@pytest.mark.parametrize("datatype", DATATYPES)
def test_rounding_a_value_within_the_error_is_faithful_outside_the_uncertain_elements(datatype: str) -> None:
    """The double-rounding argument: an answer z within err of the exact value, rounded to the half type, is
    within one unit in the last place of the exact value wherever `uncertain` does not flag it."""
    rng = np.random.default_rng(7)
    err = 1e-5
    exact = rng.standard_normal(500_000) * np.exp(rng.uniform(-12, 3, 500_000))
    z = (exact + rng.uniform(-err, err, exact.size)).astype(np.float32)  # within err + float32's half ulp
    trusted = np.ones(z.size, bool)
    trusted[uncertain(z, err + 2**-24 * 30, datatype)] = False
    errors = ulp_errors(narrow(z, datatype, "z"), exact, datatype)
    assert float(errors[trusted].max()) < 1.0
    assert float(errors[~trusted].max()) > 1.0  # the flagged ones do need the exact value


@pytest.mark.parametrize(
    ("got", "truth", "datatype", "ulps"),
    [
        (1.0 + 2**-10, 1.0, "FP16", 1.0),
        (1.0, 1.0 + 2**-11, "FP16", 0.5),
        (2**-24, 0.0, "FP16", 1.0),  # the subnormal spacing at 0
        (1.0 + 2**-7, 1.0, "BF16", 1.0),
        (0.5, 0.5 + 2**-8, "BF16", 1.0),
    ],
)
def test_ulp_errors_count_the_spacing_at_the_truth(got: float, truth: float, datatype: str, ulps: float) -> None:
    half = narrow(np.array([got]), datatype, "x")
    assert float(ulp_errors(half, np.array([truth]), datatype)[0]) == ulps
