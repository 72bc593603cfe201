"""An HTTP request's body counted in the worker's budget of body bytes in flight (app/server/budget.py).

`BudgetMiddleware` counts an HTTP body when the route starts reading it (a route that never reads it,
a 404, holds none of it: uvicorn stops reading at 64 KiB) and gives the bytes back when the answer is
sent: the whole announced length (Content-Length) before any of it is read, a chunked body as it grows.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import BudgetExhausted
from app.server.budget import Budget


async def _discard(receive: Receive) -> None:
    """Read a refused body to its end, keeping none of it: a client still sending its body reads no early
    answer (httpx: ReadError), so the 503 goes out after it, on a connection that stays open. The route's
    NORMSERVE_BODY_TIMEOUT_S bounds how long that takes."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


def content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BudgetMiddleware:
    """Pure ASGI: an HTTP request's body counted in the worker's Budget from its first read to its answer's end."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        budget: Budget = scope["app"].state.worker.budget
        announced = content_length(scope)
        counted = 0  # bytes of this request in the budget
        seen = 0  # bytes of its body received

        async def receiving() -> Message:
            nonlocal counted, seen
            if counted == 0 and announced:  # first read: the whole announced length, before any of it is read
                try:
                    await budget.take(announced)
                except BudgetExhausted:
                    await _discard(receive)
                    raise
                counted = announced
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > counted:  # chunked, or more than announced (uvicorn then fails the request anyway)
                budget.grow(seen - counted)
                counted = seen
            return message

        try:
            await self.app(scope, receiving, send)
        finally:
            budget.give(counted)
