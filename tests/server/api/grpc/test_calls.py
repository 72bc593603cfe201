"""calls.py: the status table on to gRPC codes, request ids, and what a call records (metrics, the log line)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from app.errors import (
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
from app.server import logs
from app.server.api.grpc import calls


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
