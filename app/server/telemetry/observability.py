"""Per-request observability as pure ASGI middleware: X-Request-ID, then the request's record
(app/server/telemetry/record.py: Prometheus request metrics, the JSON log line, the trace).

Pure ASGI rather than BaseHTTPMiddleware, which buffers bodies: the routes read the raw stream
themselves (size limits, 413 before the whole body is in memory), and the wrappers here only count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.types import Message, Receive, Scope, Send

from app.server.asgi import HttpMiddleware, with_header
from app.server.telemetry import metrics, record, tracing

HEADER = "X-Request-ID"
_HEADER_KEY = b"x-request-id"
_INCOMING = (_HEADER_KEY, b"traceparent", b"tracestate")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


@dataclass(eq=False)
class RequestInfo(record.RequestRecord):
    """An HTTP request's record: the Worker names its model, on the loop or in a thread; the response its status."""

    status: int = 500  # until the response starts: an app that raises past every handler answered 500
    scope: Scope = field(default_factory=dict, repr=False)

    def answer(self) -> record.Http:
        method = self.scope["method"]
        path = self.scope["path"][:256]  # without the query string, which may carry data
        return record.Http(method if method in _METHODS else "other", _route(self.scope), path, self.status)


def request_id(scope: Scope) -> str | None:
    """The id of the request being served, for responses built outside this middleware (unexpected 500s)."""
    value = scope.get("state", {}).get("request_id")
    return value if isinstance(value, str) else None


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")  # as HTTP headers are


def _route(scope: Scope) -> str:
    # FastAPI stores the matched APIRoute in the scope: its template bounds the label's values.
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    # Plain routes (/openapi.json) and mounts (/static, /docs/assets) leave only the endpoint they matched:
    # the route that owns it names the label. A path that no route matched has no endpoint.
    endpoint, app = scope.get("endpoint"), scope.get("app")
    if endpoint is not None and app is not None:
        for route in app.routes:
            if endpoint is getattr(route, "endpoint", None) or endpoint is getattr(route, "app", None):
                return str(route.path)
    return metrics.UNMATCHED


class ObservabilityMiddleware(HttpMiddleware):
    """Wraps every HTTP request: echoes or sets X-Request-ID, then records and logs the answer."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        rid, parent, state = record.incoming(scope["headers"], _INCOMING)
        trace = tracing.start(_latin1(parent), _latin1(state))
        info = RequestInfo(record.request_id_from(rid), trace=trace, start=start, scope=scope)
        scope.setdefault("state", {})["request_id"] = info.request_id
        header = (_HEADER_KEY, info.request_id.encode("ascii"))

        async def receive_counted() -> Message:
            message = await receive()
            info.bytes_in += len(message.get("body", b""))
            return message

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                info.status = message["status"]
                message = with_header(message, header)
            elif message["type"] == "http.response.body":
                info.bytes_out += len(message.get("body", b""))
            await send(message)

        token = record.enter(info)
        try:
            await self.app(scope, receive_counted, send_tagged)
        finally:
            record.leave(token)
            info.finish_as(info.answer())
