"""An HTTP request's body counted in the worker's budget of body bytes in flight (app/server/budget.py).

`BudgetMiddleware` admits a body when the route starts reading it (a route that never reads it, a 404,
holds none of it: uvicorn stops reading at 64 KiB), with room promised for its announced length, charges
its bytes as they arrive (the route reads the next part only once they are counted, so uvicorn stops
reading the socket meanwhile), and gives them back when the answer is sent. A compressed body's inflated
bytes are charged by app/server/http/body.py as they inflate. A body the budget cuts for stalling ends
its read at once with 408 (the connection is then closed: its body was not read).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from app.errors import BudgetExhausted
from app.server.asgi import HttpMiddleware
from app.server.budget import Body, Budget

BODY = "normserve.body"  # the scope key of the request's Body account
DISCARDING = "normserve.discarding"  # set once the request was refused: the rest of its body is read, not counted


async def discard(scope: Scope, receive: Receive) -> None:
    """Read a refused body to its end, keeping none of it: a client still sending its body reads no early
    answer (httpx: ReadError), so the 503 goes out after it, on a connection that stays open. The route's
    NORMSERVE_BODY_TIMEOUT_S bounds how long that takes."""
    body: Body | None = scope.get(BODY)
    if scope.get(DISCARDING) or (body is not None and body.complete):  # already read to its end
        return
    scope[DISCARDING] = True
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


def account(request: Request) -> Body | None:
    """The request's Body in the budget, once its body has begun to be read."""
    body: Body | None = request.scope.get(BODY)
    return body


def content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BudgetMiddleware(HttpMiddleware):
    """Pure ASGI: an HTTP request's body counted in the worker's Budget from its first read to its answer's end."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        budget: Budget = scope["app"].state.worker.budget
        body: Body | None = None

        async def receiving() -> Message:
            nonlocal body
            if scope.get(DISCARDING):
                return await receive()
            if body is None:
                body = scope[BODY] = await budget.admit(content_length(scope) or 0)
            if body.was_cut:
                raise body.stall_error()
            try:
                async with asyncio.timeout(None) as body.reading:  # a cut ends it at once
                    message = await receive()
            except TimeoutError:
                if not body.was_cut:
                    raise
                raise body.stall_error() from None
            finally:
                body.reading = None
            size = len(message.get("body", b""))
            body.arrive(size)
            if size:
                await body.charge(size)
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                body.finish()
            return message

        try:
            await self.app(scope, refusing(scope, receiving, receive), send)
        finally:
            if body is not None:
                body.close()


def refusing(scope: Scope, receiving: Receive, receive: Receive) -> Receive:
    """receiving, which on a refusal reads the rest of the body uncounted before the 503 is raised (see discard)."""

    async def guarded() -> Message:
        try:
            return await receiving()
        except BudgetExhausted:
            await discard(scope, receive)
            raise

    return guarded
