"""The skeleton of normserve's pure ASGI middlewares over HTTP requests, which never buffer a body: every other
scope (lifespan) passes through untouched, and an answer's head can take one more header.

HTTP's budget and `Connection: close` (app/server/http) and each request's record (app/server/telemetry) wrap a
request's receive and send this way; telemetry serves every protocol and takes nothing from app/server/http, so
the skeleton they share lives here.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HttpMiddleware:
    """Hands an HTTP request to `http` (the subclass's wrapping; the app as it is here), anything else to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def with_header(message: Message, header: tuple[bytes, bytes]) -> Message:
    """An `http.response.start` message with one more header; the app's own message and list stay as they were."""
    return {**message, "headers": [*message.get("headers", ()), header]}
