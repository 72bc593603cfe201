"""OpenTelemetry traces of HTTP requests and gRPC calls: W3C traceparent in, one server span and its stage spans out.

The spans are built when the request has answered, with the start and end times it had: the server
span from its first byte to its answer, and under it `queue`, `decode`, `inference` and `encode`
from the InferTimer's marks (app/server/telemetry/timer.py), which every protocol already takes for
Triton's statistics. Nothing is timed twice, no span crosses into the inference thread, and the
route template, the model, its version and the input's shape are all known by then.

Off (no OTLP endpoint, or trace_level OFF) a request costs one header scan for `traceparent` and,
when none came, nothing else: no SDK object is created. A valid traceparent still names the trace
in the log line (its trace id, and the caller's span id), so logs join the caller's trace.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import trace as api

from app.server.telemetry import otel
from app.server.telemetry.tracesettings import TraceSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from app.server.telemetry.timer import InferTimer

# W3C Trace Context: version-trace_id-parent_id-flags; version ff is invalid, all-zero ids too.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?")
# The span of each of the InferTimer's stages (Triton's names, its triton.stage attribute).
SPAN_NAMES = {"queue": "queue", "compute_input": "decode", "compute_infer": "inference", "compute_output": "encode"}


class Incoming(NamedTuple):
    """A valid traceparent (and its tracestate): the caller's span."""

    trace_id: int
    span_id: int
    flags: int
    state: str


@dataclass(eq=False)
class Trace:
    """One request's trace while it runs: when it started (both clocks), its caller, its InferTimer."""

    wall_ns: int
    perf_ns: int
    parent: Incoming | None
    timer: InferTimer | None = None

    def wall(self, perf_ns: int) -> int:
        """A perf_counter_ns reading (the InferTimer's) as the epoch time a span takes."""
        return self.wall_ns + perf_ns - self.perf_ns


class Tracing:
    """This worker process's tracing: the provider (None when off) and Triton's trace settings."""

    def __init__(self) -> None:
        self.provider: TracerProvider | None = None
        self.tracer: api.Tracer | None = None
        self.settings = TraceSettings(exporting=False)

    def configure(self, env: Mapping[str, str]) -> None:
        """Set up from the OTEL_* variables: in each worker process's lifespan, after any fork."""
        self.shutdown()
        self.provider = otel.provider(env)
        self.tracer = None if self.provider is None else self.provider.get_tracer("normserve")
        self.settings = TraceSettings(exporting=self.provider is not None)

    def shutdown(self) -> None:
        """Export what is queued (the BatchSpanProcessor's flush), then stop: at the end of the lifespan."""
        if self.provider is not None:
            self.provider.shutdown()
        self.provider, self.tracer = None, None


STATE = Tracing()
_active: ContextVar[Trace | None] = ContextVar("normserve_trace", default=None)


def parse(traceparent: str | None, tracestate: str | None = None) -> Incoming | None:
    """The caller's span from W3C headers, or None for a missing or invalid traceparent (which starts a new trace)."""
    if not traceparent:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return Incoming(int(trace_id, 16), int(span_id, 16), int(flags, 16), tracestate or "")


def start(traceparent: str | None, tracestate: str | None = None) -> Trace | None:
    """The trace of a request that starts now, or None when tracing is off and no traceparent came.

    Each request and each RPC runs in its own task, so the context variable set here is its own."""
    parent = parse(traceparent, tracestate)
    if parent is None and not (STATE.tracer is not None and STATE.settings.any_on):
        return None
    trace = Trace(time.time_ns(), time.perf_counter_ns(), parent)
    _active.set(trace)
    return trace


def note_timer(timer: InferTimer) -> None:
    """The request's InferTimer (the last one wins: V2 restarts its clock once the body is in memory)."""
    trace = _active.get()
    if trace is not None:
        trace.timer = timer


def finish(trace: Trace | None, name: str, attributes: dict[str, Any], error: str | None) -> dict[str, str]:
    """Export the request's spans if it is sampled; the log line's trace_id and span_id (none without a trace).

    name, attributes, error: the server span's, in the request's transport's terms (app/server/telemetry/record.py);
    error is the error.type of a failed request (its status), None when it succeeded."""
    if trace is None:
        return {}
    timer = trace.timer  # only inference requests have one: they alone count against trace_rate and trace_count
    model = timer.model if timer is not None else None
    tracer = STATE.tracer
    if tracer is not None and STATE.settings.sample(model[0] if model else None, inference=timer is not None):
        context = _spans(tracer, trace, name, attributes, error).get_span_context()
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
    if trace.parent is not None:
        return {"trace_id": f"{trace.parent.trace_id:032x}", "span_id": f"{trace.parent.span_id:016x}"}
    return {}


def _parent_context(parent: Incoming | None) -> Any:
    if parent is None:
        return None
    state = api.TraceState.from_header([parent.state]) if parent.state else None
    remote = api.SpanContext(parent.trace_id, parent.span_id, True, api.TraceFlags(parent.flags & 1), state)
    return api.set_span_in_context(api.NonRecordingSpan(remote))


def _spans(tracer: api.Tracer, trace: Trace, name: str, attributes: dict[str, Any], error: str | None) -> api.Span:
    timer = trace.timer
    if timer is not None and timer.model is not None:
        attributes["normserve.model.name"], attributes["normserve.model.version"] = timer.model
    if timer is not None and timer.shape is not None:
        attributes["normserve.input.shape"] = [int(n) for n in timer.shape]
    if error is not None:
        attributes["error.type"] = error
    kind = api.SpanKind.SERVER
    server = tracer.start_span(name, _parent_context(trace.parent), kind, attributes, start_time=trace.wall_ns)
    if timer is not None and server.is_recording():
        inside = api.set_span_in_context(server)
        for stage, begin, end in timer.stages():
            labels = {"triton.stage": stage}
            child = tracer.start_span(SPAN_NAMES[stage], inside, attributes=labels, start_time=trace.wall(begin))
            child.end(end_time=trace.wall(end))
    if error is not None:
        server.set_status(api.Status(api.StatusCode.ERROR))
    server.end(end_time=trace.wall(time.perf_counter_ns()))
    return server
