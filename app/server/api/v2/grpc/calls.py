"""One gRPC call: its request id, its errors as gRPC statuses, and its record (metrics, the JSON log line, the trace).

Errors map from the one status table (app/errors.py `status_for(exc, v2=True)`, the HTTP V2 status)
on to gRPC codes, with HTTP's message text: 400 INVALID_ARGUMENT, 403 PERMISSION_DENIED, 404
NOT_FOUND, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, anything else INTERNAL; an
extension normserve does not implement (shared memory, a 400 over HTTP) is UNIMPLEMENTED.
The request id is the request's `id` when it has one, else the `x-request-id` metadata (plain and
short, as HTTP's X-Request-ID; else a new one); it goes back as `x-request-id` trailing metadata.
A `traceparent` (and `tracestate`) metadata entry is the caller's span, as the HTTP header is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from app.errors import (
    RETRY_AFTER_S,
    BodyTimeout,
    BudgetExhausted,
    ExtensionNotSupported,
    MalformedBody,
    NormserveError,
    NotReady,
    Overloaded,
    printable,
    status_for,
)
from app.server.api.v2.grpc import wire
from app.server.budget import Budget
from app.server.telemetry import record, tracing

log = logging.getLogger("normserve.errors")
REQUEST_ID = "x-request-id"
_INCOMING = (REQUEST_ID, "traceparent", "tracestate")
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
Unary = Callable[[Any, Any, "Call"], Awaitable[Any]]
Streaming = Callable[[Any, Any, "Call"], AsyncIterator[Any]]


@dataclass(frozen=True)
class Undecodable:
    """A request message protobuf could not parse: answered INVALID_ARGUMENT by the handler (grpc's own
    deserializer failure would be INTERNAL, and a client's bytes are no server error)."""

    type_name: str
    size: int
    reason: str
    id: str = ""

    def ByteSize(self) -> int:  # noqa: N802 (a protobuf message's method, for begin())
        return self.size

    def error(self) -> MalformedBody:
        return MalformedBody(f"not a valid {self.type_name} ({self.reason})", "request")


@dataclass(frozen=True)
class Refused:
    """A request turned away before grpc read its message (see gated): the handler answers with its error."""

    exc: NormserveError
    id: str = ""

    def ByteSize(self) -> int:  # noqa: N802 (a protobuf message's method, for begin())
        return 0

    def error(self) -> NormserveError:
        return self.exc


def gated(budget: Budget, reserve: int, timeout_s: float, handle: Callable[[Any, Any], Awaitable[Any]]) -> Any:
    """A unary handler, registered as client-streaming (the same wire), that reads its one message only once the
    budget has room for the largest one (reserve), then counts its real size until the call ends: grpc reads a unary
    RPC's message whole before its handler runs, so 8 concurrent 61 MiB calls were all in memory at once.
    The message must arrive within timeout_s (NORMSERVE_BODY_TIMEOUT_S), as an HTTP body must: a trickled one
    would hold its room in the budget for as long as its client liked."""

    async def read_then_handle(requests: Any, context: Any) -> Any:
        try:
            await budget.take(reserve, what=f"a message of up to {reserve} bytes (NORMSERVE_MAX_BODY_BYTES)")
        except BudgetExhausted as exc:
            return await handle(Refused(exc), context)
        try:
            async with asyncio.timeout(timeout_s):
                request = await anext(aiter(requests), None)
        except TimeoutError:
            budget.give(reserve)
            limit = f"{timeout_s:g} s (NORMSERVE_BODY_TIMEOUT_S)"
            return await handle(Refused(BodyTimeout(f"did not arrive in full within {limit}", "request")), context)
        except BaseException:
            budget.give(reserve)
            raise
        # Its real size stays counted until the call ends: grpc holds the message while it sends the answer.
        size = 0 if request is None else int(request.ByteSize())
        budget.give(reserve - size)
        context.add_done_callback(lambda _: budget.give(size))
        return await handle(
            Undecodable("inference.ModelInferRequest", 0, "no message") if request is None else request, context
        )

    return read_then_handle


def decoder(message_type: Any, parse: Callable[[bytes], Any] | None = None) -> Callable[[bytes], Any]:
    """The request deserializer of an RPC: the message (by parse, else protobuf's), or Undecodable."""
    parse = parse or message_type.FromString

    def decode(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as e:
            return Undecodable(message_type.DESCRIPTOR.full_name, len(data), str(e))

    return decode


def decoded(request: Any) -> Any:
    """The request, or the MalformedBody of one that did not parse."""
    if isinstance(request, (Undecodable, Refused)):
        raise request.error()
    return request


def code_for(exc: NormserveError) -> grpc.StatusCode:
    if isinstance(exc, ExtensionNotSupported):  # 400 over HTTP, as Triton; gRPC names the case itself
        return grpc.StatusCode.UNIMPLEMENTED
    if isinstance(exc, BudgetExhausted):  # a 503 over HTTP; over gRPC, the memory it names is the resource
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return CODES.get(status_for(exc, v2=True), grpc.StatusCode.INTERNAL)


def retry_after(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The `retry-after` trailing metadata of a refusal a client should retry (HTTP's Retry-After header)."""
    return (("retry-after", str(RETRY_AFTER_S)),) if isinstance(exc, (Overloaded, NotReady)) else ()


def _metadata(context: Any) -> tuple[Any, Any, Any]:
    """The request id, traceparent and tracestate metadata (record.incoming's one scan)."""
    return record.incoming([(m.key, m.value) for m in context.invocation_metadata() or ()], _INCOMING)


def _request_id(request_id: str, metadata_id: Any) -> str:
    if request_id:
        return record.request_id_from(request_id.encode("utf-8", "replace"))
    value = metadata_id.encode("utf-8", "replace") if isinstance(metadata_id, str) else metadata_id
    return record.request_id_from(value)


def incoming_id(context: Any, request_id: str = "") -> str:
    """The request's id when it has one, else the x-request-id metadata (plain and short), else a new one."""
    return _request_id(request_id, _metadata(context)[0])


class Call(record.RequestRecord):
    """One call (or one message of a stream): its record, with the RPC it is and its status code."""

    def __init__(
        self,
        service: str,
        method: str,
        request_id: str,
        model: str = "",  # a loaded model's name, once the request has named one that exists
        code: grpc.StatusCode = grpc.StatusCode.OK,
        bytes_in: int = 0,
    ) -> None:
        super().__init__(request_id, model, bytes_in)
        self.service, self.method, self.code = service, method, code

    def answer(self) -> record.Grpc:
        return record.Grpc(self.service, self.method, self.code.value[0], self.code.name)

    def finish(self) -> None:
        self.finish_as(self.answer())

    def failed(self, exc: BaseException, context: Any) -> str | None:
        """Record an error's status; the message to abort with, or None for a cancelled call (nothing to send)."""
        if isinstance(exc, NormserveError):
            self.code = code_for(exc)
            return printable(exc.message)
        if isinstance(exc, grpc.aio.AbortError):  # the handler aborted with its own status (UNIMPLEMENTED, ...)
            self.code = context.code() or grpc.StatusCode.UNKNOWN
            return None
        if isinstance(exc, asyncio.CancelledError):  # the client cancelled, or its deadline passed
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            self.code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            return None
        if isinstance(exc, Exception):
            # Never a traceback or an internal path to the client; the log has them.
            log.exception("unexpected error in gRPC %s/%s", self.service, self.method)
            self.code = grpc.StatusCode.INTERNAL
            return "internal error"
        return None


def begin(service: str, method: str, context: Any, request: Any = None) -> Call:
    metadata_id, parent, state = _metadata(context)
    call = Call(service, method, _request_id(getattr(request, "id", "") or "", metadata_id))
    call.bytes_in = 0 if request is None else int(request.ByteSize())
    call.trace = tracing.start(parent if isinstance(parent, str) else None, state if isinstance(state, str) else None)
    record.enter(call)  # each call, and each message of a stream, is served in a task of its own: no leave
    return call


def unary(service: str, method: str, fn: Unary) -> Callable[[Any, Any], Awaitable[Any]]:
    """A unary handler: fn answers, or raises a domain error that becomes the call's status."""

    async def handle(request: Any, context: Any) -> Any:
        call = begin(service, method, context, request)
        trailer = ((REQUEST_ID, call.request_id),)
        try:
            response = await fn(decoded(request), context, call)
            call.bytes_out = wire.size(response)
            context.set_trailing_metadata(trailer)
            return response
        except BaseException as exc:
            message = call.failed(exc, context)
            if message is None:
                raise
            await context.abort(call.code, message, trailing_metadata=trailer + retry_after(exc))
        finally:
            call.finish()

    return handle


def streaming(service: str, method: str, fn: Streaming, count: bool = True) -> Callable[[Any, Any], AsyncIterator[Any]]:
    """A streaming handler; count=False when fn counts each message of the stream itself (ModelStreamInfer)."""

    async def handle(requests: Any, context: Any) -> AsyncIterator[Any]:
        call = begin(service, method, context)
        try:
            async for response in fn(decoded(requests), context, call):
                call.bytes_out += wire.size(response)
                yield response
        except BaseException as exc:
            message = call.failed(exc, context)
            if message is None:
                raise
            await context.abort(call.code, message, trailing_metadata=((REQUEST_ID, call.request_id),))
        finally:
            if count:
                call.finish()

    return handle
