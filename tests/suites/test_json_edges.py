"""JSON edge cases on every JSON route (/normalize, /encode, V2 infer on layernorm and encoder).

Each row is answered either with a 4xx whose whole message names the place, or with a 200 whose
values match app/core/reference.py; after each, a valid request is still answered right, and no
row may cost seconds. The hostile table (tests/suites/test_hostile.py) has the bodies built to
hurt (bombs, huge numbers, a 1 MB field name, a repeated top-level key); these are the corners of
JSON itself: surrogates, NUL and control characters, encodings, many or long keys, deep values,
spellings of numbers. Where a row was a 500 or seconds of CPU before, its comment says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from app.core import reference
from app.core.runtime import Runtime
from tests.suites.test_hostile import (
    ENDPOINTS,
    assert_clean_error,
    assert_still_right,
    envelope,
    is_layernorm,
    is_v2,
    valid_body,
    valid_data,
)

LN, ENC, LN_V2, ENC_V2 = ENDPOINTS
V2_ENDPOINTS = [LN_V2, ENC_V2]
OK = (200, "")  # a 200 whose values are checked against the reference
REST_FIELDS = {
    LN: "data, gamma, beta, model, version, normalized_shape, eps, eps_mode, backend, validate, dtype",
    ENC: "data, padding_mask, model, version, validate, dtype",
}
Build = Callable[[str], bytes]
Outcome = dict[str, tuple[int, str]]


def lead(member: bytes) -> Build:
    """A valid request whose top-level object starts with `member` (`"key": value`): the same column everywhere."""
    return lambda e: b"{" + member + b", " + valid_body(e)[1:]


def lead_input(member: bytes) -> Build:
    """A valid V2 request whose inputs[0] starts with `member`."""
    start = b'{"inputs": [{'
    return lambda e: start + member + b", " + valid_body(e)[len(start) :]


def first_number(text: bytes) -> Build:
    """A valid request whose first element is written as `text`."""

    def build(endpoint: str) -> bytes:
        x = valid_data(endpoint)
        rest = json.dumps(x.tolist()).encode().lstrip(b"[").split(b",", 1)[1]
        return envelope(endpoint, b"[" * x.ndim + text + b"," + rest, shape=list(x.shape))

    return build


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def many_keys(n: int) -> bytes:
    return b", ".join(b'"k%d": 1' % i for i in range(n))


def unknown_field(key: str) -> Outcome:
    """The answer to an unknown top-level field, named as the message escapes it."""
    v2 = (400, f"{key}: unknown field; expected only id, model_name, model_version, parameters, inputs, outputs")
    return {
        LN: (422, f"{key}: unknown field; expected only {REST_FIELDS[LN]}"),
        ENC: (422, f"{key}: unknown field; expected only {REST_FIELDS[ENC]}"),
        LN_V2: v2,
        ENC_V2: v2,
    }


def not_json(reason: str, rest: int, ln_v2: int | None = None, enc_v2: int | None = None) -> Outcome:
    """400 `body: not valid JSON`, in orjson's words, at a column: the same everywhere unless V2's are given."""
    m = "body: not valid JSON ({}: line 1 column {} (char {}))"
    columns = {LN: rest, ENC: rest, LN_V2: ln_v2 or rest, ENC_V2: enc_v2 or rest}
    return {e: (400, m.format(reason, c, c - 1)) for e, c in columns.items()}


def per_protocol(rest: str, v2: str) -> Outcome:
    return {LN: (422, rest), ENC: (422, rest), LN_V2: (400, v2), ENC_V2: (400, v2)}


NOT_UTF8 = dict.fromkeys(
    ENDPOINTS, (400, "body: not valid JSON (str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0))")
)
ALL_OK = dict.fromkeys(ENDPOINTS, OK)
INFINITE = "number is infinity when parsed as double"

ROWS: list[Any] = [
    # UTF-16 surrogates, escaped: JSON allows a high one only when a low one follows (one character)
    pytest.param(lead(b'"\\ud800": 1'), not_json("no low surrogate in string", 3), id="key-lone-high-surrogate"),
    pytest.param(lead(b'"\\udc00": 1'), not_json("invalid high surrogate in string", 3), id="key-lone-low-surrogate"),
    pytest.param(
        lead(b'"\\udc00\\ud800": 1'), not_json("invalid high surrogate in string", 3), id="key-reversed-surrogates"
    ),
    pytest.param(lead(b'"\\ud83d\\ude00": 1'), unknown_field("\U0001f600"), id="key-paired-surrogates"),
    pytest.param(lead(b'"x": "\\ud800"'), not_json("no low surrogate in string", 8), id="string-lone-high-surrogate"),
    pytest.param(
        lead(b'"x": "\\udc00\\ud800"'), not_json("invalid high surrogate in string", 8), id="string-reversed-surrogates"
    ),
    # NUL and control characters: escaped, a key like any other (the message escapes it); raw, not JSON.
    # The NUL key was a 500: simdjson looks keys up as C strings (fixed before this table: it falls back to orjson).
    pytest.param(lead(b'"\\u0000": 1'), unknown_field("\\x00"), id="key-nul"),
    pytest.param(lead(b'"da\\u0000ta": 1'), unknown_field("da\\x00ta"), id="key-nul-inside"),
    pytest.param(lead(b'"\\u0001\\u001f\\u007f": 1'), unknown_field("\\x01\\x1f\\x7f"), id="key-control-escaped"),
    pytest.param(lead(b'"\x01": 1'), not_json("unexpected control character in string", 3), id="key-control-raw"),
    # encodings: invalid and overlong UTF-8, an encoded surrogate; a BOM may be ignored (RFC 8259), and is
    pytest.param(lead(b'"\xff": 1'), NOT_UTF8, id="key-invalid-utf8"),
    pytest.param(lead(b'"\xc0\xaf": 1'), NOT_UTF8, id="key-overlong-utf8"),
    pytest.param(lead(b'"x": "\xed\xa0\x80"'), NOT_UTF8, id="string-encoded-surrogate"),
    pytest.param(lambda e: b"\xef\xbb\xbf" + valid_body(e), ALL_OK, id="bom"),
    # 100,000 keys in one object took 11 s of CPU: simdjson finds each key by a linear scan (now orjson reads them)
    pytest.param(lead(many_keys(100_000)), unknown_field("k0"), id="keys-100000"),
    # numbers: zeros of either sign and an underflow are 0; past double's range JSON readers disagree, so refused
    pytest.param(first_number(b"-0"), ALL_OK, id="number-minus-zero"),
    pytest.param(first_number(b"-0.0e-0"), ALL_OK, id="number-minus-zero-exponent"),
    pytest.param(first_number(b"1E-400"), ALL_OK, id="number-1E-400"),
    pytest.param(first_number(b"0." + b"3" * 400), ALL_OK, id="number-400-digit-fraction"),
    pytest.param(first_number(b"1e999"), not_json(INFINITE, 12, 78, 84), id="number-1e999"),
    pytest.param(first_number(b"9" * 400), not_json(INFINITE, 12, 78, 84), id="number-400-digits"),
    # depth: each was a 500 (past NumPy's dims on reshape; Python's recursion limit; orjson's 255 levels on dumps)
    pytest.param(
        lambda e: envelope(e, deep(65)[:65] + b"1" + deep(65)[65:]),
        per_protocol(
            "data: nesting deeper than 32 (NORMSERVE_MAX_DEPTH)",
            "inputs.input.data: nesting deeper than 32 (NORMSERVE_MAX_DEPTH)",
        ),
        id="tensor-rank-65",
    ),
    pytest.param(lead(b'"x": ' + deep(300)), unknown_field("x"), id="field-300-deep"),
    pytest.param(lead(b'"x": ' + deep(1000)), unknown_field("x"), id="field-1000-deep"),
    pytest.param(
        lambda e: envelope(e, b"[[1, 2], " + deep(300) + b"]"),
        per_protocol("data: row 1 has 1 elements, expected 2", "inputs.input.data: row 1 has 1 elements, expected 2"),
        id="ragged-300-deep",
    ),
]


def expected_output(endpoint: str, body: bytes, runtime: Runtime) -> np.ndarray:
    """The reference's answer to the tensor as a JSON reader sees it (a BOM skipped, -0 and 1E-400 zeros)."""
    doc = json.loads(body.decode("utf-8-sig"))
    if is_v2(endpoint):
        tensor = doc["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    else:
        x = np.asarray(doc["data"], dtype=np.float32)
    if is_layernorm(endpoint):
        return reference.layer_norm(x).output
    m = runtime.get("encoder")
    assert m.weights is not None and m.config is not None
    return reference.encoder(x.reshape(-1, *x.shape[-2:]), m.weights, m.config)[0].reshape(x.shape)


def check(client: httpx.Client, runtime: Runtime, endpoint: str, body: bytes, outcome: tuple[int, str]) -> None:
    started = time.monotonic()
    r = client.post(endpoint, content=body, headers={"Content-Type": "application/json"})
    assert time.monotonic() - started < 5, "a JSON corner must not cost seconds of CPU"
    status, message = outcome
    if status != 200:
        assert_clean_error(r, status, message)
    else:
        assert r.status_code == 200, r.text[:300]
        doc = r.json()
        got = doc["outputs"][0]["data"] if is_v2(endpoint) else doc["output"]
        want = expected_output(endpoint, body, runtime)
        np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, atol=1e-4)
    assert_still_right(client, endpoint, runtime)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("build", "outcomes"), ROWS)
def test_json_edge_is_a_4xx_naming_the_place_or_a_right_200(
    client: httpx.Client, runtime: Runtime, endpoint: str, build: Build, outcomes: Outcome
) -> None:
    check(client, runtime, endpoint, build(endpoint), outcomes[endpoint])


DUPLICATE = "{}: given more than once in one object; send each field once"


def v2_error(message: str) -> Outcome:
    return dict.fromkeys(V2_ENDPOINTS, (400, message))


V2_OK = dict.fromkeys(V2_ENDPOINTS, OK)

V2_ROWS: list[Any] = [
    # inputs[i] may carry keys of its own (the protocol leaves the object open): ignored, whatever they are
    pytest.param(lead_input(b'"\\u0000": 1'), V2_OK, id="input-key-nul"),
    pytest.param(lead_input(b'"' + b"k" * 1_000_000 + b'": 1'), V2_OK, id="input-key-1mb"),
    pytest.param(lead_input(many_keys(100_000)), V2_OK, id="input-keys-100000"),
    # a key repeated in inputs[i] is named, before the copy orjson keeps breaks another rule ("name" read as gamma)
    pytest.param(lead_input(b'"name": "gamma"'), v2_error(DUPLICATE.format("name")), id="input-duplicate-name"),
    pytest.param(
        lead_input(b'"datatype": "FP64"'), v2_error(DUPLICATE.format("datatype")), id="input-duplicate-datatype"
    ),
    pytest.param(lead_input(b'"shape": [1]'), v2_error(DUPLICATE.format("shape")), id="input-duplicate-shape"),
    pytest.param(lead_input(b'"data": [1]'), v2_error(DUPLICATE.format("data")), id="input-duplicate-data"),
    # values the protocol's schema refuses, which the codec took for absent (found by tests/suites/test_fuzz.py)
    pytest.param(
        lead_input(b'"parameters": []'),
        v2_error("inputs.input: parameters [] are not supported; only binary_data_size or content_type is"),
        id="input-parameters-list",
    ),
    pytest.param(
        lead_input(b'"parameters": false'),
        v2_error("inputs.input: parameters False are not supported; only binary_data_size or content_type is"),
        id="input-parameters-false",
    ),
    pytest.param(
        lead_input(b'"parameters": {"binary_data_size": null}'),
        v2_error("inputs.input: has both `data` and parameters.binary_data_size; send one"),
        id="input-binary-data-size-null",
    ),
    pytest.param(
        lead(b'"outputs": [{"name": "output", "parameters": 0}]'),
        v2_error("outputs.output: parameters 0 are not supported; only binary_data and datatype are"),
        id="output-parameters-zero",
    ),
    pytest.param(
        lead(b'"parameters": {"priority": [1]}'),
        v2_error("parameters.priority: expected a boolean, number or string, got [1]"),
        id="protocol-parameter-list",
    ),
    pytest.param(
        lead(b'"parameters": {"sequence_id": null}'),
        v2_error("parameters.sequence_id: expected a boolean, number or string, got None"),
        id="protocol-parameter-null",
    ),
    # values nested 1,000 deep and echoed in a message: repr went past Python's recursion limit (a 500)
    pytest.param(
        lead(b'"parameters": {"priority": ' + deep(1000) + b"}"),
        v2_error("parameters.priority: expected a boolean, number or string, got [[[[[...]]]]]"),
        id="parameter-1000-deep",
    ),
    pytest.param(lead(b'"id": ' + deep(1000)), v2_error("id: expected a string, got [[[[[...]]]]]"), id="id-1000-deep"),
]


@pytest.mark.parametrize("endpoint", V2_ENDPOINTS)
@pytest.mark.parametrize(("build", "outcomes"), V2_ROWS)
def test_v2_json_edge_is_a_4xx_naming_the_place_or_a_right_200(
    client: httpx.Client, runtime: Runtime, endpoint: str, build: Build, outcomes: Outcome
) -> None:
    check(client, runtime, endpoint, build(endpoint), outcomes[endpoint])


def narrow_rows(rows: int, short: int | None, width: int = 2) -> Build:
    """`rows` rows of `width` numbers (the row `short` one shorter): the text check of app/core/jsontensors.py."""

    def build(endpoint: str) -> bytes:
        x = np.random.default_rng(rows).standard_normal((rows, width)).round(4).tolist()
        if short is not None:
            x[short] = x[short][1:]
        return envelope(endpoint, json.dumps(x).encode(), shape=[rows, width])

    return build


def row_refused(row: int, width: int = 2) -> Outcome:
    message = f"row {row} has {width - 1} elements, expected {width}"
    return {LN: (422, f"data: {message}"), LN_V2: (400, f"inputs.input.data: {message}")}


@pytest.mark.parametrize("endpoint", [LN, LN_V2])
@pytest.mark.parametrize(
    ("build", "outcomes"),
    [
        pytest.param(narrow_rows(70_000, None), {LN: OK, LN_V2: OK}, id="70000-rows-of-two"),
        pytest.param(narrow_rows(70_000, 69_999), row_refused(69_999), id="last-row-short"),
        pytest.param(narrow_rows(70_000, 35_000), row_refused(35_000), id="middle-row-short"),
        # An empty row among rows of one number left the text of a rectangular array: a reshape error, a 500
        pytest.param(narrow_rows(70_000, 69_999, width=1), row_refused(69_999, width=1), id="rows-of-one-last-empty"),
    ],
)
def test_many_narrow_rows_are_a_right_200_or_a_4xx_naming_the_row(
    client: httpx.Client, runtime: Runtime, endpoint: str, build: Build, outcomes: Outcome
) -> None:
    # A million such rows took 2.5 s of CPU to decode, valid or ragged; the wide rows of as many bytes 28 ms.
    check(client, runtime, endpoint, build(endpoint), outcomes[endpoint])
