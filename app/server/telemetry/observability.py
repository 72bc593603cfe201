"""Per-request observability as pure ASGI middleware: X-Request-ID, Prometheus request metrics, the JSON log line,
and the request's trace (app/server/telemetry/tracing.py).

Pure ASGI rather than BaseHTTPMiddleware, which buffers bodies: the routes read the raw stream
themselves (size limits, 413 before the whole body is in memory), and the wrappers here only count.
"""

from __future__ import annotations

import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.server.telemetry import logs, metrics, tracing

HEADER = "X-Request-ID"
_HEADER_KEY = b"x-request-id"
# An id the client sent is echoed into headers and logs only if it is short and plain.
_SAFE_ID = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


@dataclass
class RequestInfo:
    """What the log line learns while the request runs: the Worker names the model, on the loop or in a thread."""

    request_id: str
    model: str | None = None
    status: int = 500  # until the response starts: an app that raises past every handler answered 500
    bytes_in: int = 0
    bytes_out: int = 0
    trace: tracing.Trace | None = None  # with tracing on, or a valid traceparent in


# The threadpool copies the context into the inference thread, so both see the same RequestInfo object.
_current: ContextVar[RequestInfo | None] = ContextVar("normserve_request", default=None)


def request_id(scope: Scope) -> str | None:
    """The id of the request being served, for responses built outside this middleware (unexpected 500s)."""
    value = scope.get("state", {}).get("request_id")
    return value if isinstance(value, str) else None


def note_model(model: str) -> None:
    """Name the model on the current request's log line; called wherever a request picks its model."""
    info = _current.get()
    if info is not None:
        info.model = model


def request_id_from(value: bytes | None) -> str:
    """The client's id if it is short and plain, else a new one (uuid4 hex): for HTTP headers and gRPC alike."""
    return value.decode("ascii") if value is not None and _SAFE_ID.fullmatch(value) else uuid.uuid4().hex


def _incoming_id(scope: Scope) -> str:
    for key, value in scope["headers"]:
        if key == _HEADER_KEY:
            return request_id_from(value)
    return uuid.uuid4().hex


def _trace_headers(scope: Scope) -> tuple[str | None, str | None]:
    """The W3C traceparent and tracestate headers (latin-1, as HTTP headers are)."""
    parent = state = None
    for key, value in scope["headers"]:
        if key == b"traceparent":
            parent = value.decode("latin-1")
        elif key == b"tracestate":
            state = value.decode("latin-1")
    return parent, state


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


class ObservabilityMiddleware:
    """Wraps every HTTP request: echoes or sets X-Request-ID, then records and logs the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        info = RequestInfo(_incoming_id(scope))
        info.trace = tracing.start(*_trace_headers(scope))
        scope.setdefault("state", {})["request_id"] = info.request_id
        header = (_HEADER_KEY, info.request_id.encode("ascii"))

        async def receive_counted() -> Message:
            message = await receive()
            info.bytes_in += len(message.get("body", b""))
            return message

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                info.status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), header]}
            elif message["type"] == "http.response.body":
                info.bytes_out += len(message.get("body", b""))
            await send(message)

        token = _current.set(info)
        try:
            await self.app(scope, receive_counted, send_tagged)
        finally:
            _current.reset(token)
            _record(scope, info, time.perf_counter() - start)


def _record(scope: Scope, info: RequestInfo, seconds: float) -> None:
    """The request's metrics and its one JSON log line."""
    method = scope["method"] if scope["method"] in _METHODS else "other"
    route = _route(scope)
    metrics.observe_request(method, route, info.status, seconds)
    path = scope["path"][:256]  # without the query string, which may carry data
    ids: dict[str, str] = {}
    if info.trace is not None:
        matched = None if route == metrics.UNMATCHED else route
        ids = tracing.finish_http(info.trace, method, matched, path, info.status, info.request_id)
    if logs.access_enabled():
        logs.access(
            {
                "request_id": info.request_id,
                "method": method,
                "route": route,
                "path": path,
                "status": info.status,
                "duration_ms": round(seconds * 1000, 3),
                "model": info.model,
                "bytes_in": info.bytes_in,
                "bytes_out": info.bytes_out,
                **ids,  # trace_id and span_id, when the request has a trace
            }
        )
