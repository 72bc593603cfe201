"""A real OTLP/HTTP receiver on 127.0.0.1: POST /v1/traces, protobuf ExportTraceServiceRequest, as a collector takes it.

It decodes each export with the `opentelemetry-proto` package and keeps every span, flattened, for the
tests to wait on; the server under test exports to it through OTEL_EXPORTER_OTLP_ENDPOINT.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    trace_state: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 2 is SERVER, 1 INTERNAL
    start: int  # ns since the epoch
    end: int
    status: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def spans_of(request: ExportTraceServiceRequest) -> list[Span]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                out.append(
                    Span(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        trace_state=s.trace_state,
                        kind=s.kind,
                        start=s.start_time_unix_nano,
                        end=s.end_time_unix_nano,
                        status=s.status.code,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        resource=resource,
                    )
                )
    return out


class Receiver:
    """The spans received so far, and the raw requests (their path and Content-Type)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.endpoint = ""

    def wait_for(self, found: Callable[[list[Span]], list[Span]], timeout: float = 15) -> list[Span]:
        """The spans `found` picks once it picks any (the server exports in batches, every OTEL_BSP_SCHEDULE_DELAY)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                picked = found(list(self.spans))
            if picked:
                return picked
            time.sleep(0.05)
        raise AssertionError(f"no such spans within {timeout} s; received {[s.name for s in self.spans]}")

    def trace(self, trace_id: str, count: int, timeout: float = 15) -> list[Span]:
        """The spans of one trace once `count` of them are in, sorted by start time."""
        spans = self.wait_for(lambda all_: [s for s in all_ if s.trace_id == trace_id][count - 1 : count], timeout)
        assert spans
        with self.lock:
            return sorted((s for s in self.spans if s.trace_id == trace_id), key=lambda s: (s.start, s.kind != 2))


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            with receiver.lock:
                receiver.requests.append((self.path, self.headers.get("Content-Type", "")))
                receiver.spans.extend(spans_of(request))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test's output is its assertions
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free port of 127.0.0.1; its `endpoint` is the OTEL_EXPORTER_OTLP_ENDPOINT to give."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def tracing_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    """The OTEL_* variables of a server exporting to the receiver at once (a 50 ms batch delay)."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **extra}
