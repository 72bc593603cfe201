"""calls.py: the status table on to gRPC codes, request ids, and what a call records (metrics, the log line)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from app.errors import (
    BodyTimeout,
    BudgetExhausted,
    ExtensionNotSupported,
    InvalidInput,
    MalformedBody,
    ModelControlDisabled,
    ModelNotFound,
    NormserveError,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Timeout,
    UnsupportedMediaType,
)
from app.server.api.v2.grpc import calls
from app.server.budget import Budget
from app.server.telemetry import logs


class Context:
    """The parts of grpc.aio's ServicerContext that calls.py reads."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = (), remaining: float | None = None) -> None:
        self._metadata = metadata
        self._remaining = remaining

    def invocation_metadata(self) -> Any:
        return [SimpleNamespace(key=k, value=v) for k, v in self._metadata]

    def time_remaining(self) -> float | None:
        return self._remaining

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def add_done_callback(self, callback: Any) -> None:
        self.done = callback  # called by grpc when the call ends; the tests call it


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
        (MalformedBody, grpc.StatusCode.INVALID_ARGUMENT),
        (UnsupportedMediaType, grpc.StatusCode.INVALID_ARGUMENT),
        (ModelControlDisabled, grpc.StatusCode.PERMISSION_DENIED),
        (ModelNotFound, grpc.StatusCode.NOT_FOUND),
        (PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (Overloaded, grpc.StatusCode.UNAVAILABLE),
        (NotReady, grpc.StatusCode.UNAVAILABLE),
        (Timeout, grpc.StatusCode.DEADLINE_EXCEEDED),
        (ExtensionNotSupported, grpc.StatusCode.UNIMPLEMENTED),  # a 400 over HTTP: gRPC has a code of its own
        (BudgetExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (BodyTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
        (NormserveError, grpc.StatusCode.INTERNAL),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else v.name,
)
def test_each_error_maps_through_the_one_status_table(cls: type[NormserveError], code: grpc.StatusCode) -> None:
    assert calls.code_for(cls("x")) == code


@pytest.mark.parametrize(
    ("request_id", "metadata", "expected"),
    [
        ("abc", (("x-request-id", "from-metadata"),), "abc"),
        ("", (("x-request-id", "from-metadata"),), "from-metadata"),
        ("", (("x-request-id", "a b"),), None),
        ("x" * 129, (), None),
        ("", (), None),
    ],
    ids=["request-id-first", "metadata", "unsafe-metadata", "too-long", "none"],
)
def test_the_request_id_is_the_requests_then_the_metadatas_else_new(
    request_id: str, metadata: tuple[tuple[str, str], ...], expected: str | None
) -> None:
    got = calls.incoming_id(Context(metadata), request_id)
    if expected is None:
        assert len(got) == 32 and int(got, 16) >= 0  # uuid4 hex
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("exc", "remaining", "code", "message"),
    [
        (
            InvalidInput("bad\x1b[31m", "inputs.input"),
            None,
            grpc.StatusCode.INVALID_ARGUMENT,
            "inputs.input: bad\\x1b[31m",
        ),
        (asyncio.CancelledError(), 0.0, grpc.StatusCode.DEADLINE_EXCEEDED, None),
        (asyncio.CancelledError(), 3.0, grpc.StatusCode.CANCELLED, None),
        (RuntimeError("secret path /srv"), None, grpc.StatusCode.INTERNAL, "internal error"),
    ],
    ids=["domain-error-printable", "deadline", "cancelled", "unexpected"],
)
def test_a_failure_sets_the_code_and_gives_the_message_to_send(
    exc: BaseException, remaining: float | None, code: grpc.StatusCode, message: str | None
) -> None:
    call = calls.Call("svc", "M", "id")
    assert call.failed(exc, Context(remaining=remaining)) == message
    assert call.code == code


@pytest.fixture
def access_lines() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger, level = logs.ACCESS, logs.ACCESS.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_finishing_a_call_counts_it_and_logs_one_line(access_lines: list[logging.LogRecord]) -> None:
    labels = {"service": "svc", "method": "ModelInfer", "model": "layernorm", "code": "NOT_FOUND"}
    before = REGISTRY.get_sample_value("normserve_grpc_requests_total", labels) or 0.0
    call = calls.Call("svc", "ModelInfer", "rid-1", model="layernorm", code=grpc.StatusCode.NOT_FOUND, bytes_in=10)
    call.finish()
    assert REGISTRY.get_sample_value("normserve_grpc_requests_total", labels) == before + 1
    (record,) = access_lines
    line = {k: getattr(record, k) for k in ("request_id", "method", "route", "path", "status", "grpc_status", "model")}
    assert line == {
        "request_id": "rid-1",
        "method": "GRPC",
        "route": "/svc/ModelInfer",
        "path": "/svc/ModelInfer",
        "status": 5,
        "grpc_status": "NOT_FOUND",
        "model": "layernorm",
    }
    assert (record.bytes_in, record.bytes_out) == (10, 0) and record.duration_ms >= 0  # type: ignore[attr-defined]


class Message:
    """A request as protobuf gives it (its size is all gated reads)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def ByteSize(self) -> int:  # noqa: N802
        return self.size


async def one_message(size: int, delay_s: float = 0.0) -> Any:
    await asyncio.sleep(delay_s)
    yield Message(size)


def gated_call(budget: Budget, messages: Any, timeout_s: float = 1.0) -> tuple[Any, int, Context]:
    """Run a gated handler (reserve 100 bytes) on messages: what the handler got, and the bytes counted meanwhile."""
    context = Context()
    seen: list[tuple[Any, int]] = []

    async def handle(request: Any, _context: Any) -> None:
        seen.append((request, budget.used))

    asyncio.run(calls.gated(budget, 100, timeout_s, handle)(messages, context))
    return seen[0][0], seen[0][1], context


def test_a_gated_call_reads_once_there_is_room_and_counts_its_size_until_it_ends() -> None:
    budget = Budget(100)
    request, counted, context = gated_call(budget, one_message(30))
    assert (request.size, counted, budget.used) == (30, 30, 30)
    context.done(None)
    assert budget.used == 0


def test_a_gated_call_without_room_is_refused_unread() -> None:
    budget = Budget(100)
    asyncio.run(budget.take(10))  # someone else's body: no room for the largest message (100 bytes)
    request, counted, _ = gated_call(budget, one_message(30))
    assert isinstance(request, calls.Refused) and counted == 10 and budget.used == 10
    assert request.error().message == (
        "a message of up to 100 bytes (NORMSERVE_MAX_BODY_BYTES) would pass the limit of 100 bytes of request"
        " bodies in flight (10 now, NORMSERVE_MAX_INFLIGHT_BYTES); retry shortly"
    )


def test_a_gated_message_that_does_not_arrive_in_time_is_a_body_timeout_and_gives_its_room_back() -> None:
    budget = Budget(100)
    request, _, _ = gated_call(budget, one_message(30, delay_s=1.0), timeout_s=0.05)
    assert isinstance(request, calls.Refused) and budget.used == 0
    assert request.error().message == "request: did not arrive in full within 0.05 s (NORMSERVE_BODY_TIMEOUT_S)"


async def no_message() -> Any:
    return
    yield  # an async generator that ends at once: what grpc leaves a handler after refusing an oversized message


def test_a_gated_call_grpc_refused_as_too_large_is_resource_exhausted_and_gives_its_room_back() -> None:
    budget = Budget(100)
    request, _, _ = gated_call(budget, no_message())
    assert isinstance(request, calls.Refused) and budget.used == 0
    assert calls.code_for(request.error()) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert request.error().message == "body: body exceeds 100 bytes (NORMSERVE_MAX_BODY_BYTES)"


def test_a_gated_message_that_stalls_while_others_wait_is_cut_well_before_the_body_timeout() -> None:
    # Four calls that announced nothing and sent no message had refused every request for 30 s (issue 37, D2).
    budget = Budget(100, min_rate=1000)

    async def run() -> tuple[Any, float, int]:
        seen: list[Any] = []

        async def handle(request: Any, _context: Any) -> None:
            seen.append(request)

        start = time.monotonic()
        stalled = asyncio.create_task(calls.gated(budget, 100, 30.0, handle)(one_message(30, 30.0), Context()))
        await asyncio.sleep(0.05)
        await budget.take(50, wait_s=5.0)  # another request waits; the stalled call is cut after the grace (1 s)
        await stalled
        return seen[0], time.monotonic() - start, budget.used

    request, took, used = asyncio.run(run())
    assert isinstance(request, calls.Refused) and used == 50
    assert request.error().message == (
        "request: arrived slower than 1000 bytes/s (NORMSERVE_MIN_BODY_RATE) while other requests waited for room"
    )
    assert 1.0 <= took < 2.0
