"""app/server/telemetry/tracing.py: the spans a real server exports to a real OTLP/HTTP receiver, over HTTP and gRPC, and the
trace ids in its log lines; with tracing off, nothing sent and no trace id unless a traceparent came in.
"""

from __future__ import annotations

import contextvars
import itertools
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

from app.server.telemetry import tracing
from app.server.telemetry.timer import InferTimer
from tests.live_server import cli_server, server_env, wait_every_worker_ready
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server
from tests.server.otlp_receiver import Receiver, Span, otlp_receiver, tracing_env

SERVER_KIND = 2  # opentelemetry.proto's SpanKind SERVER
ERROR = 2  # its Status.code for an error
STAGES = ["queue", "decode", "inference", "encode"]
SERVICE = "normserve-test"


def traceparent() -> tuple[str, str, str]:
    """A caller's (traceparent, trace id, span id), fresh per test so that traces never mix."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def traced(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    env = tracing_env(receiver, OTEL_SERVICE_NAME=SERVICE)
    with grpc_server(tmp_path_factory.mktemp("traced"), env) as server:
        yield server


@pytest.fixture(scope="module")
def untraced(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    """An endpoint is set, but OTEL_SDK_DISABLED=true: tracing is off, as with no endpoint at all."""
    env = tracing_env(receiver, OTEL_SDK_DISABLED="true")
    with grpc_server(tmp_path_factory.mktemp("untraced"), env) as server:
        yield server


def _normalize(server: GrpcServer, headers: dict[str, str], request_id: str) -> None:
    r = httpx.post(server.base + "/normalize", json={"data": [[0.2, 0.1, 0.3]]}, headers=headers)
    assert r.status_code == 200 and r.headers["x-request-id"] == request_id


def _v2_infer(server: GrpcServer, headers: dict[str, str], request_id: str) -> None:
    with th.InferenceServerClient(server.base.removeprefix("http://")) as client:
        inp = th.InferInput("input", [2, 3], "FP32")
        inp.set_data_from_numpy(np.ones((2, 3), np.float32))
        client.infer("layernorm", [inp], headers=headers)


def _grpc_infer(server: GrpcServer, headers: dict[str, str], request_id: str) -> None:
    with tg.InferenceServerClient(server.address) as client:
        inp = tg.InferInput("input", [2, 3], "FP32")
        inp.set_data_from_numpy(np.ones((2, 3), np.float32))
        client.infer("layernorm", [inp], request_id=request_id, headers=headers)


HTTP_ATTRS = {"http.request.method": "POST", "http.response.status_code": 200}
CALLS: list[tuple[str, Callable[[GrpcServer, dict[str, str], str], None], str, dict[str, Any]]] = [
    ("normalize", _normalize, "POST /normalize", {**HTTP_ATTRS, "http.route": "/normalize", "url.path": "/normalize"}),
    (
        "v2-infer",
        _v2_infer,
        "POST /v2/models/{name}/infer",
        {**HTTP_ATTRS, "http.route": "/v2/models/{name}/infer", "url.path": "/v2/models/layernorm/infer"},
    ),
    (
        "grpc-infer",
        _grpc_infer,
        "inference.GRPCInferenceService/ModelInfer",
        {"rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService", "rpc.method": "ModelInfer"},
    ),
]
SHAPES = {"normalize": [1, 3], "v2-infer": [2, 3], "grpc-infer": [2, 3]}


def _assert_stages(server: Span, children: list[Span]) -> None:
    """queue, decode, inference, encode: children of the server span, each starting where the previous ended."""
    assert [c.name for c in children] == STAGES
    assert all(c.parent_span_id == server.span_id and c.trace_id == server.trace_id for c in children)
    assert server.start <= children[0].start and children[-1].end <= server.end
    assert all(a.end == b.start for a, b in itertools.pairwise(children))
    assert all(c.start <= c.end for c in children)


@pytest.mark.parametrize(("label", "call", "name", "attributes"), CALLS, ids=[c[0] for c in CALLS])
def test_a_traced_request_is_a_server_span_under_its_traceparent_with_its_stages(
    traced: GrpcServer, receiver: Receiver, label: str, call: Any, name: str, attributes: dict[str, Any]
) -> None:
    parent, trace_id, parent_span = traceparent()
    request_id = f"traced-{label}"
    call(traced, {"traceparent": parent, "tracestate": "vendor=abc", "x-request-id": request_id}, request_id)
    server, *children = receiver.trace(trace_id, 5)
    assert (server.name, server.kind, server.parent_span_id, server.trace_state) == (
        name,
        SERVER_KIND,
        parent_span,
        "vendor=abc",
    )
    assert attributes.items() <= server.attributes.items()
    assert server.attributes["normserve.model.name"] == "layernorm" and server.attributes["normserve.model.version"]
    assert server.attributes["normserve.input.shape"] == SHAPES[label]
    assert server.attributes["normserve.request_id"] == request_id
    assert server.resource["service.name"] == SERVICE and server.resource["process.pid"] == traced.proc.pid
    _assert_stages(server, children)
    line = traced.request_line(request_id)
    assert (line["trace_id"], line["span_id"]) == (trace_id, server.span_id)


def test_a_request_without_traceparent_starts_a_trace_named_in_its_log_line(
    traced: GrpcServer, receiver: Receiver
) -> None:
    _normalize(traced, {"X-Request-ID": "no-parent"}, "no-parent")
    line = traced.request_line("no-parent")
    server, *children = receiver.trace(line["trace_id"], 5)
    assert server.parent_span_id == "" and server.span_id == line["span_id"]
    _assert_stages(server, children)


@pytest.mark.parametrize(
    ("body", "status", "stages", "error"),
    [
        ({"inputs": [{"name": "input", "shape": [2], "datatype": "FP32", "data": [1.0]}]}, 400, ["queue"], False),
        ({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}, 200, STAGES, False),
    ],
    ids=["bad-tensor-400", "ok-200"],
)
def test_a_failed_decode_keeps_the_stages_it_reached_and_a_4xx_is_no_span_error(
    traced: GrpcServer, receiver: Receiver, body: dict[str, Any], status: int, stages: list[str], error: bool
) -> None:
    parent, trace_id, _ = traceparent()
    r = httpx.post(traced.base + "/v2/models/layernorm/infer", json=body, headers={"traceparent": parent})
    assert r.status_code == status
    server, *children = receiver.trace(trace_id, 1 + len(stages))
    assert [c.name for c in children] == stages
    assert server.attributes["http.response.status_code"] == status and (server.status == ERROR) is error


def test_an_invalid_traceparent_starts_a_new_trace(traced: GrpcServer, receiver: Receiver) -> None:
    bad = "00-" + "0" * 32 + "-" + "1" * 16 + "-01"  # an all-zero trace id is invalid
    _normalize(traced, {"traceparent": bad, "X-Request-ID": "bad-parent"}, "bad-parent")
    line = traced.request_line("bad-parent")
    assert line["trace_id"] != "0" * 32
    assert receiver.trace(line["trace_id"], 5)[0].parent_span_id == ""


@pytest.mark.parametrize(("label", "call", "name", "attributes"), CALLS, ids=[c[0] for c in CALLS])
def test_off_nothing_is_sent_and_only_a_traceparent_puts_ids_in_the_log(
    untraced: GrpcServer, receiver: Receiver, label: str, call: Any, name: str, attributes: dict[str, Any]
) -> None:
    parent, trace_id, parent_span = traceparent()
    call(untraced, {"x-request-id": f"off-{label}"}, f"off-{label}")
    call(untraced, {"traceparent": parent, "x-request-id": f"off-parent-{label}"}, f"off-parent-{label}")
    assert "trace_id" not in untraced.request_line(f"off-{label}")
    line = untraced.request_line(f"off-parent-{label}")
    assert (line["trace_id"], line["span_id"]) == (trace_id, parent_span)  # the caller's span: no span of ours
    time.sleep(0.5)  # ten export periods of a traced server
    pids = {s.resource["process.pid"] for s in receiver.spans}
    assert untraced.proc.pid not in pids and trace_id not in {s.trace_id for s in receiver.spans}


def test_every_worker_exports_and_flushes_on_shutdown(tmp_path: Path) -> None:
    """Two workers, spans held back for a minute (OTEL_BSP_SCHEDULE_DELAY): only the shutdown's flush sends them."""
    with otlp_receiver() as rx:
        env = server_env({**tracing_env(rx, OTEL_BSP_SCHEDULE_DELAY="60000"), "NORMSERVE_DRAIN_TIMEOUT_S": "1"})
        command = [sys.executable, "-m", "app.cli.main", "serve", "--workers", "2"]  # this checkout's code
        with cli_server(command, env) as server:
            wait_every_worker_ready(server.base)
            for _ in range(40):  # a new connection each: the kernel spreads them over both workers
                assert httpx.post(server.base + "/normalize", json={"data": [[1.0, 2.0]]}).status_code == 200
            assert rx.spans == []
        pids = {s.resource["process.pid"] for s in rx.spans if s.name == "POST /normalize"}
        assert len(pids) == 2 and len([s for s in rx.spans if s.name == "POST /normalize"]) == 40
        assert rx.requests[0] == ("/v1/traces", "application/x-protobuf")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1),
        ),
        (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 0),
        ),
        (
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later",
            (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1),
        ),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None),  # version 00 has exactly 4 fields
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", None),  # upper case is invalid
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01", None),
        ("garbage", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_takes_only_a_valid_w3c_traceparent(header: str | None, expected: tuple[int, int, int] | None) -> None:
    parsed = tracing.parse(header, "k=v")
    assert (parsed[:3] if parsed else None) == expected


def test_off_without_traceparent_a_request_creates_no_trace_at_all() -> None:
    """No provider in this process: start() is None and the InferTimer's hook finds nothing to fill."""
    assert tracing.STATE.tracer is None

    def request() -> tuple[Any, Any]:
        trace = tracing.start(None)
        InferTimer()
        return trace, tracing._active.get()

    assert contextvars.copy_context().run(request) == (None, None)
    parent, *_ = traceparent()
    trace, active = contextvars.copy_context().run(lambda: (tracing.start(parent), tracing._active.get()))
    assert trace is active and trace is not None and trace.parent is not None
