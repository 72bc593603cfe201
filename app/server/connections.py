"""Close the connection after answering a request whose body was not read to its end.

An HTTP/1.1 connection can carry the next request only once this one's body has arrived, so uvicorn
keeps reading it, and its keep-alive timer restarts with every byte: a client that trickled the body
of a request answered without reading it (a 404, a 405, a GET with a body, a 413 from Content-Length)
held its socket for ever, measured. `Connection: close` on such an answer makes uvicorn close the
socket once the answer is sent. The routes that read bodies stop at NORMSERVE_BODY_TIMEOUT_S
(app/server/api/body.py) and their 408 goes out through here too.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CLOSE = (b"connection", b"close")


def has_body(scope: Scope) -> bool:
    """Whether the request announces a body: a non-zero Content-Length, or any Transfer-Encoding (chunked)."""
    for key, value in scope["headers"]:
        if key == b"transfer-encoding" or (key == b"content-length" and value.strip(b" \t0") != b""):
            return True
    return False


class CloseUnreadBodies:
    """Pure ASGI middleware (it never buffers a body): adds `Connection: close` to an answer sent too early."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not has_body(scope):
            await self.app(scope, receive, send)
            return
        read = False  # the body's last part (or the client's disconnect) has been received

        async def receiving() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                read = True
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and not read:
                message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        await self.app(scope, receiving, sending)
