"""app/server/http/budget.py: the size an HTTP request announces, counted before its body is read.

The middleware on real sockets, refusing and giving bytes back: tests/suites/test_memory_budget.py."""

from __future__ import annotations

import pytest

from app.server.http.budget import content_length


@pytest.mark.parametrize(
    ("headers", "expected"),
    [([], None), ([(b"content-length", b"123")], 123), ([(b"content-length", b"-1")], None), ([(b"x", b"1")], None)],
    ids=["none", "length", "negative", "other-header"],
)
def test_content_length_is_the_announced_size(headers: list[tuple[bytes, bytes]], expected: int | None) -> None:
    assert content_length({"type": "http", "headers": headers}) == expected
