"""asgi.py: the middlewares' skeleton hands HTTP requests to `http` and every other scope to the app untouched;
with_header appends one header to an answer's head without changing the app's message."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.server.asgi import HttpMiddleware, with_header

TAG = (b"x-tag", b"wrapped")


class Tagging(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Message) -> None:
            await send(with_header(message, TAG) if message["type"] == "http.response.start" else message)

        await self.app(scope, receive, tagged)


async def answering(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def run(middleware: type[HttpMiddleware], scope_type: str) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(middleware(answering)({"type": scope_type}, receive, send))
    return sent


@pytest.mark.parametrize(
    ("middleware", "scope_type", "headers"),
    [
        (Tagging, "http", [(b"content-length", b"2"), TAG]),
        (Tagging, "lifespan", [(b"content-length", b"2")]),  # not HTTP: `http` never sees it
        (HttpMiddleware, "http", [(b"content-length", b"2")]),  # the skeleton alone passes HTTP through as it is
    ],
)
def test_http_requests_go_through_http_and_other_scopes_pass_untouched(
    middleware: type[HttpMiddleware], scope_type: str, headers: list[tuple[bytes, bytes]]
) -> None:
    start, body = run(middleware, scope_type)
    assert start == {"type": "http.response.start", "status": 200, "headers": headers}
    assert body == {"type": "http.response.body", "body": b"ok"}


@pytest.mark.parametrize(
    ("message", "headers"),
    [
        ({"type": "http.response.start", "status": 503, "headers": [(b"retry-after", b"1")]}, [(b"retry-after", b"1")]),
        ({"type": "http.response.start", "status": 204}, None),  # no headers of its own
    ],
)
def test_with_header_appends_one_header_and_leaves_the_apps_message_as_it_was(
    message: dict[str, Any], headers: list[tuple[bytes, bytes]] | None
) -> None:
    tagged = with_header(message, TAG)
    assert tagged == {**message, "headers": [*(headers or []), TAG]}
    assert message.get("headers") == headers
