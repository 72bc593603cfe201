"""app/server/http/connections.py: an answer sent before its request's body ended, a 500 and a draining 503 carry
`Connection: close`.

In process, through the middleware's ASGI interface; tests/suites/test_http_abuse.py and
tests/suites/test_slow_clients.py show uvicorn closing those connections on real sockets.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.server.admission import Admission
from app.server.http.connections import CloseUnreadBodies, has_body


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], False),
        ([(b"content-length", b"0")], False),
        ([(b"content-length", b"000")], False),
        ([(b"content-length", b"10")], True),
        ([(b"content-length", b"1")], True),
        ([(b"transfer-encoding", b"chunked")], True),
        ([(b"x-content-length", b"10")], False),
    ],
    ids=["none", "length-0", "length-000", "length-10", "length-1", "chunked", "other-header"],
)
def test_has_body_reads_the_framing_headers(headers: list[tuple[bytes, bytes]], expected: bool) -> None:
    assert has_body({"type": "http", "headers": headers}) is expected


def reader(parts: int) -> Any:
    """An app that reads `parts` messages of the body (0: none), then answers 200."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for _ in range(parts):
            await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    return app


def answer_headers(app: Any, request_headers: list[tuple[bytes, bytes]], body: list[Message]) -> list[Any]:
    """The response headers the middleware lets through, the body arriving as `body`'s messages."""
    sent: list[Message] = []
    incoming = iter(body)

    async def receive() -> Message:
        return next(incoming)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": request_headers}
    asyncio.run(CloseUnreadBodies(app)(scope, receive, send))
    return list(sent[0]["headers"])


LENGTH = [(b"content-length", b"6")]
TWO_PARTS = [
    {"type": "http.request", "body": b"abc", "more_body": True},
    {"type": "http.request", "body": b"def", "more_body": False},
]
CLOSE = (b"connection", b"close")


@pytest.mark.parametrize(
    ("parts_read", "request_headers", "body", "closes"),
    [
        (2, LENGTH, TWO_PARTS, False),  # read to its end: the connection may carry the next request
        (1, LENGTH, TWO_PARTS, True),  # answered halfway (a 413 or a 408)
        (0, LENGTH, TWO_PARTS, True),  # answered unread (a 404, a 405, a 413 from Content-Length)
        (0, [], [], False),  # no body to wait for
        (1, LENGTH, [{"type": "http.disconnect"}], False),  # the client left: nothing more will come
    ],
    ids=["read-whole", "read-half", "unread", "no-body", "client-gone"],
)
def test_an_answer_sent_before_the_body_ended_closes_the_connection(
    parts_read: int, request_headers: list[tuple[bytes, bytes]], body: list[Message], closes: bool
) -> None:
    headers = answer_headers(reader(parts_read), request_headers, body)
    assert (CLOSE in headers) is closes
    assert headers[0] == (b"content-length", b"0")  # the app's own headers are kept, in order


def answering(status: int) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.parametrize(
    ("status", "draining", "closed"),
    [(200, False, False), (200, True, False), (503, False, False), (503, True, True), (500, False, True)],
    ids=["200", "200-draining", "503-ready", "503-draining", "500"],
)
def test_a_500_or_a_503_while_draining_closes_the_connection(status: int, draining: bool, closed: bool) -> None:
    admission = Admission(1)
    admission.draining = draining
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    app = SimpleNamespace(state=SimpleNamespace(worker=SimpleNamespace(admission=admission)))
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "app": app}
    asyncio.run(CloseUnreadBodies(answering(status))(scope, receive, send))
    assert ((b"connection", b"close") in sent[0]["headers"]) is closed
