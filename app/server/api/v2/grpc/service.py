"""inference.GRPCInferenceService: thin handlers on the data plane (the repository's on the lifecycle), as the
HTTP V2 routes are.

Each RPC is a method of that name taking (request, context, call); app/server/api/v2/grpc/server.py
registers them from the service's descriptor, wrapped by app/server/api/v2/grpc/calls.py (statuses,
metrics, the log line); RPCs with no method here answer UNIMPLEMENTED. The codec reads and
writes the messages, the model's kind turns tensors into the data plane's input and back, and
DataPlane.infer finds the model and runs it with admission, the timeout (or the client's shorter
deadline) and statistics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from app.core.model import Model
from app.core.repository import check_name
from app.errors import (
    BodyTimeout,
    BudgetExhausted,
    ExtensionNotSupported,
    InvalidInput,
    ModelNotFound,
    NormserveError,
    NotReady,
    Overloaded,
)
from app.server import budget
from app.server.api.admin import check_token, grpc_values
from app.server.api.v2 import rules
from app.server.api.v2.grpc import calls, codec, messages, wire
from app.server.api.v2.grpc.calls import Call
from app.server.api.v2.grpc.tracelog import TraceLogRPCs
from app.server.budget import Body
from app.server.worker import Worker

SERVICE = "inference.GRPCInferenceService"
# Requests of one stream computed at once; the stream's reader waits past it (grpc's flow control pushes back).
STREAM_WINDOW = 16
LINGER_S = 0.5  # on shutdown, how long streams still read (and answer) what their clients sent
SYSTEM_SHM, CUDA_SHM = rules.SHARED_MEMORY["systemsharedmemory"], rules.SHARED_MEMORY["cudasharedmemory"]


def unsupported(extension: str) -> Callable[..., Awaitable[Any]]:
    """The RPCs of an extension normserve has not: UNIMPLEMENTED, with the message HTTP's routes answer too."""

    async def rpc(self: object, request: Any, context: Any, call: Call) -> Any:
        raise ExtensionNotSupported(extension)

    return rpc


class InferenceService(TraceLogRPCs):  # TraceSetting and LogSettings: tracelog.py
    """The RPCs of one worker; `close()` ends its streams once their answers are sent (shutdown)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker  # its settings (the admin token) and admission (readiness)
        self.plane = worker.plane  # inference, metadata, statistics
        self.lifecycle = worker.lifecycle  # the repository's RPCs
        self._readers: set[asyncio.Task[None]] = set()
        self.closing = False

    async def ServerLive(self, request: Any, context: Any, call: Call) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any, call: Call) -> Any:
        """True when every model is verified and warmed up, and the worker is not draining."""
        return pb.ServerReadyResponse(ready=self.worker.admission.accepting)

    async def ModelReady(self, request: Any, context: Any, call: Call) -> Any:
        """As Triton: OK with ready false for a model or version that does not serve (tritonclient's
        is_model_ready() raises on an error status, and only reads `ready`)."""
        try:
            self._model(request.name, request.version, call)
        except (ModelNotFound, NotReady):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.worker.admission.accepting)

    async def ServerMetadata(self, request: Any, context: Any, call: Call) -> Any:
        return messages.server_metadata()

    async def ModelMetadata(self, request: Any, context: Any, call: Call) -> Any:
        model = self._model(request.name, request.version, call)
        return messages.model_metadata(self.plane.metadata(model.name, request.version or None))

    async def ModelConfig(self, request: Any, context: Any, call: Call) -> Any:
        return messages.model_config(self._model(request.name, request.version, call))

    async def ModelStatistics(self, request: Any, context: Any, call: Call) -> Any:
        """Triton statistics, shared with HTTP's /stats: every model when the name is empty, else each version
        serving of one model, or the version asked for."""
        report = self.plane.statistics(request.name, request.version or None)
        call.model = request.name  # its log line names the model (a name it did not know raised above)
        return messages.statistics(report)

    async def RepositoryIndex(self, request: Any, context: Any, call: Call) -> Any:
        self._admin(context)
        return messages.repository_index(self.lifecycle.index(), request.ready)

    async def RepositoryModelLoad(self, request: Any, context: Any, call: Call) -> Any:
        """As HTTP's load: explicit mode only; done (or failed, with the reason) when it answers."""
        self._admin(context, "load")
        name = self._control(request, "load", call)
        await self.lifecycle.load(name)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any, call: Call) -> Any:
        self._admin(context, "unload")
        name = self._control(request, "unload", call)
        await self.lifecycle.unload(name)
        return pb.RepositoryModelUnloadResponse()

    def _admin(self, context: Any, action: str | None = None) -> None:
        check_token(grpc_values(context), self.worker.settings, action)

    def _control(self, request: Any, action: str, call: Call) -> str:
        name = check_name(request.model_name, "model_name")
        if request.parameters:
            unknown = sorted(set(request.parameters) - ({"unload_dependents"} if action == "unload" else set()))
            if unknown:
                raise InvalidInput("not supported; the repository folder is what loads", f"parameters.{unknown[0]}")
        self.lifecycle.check_explicit(action, name)
        call.model = name if self.lifecycle.serves(name) else ""  # bounded: only served names label metrics
        return name

    async def ModelInfer(self, request: Any, context: Any, call: Call) -> wire.Encoded:
        return await self._infer(request, context, call)  # counted by calls.gated, until the call ends

    # Triton's shared-memory extensions: the tensors' bytes come in the request, never from a region.
    SystemSharedMemoryStatus = SystemSharedMemoryRegister = SystemSharedMemoryUnregister = unsupported(SYSTEM_SHM)
    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = unsupported(CUDA_SHM)

    async def ModelStreamInfer(self, requests: Any, context: Any, _call: Call) -> AsyncIterator[Any]:
        """One answer per request, in the order sent; up to STREAM_WINDOW of them computed at once.

        An error answers its request with `error_message` (and its id), and the stream goes on, as in Triton.
        At most NORMSERVE_MAX_IN_FLIGHT streams are open per worker (past it UNAVAILABLE), and a stream with no
        request in flight ends DEADLINE_EXCEEDED after NORMSERVE_STREAM_IDLE_S: 80 streams that sent nothing had
        taken every RPC slot of a worker, health checks' too, for as long as they stayed open (issue 37, D3).
        """
        limit = self.worker.settings.max_in_flight
        if len(self._readers) >= limit:
            raise Overloaded(f"{len(self._readers)} streams open, the limit (NORMSERVE_MAX_IN_FLIGHT)")
        answers: asyncio.Queue[asyncio.Task[Any] | NormserveError | None] = asyncio.Queue()
        window = asyncio.Semaphore(STREAM_WINDOW)
        reader = asyncio.ensure_future(self._read(requests, context, answers, window))
        self._readers.add(reader)
        try:
            while (task := await answers.get()) is not None:
                if isinstance(task, NormserveError):  # the stream's own end: idle
                    raise task
                answer = await task
                window.release()
                yield answer
        finally:
            reader.cancel()
            self._readers.discard(reader)
            while not answers.empty():  # a cancelled stream: its requests not yet answered stop too
                queued = answers.get_nowait()
                if isinstance(queued, asyncio.Task):
                    queued.cancel()

    def close(self) -> None:
        """Stop reading every stream after LINGER_S: a message sent meanwhile is answered (`error_message`: shutting
        down), as are those it has; then the stream ends UNAVAILABLE, so its client knows that messages it sent
        later went unread (a stream ended OK with one sent message unanswered, issue 37 D13)."""
        self.closing = True
        loop = asyncio.get_running_loop()
        for reader in list(self._readers):
            loop.call_later(LINGER_S, reader.cancel)

    async def _read(self, requests: Any, context: Any, answers: asyncio.Queue[Any], window: asyncio.Semaphore) -> None:
        """Each message counted in the budget as it arrives, before the next is read (so a stream holds at most one
        message uncounted, the one grpc is reading): reading up to STREAM_WINDOW ahead before counting them, 8
        streams of 48 MiB messages took a worker to +2.3 GiB (issue 37, D6). One the budget has no room for is
        answered with the refusal, as in-stream errors are. With nothing in flight for NORMSERVE_STREAM_IDLE_S, the
        stream ends."""
        computing: set[asyncio.Task[Any]] = set()
        idle_since = [time.monotonic()]
        incoming = aiter(requests)

        def answered(task: asyncio.Task[Any]) -> None:
            computing.discard(task)
            if not computing:
                idle_since[0] = time.monotonic()

        try:
            while True:
                await window.acquire()
                request = await self._next_message(incoming, computing, idle_since)
                if request is None:
                    break
                body, refused = await self._count(request)
                task = asyncio.ensure_future(self._stream_answer(request, context, refused))
                computing.add(task)
                task.add_done_callback(answered)
                task.add_done_callback(body.close)  # counted until computed: a client slow to read holds none
                answers.put_nowait(task)
        except NormserveError as exc:
            answers.put_nowait(exc)
        except asyncio.CancelledError:
            if self.closing:
                answers.put_nowait(NotReady("server is shutting down; retry on another replica"))
            raise
        except Exception:  # the client went away mid-read: the stream's handler ends with it
            pass
        finally:
            answers.put_nowait(None)

    async def _next_message(
        self, incoming: AsyncIterator[Any], computing: set[asyncio.Task[Any]], idle_since: list[float]
    ) -> Any:
        """The stream's next message, None at its end; BodyTimeout once nothing was in flight for
        NORMSERVE_STREAM_IDLE_S. idle_since[0] moves while it waits: an answer finishing restarts the idle clock."""
        idle_s = self.worker.settings.stream_idle_s
        arriving = asyncio.ensure_future(anext(incoming, None))
        while not (await asyncio.wait({arriving}, timeout=self._idle_left(computing, idle_since[0])))[0]:
            if not computing and time.monotonic() - idle_since[0] >= idle_s:
                arriving.cancel()
                raise BodyTimeout(f"no request within {idle_s:g} s (NORMSERVE_STREAM_IDLE_S)", "stream")
        return arriving.result()

    def _idle_left(self, computing: set[asyncio.Task[Any]], idle_since: float) -> float:
        idle_s = self.worker.settings.stream_idle_s
        return idle_s if computing else max(0.0, idle_since + idle_s - time.monotonic())

    async def _count(self, request: Any) -> tuple[Body, BudgetExhausted | None]:
        """The message's bytes counted (waiting for room as any body does), or the refusal to answer it with."""
        size = int(request.ByteSize())
        body = await self.worker.budget.admit(0)
        body.arrive(size)
        try:
            await body.charge(size)
        except BudgetExhausted as exc:
            body.close()
            return body, exc
        body.finish()
        return body, None

    async def _stream_answer(self, request: Any, context: Any, refused: BudgetExhausted | None = None) -> Any:
        """One message of a stream, logged and counted as its own call; an error becomes its error_message."""
        call = calls.begin(SERVICE, "ModelStreamInfer", context, request)
        try:
            try:
                if refused is not None:
                    raise refused
                answer = await self._infer(calls.decoded(request), context, call, stream=True)
            except BaseException as exc:
                message = call.failed(exc, context)
                if message is None:
                    raise
                failed = pb.ModelInferResponse(id=request.id)  # as Triton: the id tells which request failed
                failed.parameters[codec.FINAL_RESPONSE].bool_param = True
                answer = pb.ModelStreamInferResponse(error_message=message, infer_response=failed)
            call.bytes_out = wire.size(answer)  # before finish(): the log line carries it
            return answer
        finally:
            call.finish()

    def _model(self, name: str, version: str, call: Call) -> Model:
        model = self.plane.model(name, version or None)  # an empty version is the latest, as in Triton
        call.model = model.name
        return model

    async def _infer(self, request: Any, context: Any, call: Call, stream: bool = False) -> wire.Encoded:
        """Its message is counted in the budget already: calls.gated, or the stream's reader."""
        infer = codec.InferCodec(request, self.plane.settings, call.bytes_in, final=stream)
        await budget.trim_heap(call.bytes_in)
        return await self.plane.infer(infer, request, deadline_s=context.time_remaining())
