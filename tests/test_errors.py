"""app/errors.py: every domain error's HTTP status for both protocols, the message that names its field, and the
message made printable and bounded for a client."""

from __future__ import annotations

import pytest

from app.errors import (
    MESSAGE_LIMIT,
    BodyTimeout,
    ExtensionNotSupported,
    InvalidInput,
    MalformedBody,
    ModelControlDisabled,
    ModelNotFound,
    NormserveError,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Timeout,
    UnsupportedMediaType,
    printable,
    shown,
    status_for,
)


class _UnlistedInvalidInput(InvalidInput):
    """A subclass the table does not name: its status is its nearest listed ancestor's."""


@pytest.mark.parametrize(
    ("cls", "rest", "v2"),
    [
        (MalformedBody, 400, 400),
        (InvalidInput, 422, 400),
        (PayloadTooLarge, 413, 413),
        (UnsupportedMediaType, 415, 415),
        (BodyTimeout, 408, 408),
        (ModelNotFound, 404, 404),
        (ModelControlDisabled, 403, 403),
        (Overloaded, 503, 503),
        (NotReady, 503, 503),
        (Timeout, 504, 504),
        (NormserveError, 500, 500),
        (_UnlistedInvalidInput, 422, 400),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_status_for_maps_each_error_class_per_protocol(cls: type[NormserveError], rest: int, v2: int) -> None:
    exc = cls("something is wrong", "field")
    assert (status_for(exc, v2=False), status_for(exc, v2=True)) == (rest, v2)


def test_an_extension_not_supported_is_a_400_naming_the_extension() -> None:
    exc = ExtensionNotSupported("cuda_shared_memory")
    assert (status_for(exc, v2=False), status_for(exc, v2=True), exc.extension) == (400, 400, "cuda_shared_memory")
    assert exc.message == (
        "the cuda_shared_memory extension is not supported: normserve reads every tensor from the request itself "
        "(binary data over HTTP, raw_input_contents over gRPC)"
    )


def test_malformed_body_is_an_invalid_input_but_keeps_its_own_status() -> None:
    exc = MalformedBody("not valid JSON", "body")
    assert isinstance(exc, InvalidInput)
    assert status_for(exc, v2=False) == 400  # the most specific class wins over InvalidInput's 422


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [(InvalidInput, ValueError), (MalformedBody, ValueError), (ModelNotFound, LookupError), (Timeout, TimeoutError)],
)
def test_errors_are_also_the_builtin_exception_they_mean(cls: type[NormserveError], builtin: type[Exception]) -> None:
    with pytest.raises(builtin):
        raise cls("x")


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("eps", "eps: expected a finite number > 0, got 0"),
        ("parameters.eps", "parameters.eps: expected a finite number > 0, got 0"),
        (None, "expected a finite number > 0, got 0"),
        ("", "expected a finite number > 0, got 0"),
    ],
    ids=["rest-field", "v2-field", "no-field", "empty-field"],
)
def test_message_is_prefixed_with_the_field_when_there_is_one(field: str | None, message: str) -> None:
    exc = InvalidInput("expected a finite number > 0, got 0", field)
    assert (str(exc), exc.message, exc.field) == (message, message, field)


def _nested(depth: int) -> object:
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("FP32", "'FP32'"),
        (None, "None"),
        ({"b": 1, "a": [1, 2]}, "{'a': [1, 2], 'b': 1}"),
        (list(range(20)), "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ...]"),
        ("x" * 200, "'" + "x" * 57 + "..." + "x" * 58 + "'"),
        (_nested(1000), "[[[[[...]]]]]"),  # plain repr: RecursionError, a 500
    ],
    ids=["string", "null", "object", "long-list", "long-string", "nested-1000"],
)
def test_shown_quotes_a_client_value_bounded_in_depth_and_length(value: object, text: str) -> None:
    assert shown(value) == text


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("eps: expected a finite number > 0, got -1.0", "eps: expected a finite number > 0, got -1.0"),
        ("caf\u00e9 \u00fc \u4e2d", "caf\u00e9 \u00fc \u4e2d"),  # printable beyond ASCII stays as it is
        ("\u202edata: unknown field", "\\u202edata: unknown field"),  # bidi override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\nbreak\ttab\r", "line\\nbreak\\ttab\\r"),
        ("nul\x00 and bell\x07", "nul\\x00 and bell\\x07"),
    ],
    ids=["plain", "non-ascii", "bidi", "zero-width", "whitespace", "control"],
)
def test_printable_escapes_what_could_disguise_a_message(message: str, shown: str) -> None:
    assert printable(message) == shown


@pytest.mark.parametrize(
    ("message", "limit", "shown"),
    [
        ("k" * MESSAGE_LIMIT, MESSAGE_LIMIT, "k" * MESSAGE_LIMIT),
        ("k" * 10_000, MESSAGE_LIMIT, "k" * (MESSAGE_LIMIT - 1) + "\u2026"),
        ("abcdef", 4, "abc\u2026"),
        ("\u202e" * 10, 20, "\\u202e" * 3 + "\\\u2026"),  # bounded after escaping, even mid-escape
    ],
    ids=["at-the-limit", "over-the-limit", "own-limit", "escaped-then-cut"],
)
def test_printable_bounds_the_length(message: str, limit: int, shown: str) -> None:
    assert printable(message, limit) == shown and len(shown) <= limit
