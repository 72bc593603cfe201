"""COMPARISON CODE, not part of normserve: the HTTP floor, an ASGI app that reads the body and answers a constant.

Served by the same uvicorn command line as normserve (uvloop, httptools, one worker, no access log) and
fed the same POST by the same client, its server CPU per request is what HTTP on one Python worker
costs before any framework, parsing or computing: the floor the /normalize JSON rows are a multiple of.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
ANSWER = b'{"ok":true}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(
    scope: Message, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start, and uvicorn's "auto" falls back quietly
        return
    more = True
    while more:  # every byte of the body is read, as a real route would
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
