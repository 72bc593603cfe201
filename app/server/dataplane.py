"""The data plane: the one face every protocol's inference, metadata and statistics go through.

A transport converts its wire into a codec (app/server/pipeline.py) and hands it to `DataPlane.infer`, with
the body still to arrive; the data plane finds the model the request names (the URL's or the message's name
before the body, else the one its body names), admits the request, runs its stages on the event loop or in the
threadpool, bounds it by the timeout, and counts it in the model's statistics. Nothing below it, neither a
codec nor a model, calls back into it: a model tells each run to the statistics (telemetry/statistics.py).
The repository's lifecycle (start, loads, unloads) is another object, app/server/lifecycle.py.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from app.core.model import Model
from app.core.runtime import Runtime
from app.errors import ModelNotFound, NotReady, Timeout
from app.server.admission import Admission
from app.server.pipeline import Codec, Job
from app.server.telemetry import metrics, monitoring, record
from app.server.telemetry.statistics import Statistics
from app.server.telemetry.timer import InferTimer
from app.settings import Settings

T = TypeVar("T")
B = TypeVar("B")
P = TypeVar("P")
# Bodies up to this size are computed on the event loop: (1,8,64) in JSON is 5.6 KiB and takes ~0.15 ms.
INLINE_BODY_BYTES = 16 * 1024


class DataPlane:
    """infer, model, metadata and statistics of one worker's serving models."""

    def __init__(self, settings: Settings, admission: Admission, statistics: Statistics) -> None:
        self.settings = settings
        self.admission = admission
        self._statistics = statistics
        # Each run is told to the statistics, not to the data plane: nothing below calls back up into it. The
        # batchers stop waiting once every request in flight in this worker is in the batch.
        self.runtime = Runtime(settings, observe=statistics.observe_run, in_flight=admission.count)
        monitoring.COLLECTOR.source = lambda: self.runtime.models  # the worker's one data plane: its monitors

    def monitor(self, name: str, version: str | None = None) -> dict[str, Any]:
        """GET /v2/models/{name}/monitor: the drift of the serving version's LayerNorms (API.md section 13)."""
        return self.model(name, version).monitor.report()

    def model(self, name: str, version: str | int | None = None) -> Model:
        """The model, 404 if unknown; 503 while models are still loading, when unknown may just mean not yet."""
        try:
            model = self.runtime.get(name, version)
        except ModelNotFound:
            if not self.admission.ready:
                raise NotReady(f"server is not ready: {self.admission.not_ready_reason}") from None
            raise
        record.note_model(name)  # the request's log line names the model it used
        return model

    def metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata; without a version it lists every version serving, as Triton's does."""
        model = self.model(name, version)
        if version is not None:
            return model.metadata
        return {**model.metadata, "versions": [str(v) for v in sorted(self.runtime.serving.get(model.name, {}))]}

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics of every model, of one model (every version serving, as Triton's: not only the
        newest), or of one version."""
        if not name:
            models = self.runtime.models
        else:
            model = self.model(name, version)
            models = [model] if version is not None else [m for m in self.runtime.models if m.name == model.name]
        return self._statistics.report([(m.name, m.version) for m in models])

    async def infer(self, codec: Codec[B, Any, P], body: Awaitable[B] | B, deadline_s: float | None = None) -> P:
        """One inference request of any protocol: its model, its body, admission, its stages on the event loop or
        in the threadpool, and its success or failure counted once, for the model it named.

        The model a codec names before its body (`codec.named`: V2's URL, a gRPC message) is found first, so an
        unknown one is a 404 before the body is read; a body that fails to arrive then counts as its failure.
        body: still to arrive (HTTP's read), or in memory already (a gRPC message).
        deadline_s: the client's remaining deadline (gRPC), when it is shorter than the request timeout.
        """
        timer = InferTimer()
        job: Job[Any, P] | None = None
        try:
            named = None if codec.named is None else self.model(*codec.named)
        except BaseException:
            close = getattr(body, "close", None)  # the body's coroutine (HTTP's read), never to be awaited now
            if close is not None:
                close()
            raise
        try:
            arrived = await body if inspect.isawaitable(body) else body
            timer.restart()  # the clock starts once the body is in memory, as Triton's does
            tiny = codec.size(arrived) <= INLINE_BODY_BYTES
            job = Job(timer, codec, arrived, named, self.model)
            del arrived  # the job holds the body until it is decoded, no one after
            payload = await self._admit(job, tiny, deadline_s)
        except Exception:  # any answer but success counts as a failure; the error handlers still answer it
            self._count(named if job is None else job.model, timer, success=False)
            raise
        self._count(job.model, timer, success=True)
        return payload

    async def _admit(self, job: Job[Any, P], tiny: bool, deadline_s: float | None) -> P:
        """A tiny request is decoded on the event loop, then runs there unless its model batches: a batcher (or
        a text encoder's pool) blocks its caller while the batch gathers. Others go to the threadpool whole."""
        self._enter()
        job.admitted()
        try:
            try:
                inline = tiny and not job.decode().blocks
            except BaseException:
                self._release()
                raise
            return await self._finish(job, inline, deadline_s)
        finally:
            job.abandoned()  # a no-op once it started

    def _count(self, model: Model | None, timer: InferTimer, success: bool) -> None:
        if model is None:  # the request never named a model that serves
            return
        timer.model = (model.name, model.version)
        count = self._statistics.record_success if success else self._statistics.record_failure
        count(model.name, model.version, timer)

    def _enter(self) -> None:
        self.admission.enter()
        metrics.IN_FLIGHT.inc()

    async def _finish(self, fn: Callable[[], T], inline: bool, deadline_s: float | None) -> T:
        """Once admitted: fn on the event loop (inline: tiny requests, whose work takes less than the thread hop
        and the GIL hand-offs it brings, measured in docs/benchmarks.md) or in the threadpool, answered 504 past
        the timeout without killing the worker; the slot is released when fn ends, or when it was never started."""
        if inline:  # on the event loop, now: no waiter can give up on it, so there is nothing to claim
            try:
                return fn()
            finally:
                self._release()
        # Whoever takes `claim` first releases the slot: the job when it starts (so a timed-out job still
        # counts until it really ends), or the waiter when it gave up before any thread picked the job up.
        claim = threading.Lock()
        job = _claimed(fn, claim, self._release)
        abandon = anyio.CancelScope()  # cancelled by a drain that timed out (app/server/drain.py)
        self.admission.abandonable.add(abandon)
        timeout = self.settings.request_timeout_s
        try:
            with anyio.fail_after(timeout if deadline_s is None else min(timeout, deadline_s)), abandon:
                return await anyio.to_thread.run_sync(job, abandon_on_cancel=True)
        except TimeoutError:
            if deadline_s is not None and deadline_s < timeout:
                raise Timeout(f"inference took longer than the client's deadline ({deadline_s:.3g} s)") from None
            raise Timeout(f"inference took longer than {timeout} s (NORMSERVE_REQUEST_TIMEOUT_S)") from None
        finally:
            self.admission.abandonable.discard(abandon)
            if claim.acquire(blocking=False):
                self._release()
        raise NotReady(
            "server is shutting down and its drain timeout (NORMSERVE_DRAIN_TIMEOUT_S) passed; retry elsewhere"
        )

    def _release(self) -> None:
        self.admission.leave()
        metrics.IN_FLIGHT.dec()


def _claimed(fn: Callable[[], T], claim: threading.Lock, release: Callable[[], None]) -> Callable[[], T]:
    def job() -> T:
        if not claim.acquire(blocking=False):
            raise RuntimeError("inference abandoned before it started")  # its waiter has already answered
        try:
            return fn()
        finally:
            release()

    return job
