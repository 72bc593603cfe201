"""`Connection: close` on the answers after which a kept-alive connection must not carry another request.

- An answer sent before its request's body ended. An HTTP/1.1 connection can carry the next request only
  once this one's body has arrived, so uvicorn keeps reading it, and its keep-alive timer restarts with
  every byte: a client that trickled the body of a request answered without reading it (a 404, a 405, a
  GET with a body, a 413 from Content-Length) held its socket for ever, measured. The routes that read
  bodies stop at NORMSERVE_BODY_TIMEOUT_S (app/server/http/body.py) and their 408 goes out through here too.
- A 503 sent while the worker drains: the worker is about to close its connections, and a client that sent
  its next request on this one just before got no answer at all (3 of 60 requests just after SIGTERM).
- Any 500: uvicorn closes the connection after an unexpected error, and a client that was not told so
  failed its next, unrelated request. (Starlette's ServerErrorMiddleware answers outside this middleware:
  app/server/http/errors.py `unexpected` adds the header to that 500 itself.)

`Connection: close` on an answer makes uvicorn close the socket once the answer is sent, and tells the client.
"""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from app.server.asgi import HttpMiddleware, with_header

CLOSE = (b"connection", b"close")


def has_body(scope: Scope) -> bool:
    """Whether the request announces a body: a non-zero Content-Length, or any Transfer-Encoding (chunked)."""
    for key, value in scope["headers"]:
        if key == b"transfer-encoding" or (key == b"content-length" and value.strip(b" \t0") != b""):
            return True
    return False


def closes(status: int, scope: Scope) -> bool:
    """Whether an answer of this status ends the connection whatever the body: a 500, or a 503 while draining."""
    if status == 500:
        return True
    return status == 503 and bool(scope["app"].state.worker.admission.draining)


class CloseUnreadBodies(HttpMiddleware):
    """Pure ASGI middleware (it never buffers a body): adds `Connection: close` to an answer sent too early,
    and to a 500 or a draining 503 (the module's docstring)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        read = not has_body(scope)  # the body's last part (or the client's disconnect) has been received

        async def receiving() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                read = True
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and (not read or closes(message["status"], scope)):
                message = with_header(message, CLOSE)
            await send(message)

        await self.app(scope, receiving, sending)
