"""app/core/dataplane.py: the inputs check every rule themselves, naming each protocol's own fields; output statistics."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from app.core import reference
from app.core.dataplane import EncodeInput, EncoderLimits, Fields, ModelInfo, NormalizeInput, NormalizeOutput
from app.core.halfprecision import HALF_DTYPES, narrow
from app.errors import InvalidInput
from app.server.api.v2.http.codec import FIELDS as V2_FIELDS

PROTOCOLS = [pytest.param(Fields(), id="rest"), pytest.param(V2_FIELDS, id="v2")]
LIMITS = EncoderLimits(d_model=4, max_sequence_length=6, model="'tiny', version 2")
X = np.arange(6, dtype=np.float64).reshape(2, 3)  # rank 2: k may be 1 or 2
F32 = np.dtype(np.float32)
RANGE = "is outside float32's finite range (|x| <= 3.402823e+38)"


def _message(template: str, f: Fields) -> str:
    """A message template whose {x}, {k}, {eps}, ... are the protocol's field names."""
    return template.format(**dataclasses.asdict(f))


# (arguments of NormalizeInput after x, x, message template)
NORMALIZE_ERRORS = [
    pytest.param({"k": 0}, X, "{k}: expected an integer in 1..2 (the input's rank), got 0", id="k-0"),
    pytest.param({"k": 3}, X, "{k}: expected an integer in 1..2 (the input's rank), got 3", id="k-past-rank"),
    pytest.param({"k": -1}, X, "{k}: expected an integer in 1..2 (the input's rank), got -1", id="k-negative"),
    pytest.param({"k": True}, X, "{k}: expected an integer in 1..2 (the input's rank), got True", id="k-bool"),
    pytest.param({"k": 1.0}, X, "{k}: expected an integer in 1..2 (the input's rank), got 1.0", id="k-float"),
    pytest.param({"k": 2}, X[0], "{k}: expected an integer in 1..1 (the input's rank), got 2", id="k-past-rank-1"),
    pytest.param({"eps": 0.0}, X, "{eps}: expected a finite number > 0, got 0.0", id="eps-0"),
    pytest.param({"eps": -1e-5}, X, "{eps}: expected a finite number > 0, got -1e-05", id="eps-negative"),
    pytest.param({"eps": float("nan")}, X, "{eps}: expected a finite number > 0, got nan", id="eps-nan"),
    pytest.param({"eps": float("inf")}, X, "{eps}: expected a finite number > 0, got inf", id="eps-inf"),
    pytest.param({"eps": True}, X, "{eps}: expected a finite number > 0, got True", id="eps-bool"),
    pytest.param({"eps": "1e-5"}, X, "{eps}: expected a finite number > 0, got '1e-5'", id="eps-string"),
    pytest.param({"eps_mode": "VAR"}, X, "{eps_mode}: expected 'var' or 'std', got 'VAR'", id="eps-mode-case"),
    pytest.param({"eps_mode": None}, X, "{eps_mode}: expected 'var' or 'std', got None", id="eps-mode-none"),
    pytest.param(
        {"k": 2, "gamma": np.ones(3)},
        X,
        "{gamma}: shape [3] does not match the normalized dims of {x}, [2, 3]",
        id="gamma-shape",
    ),
    pytest.param(
        {"beta": np.ones((1, 3))},
        X,
        "{beta}: shape [1, 3] does not match the normalized dims of {x}, [3]",
        id="beta-shape",
    ),
    pytest.param({"gamma": np.array([1, np.inf, 1])}, X, f"{{gamma}}: element [1] = inf {RANGE}", id="gamma-inf"),
    pytest.param({"beta": np.array([0, 0, 1e39])}, X, f"{{beta}}: element [2] = 1e+39 {RANGE}", id="beta-past-float32"),
    pytest.param({}, np.array([[1, np.nan, 3]]), f"{{x}}: element [0, 1] = nan {RANGE}", id="x-nan"),
    pytest.param({}, np.array([[1, 2], [3, -1e39]]), f"{{x}}: element [1, 1] = -1e+39 {RANGE}", id="x-past-float32"),
    pytest.param(
        {"k": 5, "eps": -1.0}, np.array([[1, np.inf]]), f"{{x}}: element [0, 1] = inf {RANGE}", id="x-checked-first"
    ),
    pytest.param({"k": 5, "eps": -1.0}, X, "{eps}: expected a finite number > 0, got -1.0", id="eps-before-k"),
    pytest.param(
        {"gamma": np.ones(2), "beta": np.ones(2)},
        X,
        "{gamma}: shape [2] does not match the normalized dims of {x}, [3]",
        id="gamma-before-beta",
    ),
]


@pytest.mark.parametrize("fields", PROTOCOLS)
@pytest.mark.parametrize(("kwargs", "x", "template"), NORMALIZE_ERRORS)
def test_normalize_input_refuses_a_broken_rule_naming_the_protocols_field(
    fields: Fields, kwargs: dict[str, Any], x: np.ndarray, template: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        NormalizeInput(x, **kwargs, fields=fields)
    assert str(e.value) == _message(template, fields)


@pytest.mark.parametrize(
    ("kwargs", "x"),
    [
        ({"k": 1}, X),
        ({"k": 2, "gamma": np.ones((2, 3)), "beta": np.zeros((2, 3))}, X),
        ({"eps": 1e-30, "eps_mode": "std"}, X),
        ({"eps": 5}, X),  # an int eps is a number
        ({}, np.array([3.4028234663852886e38, -3.4028234663852886e38])),  # float32's largest finite values
    ],
    ids=["k-1", "k-2-affine", "tiny-eps-std", "int-eps", "float32-max"],
)
def test_normalize_input_accepts_values_within_every_rule(kwargs: dict[str, Any], x: np.ndarray) -> None:
    req = NormalizeInput(x, **kwargs)
    assert req.x.shape == x.shape


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.float16])
def test_normalize_input_casts_data_gamma_and_beta_to_float32(dtype: type) -> None:
    x: np.ndarray = np.array([[0.1, 2, 3], [4, 5, 6]]).astype(dtype)
    req = NormalizeInput(x, 1, gamma=np.array([1, 2, 3], dtype=dtype), beta=np.array([0.5, 0, 1], dtype=dtype))
    assert req.gamma is not None and req.beta is not None
    assert (req.x.dtype, req.gamma.dtype, req.beta.dtype) == (F32, F32, F32)
    np.testing.assert_array_equal(req.x, x.astype(np.float32))
    np.testing.assert_array_equal(req.beta, np.array([0.5, 0, 1], dtype=dtype).astype(np.float32))


def test_normalize_input_keeps_float32_data_without_a_copy() -> None:
    x = np.ones((2, 3), np.float32)
    assert NormalizeInput(x).x is x


@pytest.mark.parametrize(
    ("shape", "k", "cols", "batch_shape"),
    [((5,), 1, 5, ()), ((2, 3), 1, 3, (2,)), ((2, 3), 2, 6, ()), ((4, 2, 3, 5), 2, 15, (4, 2))],
)
def test_normalize_input_rows_are_the_last_k_dims(
    shape: tuple[int, ...], k: int, cols: int, batch_shape: tuple[int, ...]
) -> None:
    req = NormalizeInput(np.zeros(shape), k)
    assert (req.cols, req.batch_shape) == (cols, batch_shape)


# (x shape, mask shape or None, one_sequence, message template); LIMITS: d_model 4, max_sequence_length 6
ENCODE_ERRORS = [
    pytest.param((4,), None, False, "{x}: rank 1 (shape [4]); expected [batch, seq, 4]", id="rank-1"),
    pytest.param((3, 4), None, False, "{x}: rank 2 (shape [3, 4]); expected [batch, seq, 4]", id="rank-2-batched-only"),
    pytest.param(
        (4,), None, True, "{x}: rank 1 (shape [4]); expected [batch, seq, 4] or [seq, 4]", id="rank-1-one-seq"
    ),
    pytest.param(
        (1, 1, 3, 4), None, True, "{x}: rank 4 (shape [1, 1, 3, 4]); expected [batch, seq, 4] or [seq, 4]", id="rank-4"
    ),
    pytest.param(
        (1, 3, 5), None, False, "{x}: last dimension is 5, expected d_model = 4 (model 'tiny', version 2)", id="d-model"
    ),
    pytest.param(
        (3, 5),
        None,
        True,
        "{x}: last dimension is 5, expected d_model = 4 (model 'tiny', version 2)",
        id="d-model-one-seq",
    ),
    pytest.param(
        (1, 7, 4),
        None,
        False,
        "{x}: sequence length 7 exceeds max_sequence_length 6 (set at export: normserve export --max-sequence-length)",
        id="too-long",
    ),
    pytest.param(
        (7, 4),
        None,
        True,
        "{x}: sequence length 7 exceeds max_sequence_length 6 (set at export: normserve export --max-sequence-length)",
        id="too-long-one-seq",
    ),
    pytest.param(
        (2, 3, 4),
        (2, 4),
        False,
        "{padding_mask}: shape [2, 4] does not match {x}'s [batch, seq] = [2, 3]",
        id="mask-seq",
    ),
    pytest.param(
        (2, 3, 4), (3,), False, "{padding_mask}: shape [3] does not match {x}'s [batch, seq] = [2, 3]", id="mask-rank"
    ),
    pytest.param(
        (3, 4),
        (2, 3),
        True,
        "{padding_mask}: shape [2, 3] does not match {x}'s [seq] = [3]",
        id="mask-batch-one-seq",
    ),
]


@pytest.mark.parametrize("fields", PROTOCOLS)
@pytest.mark.parametrize(("shape", "mask_shape", "one_sequence", "template"), ENCODE_ERRORS)
def test_encode_input_refuses_a_broken_rule_naming_the_protocols_field(
    fields: Fields, shape: tuple[int, ...], mask_shape: tuple[int, ...] | None, one_sequence: bool, template: str
) -> None:
    mask = None if mask_shape is None else np.zeros(mask_shape, bool)
    with pytest.raises(InvalidInput) as e:
        EncodeInput(np.zeros(shape), mask, LIMITS, fields=fields, one_sequence=one_sequence)
    assert str(e.value) == _message(template, fields)


@pytest.mark.parametrize("fields", PROTOCOLS)
def test_encode_input_checks_finiteness_first_with_the_indices_sent(fields: Fields) -> None:
    x = np.zeros((9, 5))  # too long and the wrong d_model too, but the element is what is named
    x[1, 2] = np.inf
    with pytest.raises(InvalidInput) as e:
        EncodeInput(x, None, LIMITS, fields=fields, one_sequence=True)
    assert str(e.value) == _message(f"{{x}}: element [1, 2] = inf {RANGE}", fields)


def test_encode_input_takes_one_sequence_as_a_batch_of_one() -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    mask = np.array([False, False, True])
    req = EncodeInput(x, mask, LIMITS, one_sequence=True)
    assert (req.x.shape, req.x.dtype) == ((1, 3, 4), F32)
    np.testing.assert_array_equal(req.x[0], x.astype(np.float32))
    assert req.padding_mask is not None
    np.testing.assert_array_equal(req.padding_mask, [[False, False, True]])


def test_encode_input_at_the_limits_is_accepted_as_contiguous_float32() -> None:
    x = np.zeros((4, 6, 2)).transpose(2, 1, 0)  # (2, 6, 4): max_sequence_length, d_model; not C-contiguous
    req = EncodeInput(x, None, LIMITS)
    assert (req.x.shape, req.x.dtype, req.x.flags.c_contiguous, req.x.flags.aligned) == (
        (2, 6, 4),
        F32,
        True,
        True,
    )


def test_encode_input_mask_defaults_to_no_padding() -> None:
    req = EncodeInput(np.zeros((2, 5, 4)), None, LIMITS)
    assert req.padding_mask is None
    assert (req.mask.shape, req.mask.dtype, bool(req.mask.any())) == ((2, 5), np.dtype(np.bool_), False)


def test_encode_input_mask_is_the_one_sent() -> None:
    mask = np.array([[False, True], [True, False]])
    req = EncodeInput(np.zeros((2, 2, 4)), mask, LIMITS)
    assert req.mask is mask


@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_normalize_output_std_and_inv_std_dev_match_numpy(eps_mode: str, eps: float) -> None:
    x = np.random.default_rng(7).standard_normal((3, 4, 10)) * 2 + 1
    ref = reference.layer_norm(x, 1, eps, eps_mode)
    out = NormalizeOutput(ref.output, ref.mean, ref.var, eps, eps_mode, "numpy", None, None)
    np.testing.assert_allclose(out.std, x.std(axis=-1), rtol=1e-12)
    denominator = np.sqrt(x.var(axis=-1) + eps) if eps_mode == "var" else x.std(axis=-1) + eps
    np.testing.assert_allclose(out.inv_std_dev, 1 / denominator, rtol=1e-12)
    # It is what the output was divided by: (x - mean) * inv_std_dev is the output (gamma 1, beta 0).
    np.testing.assert_allclose((x - out.mean[..., None]) * out.inv_std_dev[..., None], ref.output, rtol=1e-12)


def test_model_info_describes_itself_as_responses_report_it() -> None:
    assert ModelInfo("layernorm", "1", "e9fd").describe() == {"name": "layernorm", "version": "1", "sha256": "e9fd"}


# ---- half precision (issue 26) -----------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_data_gamma_and_beta_widen_exactly_to_float32(datatype: str) -> None:
    x, g = (narrow(np.array(v), datatype, "x") for v in ([[0.1, 1000.5, -3e-6]], [1 / 3, 2.0, -1.0]))
    req = NormalizeInput(x, gamma=g, beta=g, dtype=datatype)
    assert (req.x.dtype, req.gamma.dtype, req.beta.dtype) == (F32, F32, F32)  # type: ignore[union-attr]
    np.testing.assert_array_equal(req.x, x.astype(np.float64))
    np.testing.assert_array_equal(req.gamma, g.astype(np.float64))  # type: ignore[arg-type]
    assert req.warnings == ()
    assert EncodeInput(np.zeros((1, 2, 4), HALF_DTYPES[datatype]), None, LIMITS, dtype=datatype).x.dtype == F32


@pytest.mark.parametrize(
    ("datatype", "bad", "message"),
    [
        ("FP16", np.inf, "{x}: element [0, 1] = inf is outside float16's finite range (|x| <= 65504)"),
        ("FP16", np.nan, "{x}: element [0, 1] = nan is outside float16's finite range (|x| <= 65504)"),
        ("BF16", -np.inf, "{x}: element [0, 1] = -inf is outside bfloat16's finite range (|x| <= 3.389531e+38)"),
        ("BF16", np.nan, "{x}: element [0, 1] = nan is outside bfloat16's finite range (|x| <= 3.389531e+38)"),
    ],
)
@pytest.mark.parametrize("f", PROTOCOLS)
def test_a_non_finite_half_element_is_refused_naming_its_type(
    datatype: str, bad: float, message: str, f: Fields
) -> None:
    x = np.array([[1.0, bad, 2.0]]).astype(HALF_DTYPES[datatype])
    for build in (
        lambda: NormalizeInput(x, fields=f),
        lambda: EncodeInput(x, None, LIMITS, fields=f, one_sequence=True),
    ):
        with pytest.raises(InvalidInput) as e:
            build()
        assert str(e.value) == _message(message, f)


@pytest.mark.parametrize("f", PROTOCOLS)
def test_an_unknown_output_datatype_is_refused_naming_the_field(f: Fields) -> None:
    x = np.zeros((1, 2, 4))
    for build in (
        lambda: NormalizeInput(x, fields=f, dtype="FP8"),
        lambda: EncodeInput(x, None, LIMITS, fields=f, dtype="FP8"),
    ):
        with pytest.raises(InvalidInput) as e:
            build()
        assert str(e.value) == f"{f.dtype}: expected one of FP32, FP64, FP16, BF16, got 'FP8'"


# ---- rows that float32 rounds to one value ------------------------------------------------------------------

ONE = 1.0 + 2.0**-30  # rounds to 1.0 in float32
ROUNDED = "its values differ but all round to the same float32, 1.0, so its var is 0 and its normalized values are 0"


@pytest.mark.parametrize(
    ("rows", "k", "warnings"),
    [
        pytest.param([[1.0, ONE, 1.0]], 1, (f"data: row [0]: {ROUNDED}",), id="first-two-differ-as-sent"),
        pytest.param([[1.0, 1.0, ONE]], 1, (f"data: row [0]: {ROUNDED}",), id="first-two-equal-as-sent"),
        pytest.param([[2.0, 3.0], [1.0, ONE]], 1, (f"data: row [1]: {ROUNDED}",), id="second-row"),
        pytest.param([[1.0, 1.0, 2.0]], 1, (), id="first-two-equal-row-not-constant"),
        pytest.param([[1.0, 1.0, 1.0]], 1, (), id="constant-as-sent"),
        pytest.param([[1.0], [ONE]], 1, (), id="one-value-rows"),
        pytest.param([[1.0, ONE], [1.0, ONE]], 2, (f"data: {ROUNDED}",), id="one-row-of-two-dims"),
        pytest.param([[1.0, 1.0], [1.0, 2.0]], 2, (), id="one-row-of-two-dims-not-constant"),
    ],
)
def test_a_row_whose_distinct_values_round_to_one_float32_is_warned_of(
    rows: list[list[float]], k: int, warnings: tuple[str, ...]
) -> None:
    assert NormalizeInput(np.array(rows), k).warnings == warnings


@pytest.mark.parametrize("datatype", list(HALF_DTYPES))
def test_rows_rounded_together_by_a_codecs_half_type_are_warned_of_naming_it(datatype: str) -> None:
    sent = np.array([[1.0, 1.0 + 2.0**-12, 1.0], [1.0, 2.0, 3.0]])  # below either type's spacing at 1
    x = narrow(sent, datatype, "data")
    warning = (
        f"data: row [0]: its values differ but all round to the same {x.dtype.name}, 1.0, so its var is 0 and"
        " its normalized values are 0"
    )
    req = NormalizeInput(x, sent=sent)
    assert req.warnings == (warning,)
    assert req.sent is None  # float64 numbers, 8 bytes each, not held through the request
    assert NormalizeInput(x).warnings == ()  # the half values alone: nothing to compare them with
