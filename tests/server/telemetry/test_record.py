"""app/server/telemetry/record.py: one request record for HTTP and gRPC. Its log line (the same fields, in the same
order, for both transports), its Prometheus request metrics, its server span's name and attributes, the trace ids a
caller's traceparent puts in the line, the one scan of headers or metadata for the id and the traceparent, and
note_model naming the model of the request being served, HTTP or gRPC.

Over real servers, the middleware's lines are tests/server/telemetry/test_observability.py's, gRPC's
tests/server/api/v2/grpc/test_calls.py's, the spans tests/server/telemetry/test_tracing.py's.
"""

from __future__ import annotations

import contextvars
import json
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app.server.api.v2.grpc import calls
from app.server.telemetry import logs, metrics, observability, record, tracing
from tests.server.log_records import captured

INFER = "inference.GRPCInferenceService"
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@dataclass(eq=False)
class Answered(record.RequestRecord):
    """A record whose transport answered as given (the middleware's and gRPC's records work it out as they run)."""

    given: record.Answer | None = None

    def finish(self) -> None:
        assert self.given is not None
        self.finish_as(self.given)


# (answer, model, the log line's fields after request_id and before duration_ms, the counter and its labels)
CASES: list[tuple[record.Answer, str | None, dict[str, Any], str, dict[str, str]]] = [
    (
        record.Http("POST", "/v2/models/{name}/infer", "/v2/models/layernorm/infer", 200),
        "layernorm",
        {"method": "POST", "route": "/v2/models/{name}/infer", "path": "/v2/models/layernorm/infer", "status": 200},
        "normserve_http_requests_total",
        {"method": "POST", "route": "/v2/models/{name}/infer", "status": "200"},
    ),
    (
        record.Http("other", metrics.UNMATCHED, "/no/such/route", 404),
        None,
        {"method": "other", "route": "unmatched", "path": "/no/such/route", "status": 404},
        "normserve_http_requests_total",
        {"method": "other", "route": "unmatched", "status": "404"},
    ),
    (
        record.Grpc(INFER, "ModelInfer", 0, "OK"),
        "layernorm",
        {
            "method": "GRPC",
            "route": f"/{INFER}/ModelInfer",
            "path": f"/{INFER}/ModelInfer",
            "status": 0,
            "grpc_status": "OK",
        },
        "normserve_grpc_requests_total",
        {"service": INFER, "method": "ModelInfer", "model": "layernorm", "code": "OK"},
    ),
    (
        record.Grpc(INFER, "ModelReady", 5, "NOT_FOUND"),
        "",  # a name no model has: "" on the metric, null in the line
        {
            "method": "GRPC",
            "route": f"/{INFER}/ModelReady",
            "path": f"/{INFER}/ModelReady",
            "status": 5,
            "grpc_status": "NOT_FOUND",
        },
        "normserve_grpc_requests_total",
        {"service": INFER, "method": "ModelReady", "model": "", "code": "NOT_FOUND"},
    ),
]
CASE_IDS = ["http-200", "http-404-unmatched", "grpc-ok", "grpc-not-found"]


def line_of(entry: logging.LogRecord) -> dict[str, Any]:
    """The access line as JsonFormatter writes it, in its order."""
    return dict(json.loads(logs.JsonFormatter().format(entry)))


@pytest.mark.parametrize(("answer", "model", "fields", "counter", "labels"), CASES, ids=CASE_IDS)
def test_finishing_a_request_counts_it_and_writes_one_line_with_the_transports_fields(
    answer: record.Answer, model: str | None, fields: dict[str, Any], counter: str, labels: dict[str, str]
) -> None:
    before = REGISTRY.get_sample_value(counter, labels) or 0.0
    duration = counter.replace("requests_total", "request_duration_seconds_count")
    duration_labels = {k: v for k, v in labels.items() if k != "model"}  # gRPC's histogram has no model
    durations = REGISTRY.get_sample_value(duration, duration_labels) or 0.0
    with captured(logs.ACCESS.name) as records:
        Answered("rid-1", model, bytes_in=10, bytes_out=20, given=answer).finish()
    assert REGISTRY.get_sample_value(counter, labels) == before + 1
    assert REGISTRY.get_sample_value(duration, duration_labels) == durations + 1
    (entry,) = records
    line = line_of(entry)
    assert 0 <= line.pop("duration_ms") < 1000 and line.pop("ts")
    assert list(line.items()) == [
        ("level", "info"),
        ("logger", "normserve.access"),
        ("msg", "request"),
        ("request_id", "rid-1"),
        *fields.items(),
        ("model", model or None),
        ("bytes_in", 10),
        ("bytes_out", 20),
    ]


@pytest.mark.parametrize(("answer", "model", "fields", "counter", "labels"), CASES, ids=CASE_IDS)
def test_a_callers_traceparent_names_its_trace_and_span_in_the_line(
    answer: record.Answer, model: str | None, fields: dict[str, Any], counter: str, labels: dict[str, str]
) -> None:
    # Tracing is off in this process: the caller's ids alone. Started in a context of its own, as each request is.
    trace = contextvars.copy_context().run(tracing.start, f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    with captured(logs.ACCESS.name) as records:
        Answered("rid-2", model, trace=trace, given=answer).finish()
    (entry,) = records
    assert {k: line_of(entry)[k] for k in ("request_id", "trace_id", "span_id")} == {
        "request_id": "rid-2",
        "trace_id": CALLER_TRACE,
        "span_id": CALLER_SPAN,
    }


def test_with_access_lines_off_a_request_is_still_counted() -> None:
    labels = {"method": "GET", "route": "/v2/health/live", "status": "200"}
    before = REGISTRY.get_sample_value("normserve_http_requests_total", labels) or 0.0
    with captured(logs.ACCESS.name, level=logging.WARNING) as records:
        Answered("rid-3", given=record.Http("GET", "/v2/health/live", "/v2/health/live", 200)).finish()
    assert records == []
    assert REGISTRY.get_sample_value("normserve_http_requests_total", labels) == before + 1


@pytest.mark.parametrize(
    ("answer", "span"),
    [
        (
            record.Http("POST", "/v2/models/{name}/infer", "/v2/models/x/infer", 200),
            (
                "POST /v2/models/{name}/infer",
                {
                    "http.request.method": "POST",
                    "url.path": "/v2/models/x/infer",
                    "http.response.status_code": 200,
                    "normserve.request_id": "rid",
                    "http.route": "/v2/models/{name}/infer",
                },
                None,
            ),
        ),
        (
            record.Http("other", metrics.UNMATCHED, "/nowhere", 503),
            (
                "other",
                {
                    "http.request.method": "_OTHER",
                    "url.path": "/nowhere",
                    "http.response.status_code": 503,
                    "normserve.request_id": "rid",
                },
                "503",
            ),
        ),
        (
            record.Grpc(INFER, "ModelInfer", 3, "INVALID_ARGUMENT"),
            (
                f"{INFER}/ModelInfer",
                {
                    "rpc.system": "grpc",
                    "rpc.service": INFER,
                    "rpc.method": "ModelInfer",
                    "rpc.grpc.status_code": 3,
                    "normserve.request_id": "rid",
                },
                None,
            ),
        ),
        (
            record.Grpc(INFER, "ModelInfer", 14, "UNAVAILABLE"),
            (
                f"{INFER}/ModelInfer",
                {
                    "rpc.system": "grpc",
                    "rpc.service": INFER,
                    "rpc.method": "ModelInfer",
                    "rpc.grpc.status_code": 14,
                    "normserve.request_id": "rid",
                },
                "UNAVAILABLE",
            ),
        ),
    ],
    ids=["http-route", "http-unmatched-5xx-error", "grpc-4xx-like-no-error", "grpc-unavailable-error"],
)
def test_the_server_span_is_named_and_attributed_in_the_transports_terms(
    answer: record.Answer, span: record.Span
) -> None:
    assert answer.span("rid") == span


HTTP_KEYS = (b"x-request-id", b"traceparent", b"tracestate")
GRPC_KEYS = ("x-request-id", "traceparent", "tracestate")


@pytest.mark.parametrize(
    ("pairs", "keys", "found"),
    [
        ([], HTTP_KEYS, (None, None, None)),
        (
            [
                (b"x-request-id", b"first"),
                (b"traceparent", b"tp-1"),
                (b"x-request-id", b"second"),
                (b"traceparent", b"tp-2"),
            ],
            HTTP_KEYS,
            (b"first", b"tp-2", None),
        ),
        ([("tracestate", "k=v"), ("other", "x"), ("x-request-id", "id")], GRPC_KEYS, ("id", None, "k=v")),
    ],
    ids=["none", "http-first-id-last-traceparent", "grpc-metadata"],
)
def test_one_scan_finds_the_first_request_id_and_the_last_trace_headers(
    pairs: list[tuple[Any, Any]], keys: tuple[Any, Any, Any], found: tuple[Any, ...]
) -> None:
    assert record.incoming(pairs, keys) == found


@pytest.mark.parametrize(
    ("sent", "kept"),
    [(b"abc-123", True), (b"x" * 128, True), (b"x" * 129, False), (b"has space", False), (None, False)],
    ids=["plain", "longest", "too-long", "space", "none"],
)
def test_a_clients_id_is_kept_only_when_short_and_plain(sent: bytes | None, kept: bool) -> None:
    got = record.request_id_from(sent)
    if kept:
        assert sent is not None and got == sent.decode()
    else:
        assert len(got) == 32 and int(got, 16) >= 0  # a new uuid4 hex


def test_a_new_request_id_is_a_uuid4_hex_each_time() -> None:
    ids = [record.new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert (parsed.hex, parsed.version, parsed.variant) == (rid, 4, uuid.RFC_4122)


@pytest.mark.parametrize(
    "transport",
    [
        lambda rid: observability.RequestInfo(rid, scope={"method": "POST", "path": "/normalize"}),
        lambda rid: calls.Call(INFER, "ModelInfer", rid),
    ],
    ids=["http", "grpc"],
)
def test_note_model_names_the_model_of_the_current_request_from_a_worker_thread(
    transport: Callable[[str], record.RequestRecord],
) -> None:
    record.note_model("outside-any-request")  # no request is being served: noted nowhere
    mine, other = transport("mine"), transport("other")

    def serve(current: record.RequestRecord, model: str) -> None:
        token = record.enter(current)
        try:  # the threadpool copies the context into the inference thread, as anyio.to_thread does
            with ThreadPoolExecutor(1) as pool:
                pool.submit(contextvars.copy_context().run, record.note_model, model).result()
        finally:
            record.leave(token)

    contextvars.copy_context().run(serve, mine, "layernorm")
    contextvars.copy_context().run(serve, other, "encoder")
    assert (mine.model, other.model) == ("layernorm", "encoder")
