"""One Worker per server process: its models, admission, drain and Triton statistics, and how inference runs.

`start()` is the lifecycle (verify sha256 -> build sessions -> parity warm-up -> ready), used by the
app's lifespan and by `normserve validate` alike. `serve()` is the one inference pipeline of every protocol
(each hands it a codec, app/server/pipeline.py): the body, admission, then the threadpool (or the event loop
for tiny requests), the timeout, statistics.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from app.core.model import Model
from app.core.repository import LegacyLayout
from app.core.runtime import Runtime
from app.errors import ModelNotFound, NotReady, Timeout
from app.server.admission import Admission
from app.server.budget import Budget
from app.server.control import LOAD_ERRORS, ModelControl
from app.server.drain import Drain
from app.server.modelsync import ModelSync
from app.server.operations import Operations
from app.server.pipeline import Codec, Job
from app.server.telemetry import metrics, record
from app.server.telemetry.statistics import Statistics
from app.server.telemetry.timer import InferTimer
from app.settings import Settings

log = logging.getLogger("normserve")
T = TypeVar("T")
B = TypeVar("B")
P = TypeVar("P")
# Bodies up to this size are computed on the event loop: (1,8,64) in JSON is 5.6 KiB and takes ~0.15 ms.
INLINE_BODY_BYTES = 16 * 1024


class Worker:
    """Everything one server process builds once; routes of every protocol take it.

    `normserve validate` runs the same `load` and `warm_up` steps as `start`, one by one with progress.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admission = Admission(settings.max_in_flight)
        self.budget = Budget(settings.max_inflight_bytes)  # request body bytes in flight, every transport
        self.statistics = Statistics()
        # The batchers stop waiting once every request in flight in this worker is in the batch.
        self.runtime = Runtime(settings, observe=self._observe_run, in_flight=self.admission.count)
        self.control = ModelControl(self.runtime)
        self.sync: ModelSync | None = None  # explicit mode with several workers: set by the app's lifespan
        self.operations = Operations(settings.model_control_wait_s)  # the repository API's loads and unloads
        self.drain = Drain(self.admission, settings.drain_timeout_s)
        self.failed_at_start: dict[str, str] = {}  # model name: why it failed at start (readiness waits on them)

    def load(self) -> list[Model]:
        """sha256 checks and sessions of every model loaded at start (ModelLoadError names the file)."""
        return [m for name in self.control.startup_names() for m in self.control.build(name)]

    def warm_up(self, models: list[Model]) -> dict[tuple[str, str], tuple[float, float]]:
        """The parity warm-up of each model against the NumPy reference, then it serves: (max abs diff,
        tolerance) by (name, version). ModelLoadError past a tolerance."""
        self.admission.not_ready_reason = "parity warm-up running"
        return self.runtime.serve(models)

    def start(self) -> None:
        """Load, warm up, then ready; a failure leaves the worker live but not ready, with the reason.

        Triton's strict readiness: every model meant to be served at start must load. Those that did serve
        meanwhile, and readiness names each one that failed and why."""
        if self.settings.model_control == "explicit" and not self.settings.admin_token:
            log.warning(
                "NORMSERVE_MODEL_CONTROL is explicit but NORMSERVE_ADMIN_TOKEN is not set: the repository API "
                "(load, unload) and the trace and logging routes are closed until a token is set"
            )
        try:
            names = self.control.startup_names()
        except (*LOAD_ERRORS, LegacyLayout) as e:
            self._not_ready(str(e))  # the repository itself: the operator needs its path
            if self.sync is not None:
                self.sync.started(failed=True)
            return
        self.admission.not_ready_reason = "parity warm-up running"
        # A worker started after loads and unloads (uvicorn replaced one) serves what the others serve.
        figures, failures = self.control.start(names, None if self.sync is None else self.sync.published())
        if self.sync is not None:  # what the other workers loaded and unloaded since they started
            self.sync.started()
        if failures:
            self.failed_at_start = failures
            self._not_ready("; ".join(failures.values()))
            self.admission.started = True  # the models that loaded take requests
            return
        diffs = {f"{name}/{version}": diff for (name, version), (diff, _) in figures.items()}
        log.info(
            "ready: parity warm-up max abs diff %s",
            {k: f"{v:.2e}" for k, v in diffs.items()},
            extra={"parity_max_abs_diff": diffs},
        )
        self.admission.ready = True

    def load_model(self, name: str, deadline: float | None = None) -> list[Model]:
        """A load through the repository API; with several workers, applied by every one before it returns (503
        if the server-wide lock is not free by the deadline)."""
        if self.sync is None:
            models = self.control.load(name)
        else:
            models = self.sync.run(lambda: self.control.load(name), name, "load", deadline)
        self.settle()
        return models

    def unload_model(self, name: str, deadline: float | None = None) -> list[int]:
        """An unload through the repository API; with several workers, applied by every one before it returns."""
        if self.sync is None:
            return self.control.unload(name)
        return self.sync.run(lambda: self.control.unload(name), name, "unload", deadline)

    def settle(self) -> None:
        """After a load (poll, the repository API): a worker whose start left models failing becomes ready once
        each of them serves or has left the repository, as Triton's strict readiness does; until then readiness
        names those still failing."""
        if not self.admission.started or self.admission.ready:
            return
        on_disk = set(self.control.repository.names())
        failing = {n: r for n, r in self.failed_at_start.items() if n not in self.runtime.serving and n in on_disk}
        if failing:
            self.admission.not_ready_reason = f"model check failed: {'; '.join(failing.values())}"
            return
        log.info("ready: every model that failed at start now serves")
        self.admission.ready = True

    def _not_ready(self, reason: str) -> None:
        self.admission.not_ready_reason = f"model check failed: {reason}"
        self.runtime.abandon(f"not loaded: {self.admission.not_ready_reason}")
        log.error("not ready: %s", reason, extra={"reason": self.admission.not_ready_reason})

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

    def model_statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics of every model, of one model (every version serving, as Triton's: not only the
        newest), or of one version."""
        if not name:
            models = self.runtime.models
        else:
            model = self.model(name, version)
            models = [model] if version is not None else [m for m in self.runtime.models if m.name == model.name]
        return self.statistics.report([(m.name, m.version) for m in models])

    def _observe_run(self, model: str, version: str, seconds: float, rows: int, warm_up: bool) -> None:
        metrics.observe_inference(model, version, seconds, rows)
        if not warm_up:  # the warm-up's runs, at start or on a load through the API, are no client's executions
            self.statistics.record_execution(model, version, int(seconds * 1e9))

    async def serve(self, codec: Codec[B, Any, P], body: Awaitable[B], deadline_s: float | None = None) -> P:
        """One inference request of any protocol: its body, admission, its stages on the event loop or in the
        threadpool (run), and its success or failure counted once, for the model it named (codec.model).

        deadline_s: the client's remaining deadline (gRPC), when it is shorter than the request timeout.
        """
        timer = InferTimer()  # a body that fails to arrive counts as a failure of the model the URL named
        try:
            arrived = await body
            timer.restart()  # the clock starts once the body is in memory, as Triton's does
            tiny = codec.size(arrived) <= INLINE_BODY_BYTES
            job = Job(timer, codec, arrived)
            del arrived  # the job holds the body until it is decoded, no one after
            payload = await self._admit(job, tiny, deadline_s)
        except Exception:  # any answer but success counts as a failure; the error handlers still answer it
            self._count(codec, timer, success=False)
            raise
        self._count(codec, timer, success=True)
        return payload

    async def _admit(self, job: Job[Any, P], tiny: bool, deadline_s: float | None) -> P:
        """A tiny request is decoded on the event loop, then runs there unless its model batches: a batcher
        blocks its caller while the batch gathers. Others go to the threadpool whole."""
        self._enter()
        try:
            inline = tiny and job.decode().batcher is None
        except BaseException:
            self._release()
            raise
        return await self._finish(job, inline, deadline_s)

    def _count(self, codec: Codec[Any, Any, Any], timer: InferTimer, success: bool) -> None:
        if codec.model is None:  # the request never named a model
            return
        timer.model = (codec.model.name, codec.model.version)
        record = self.statistics.record_success if success else self.statistics.record_failure
        record(codec.model.name, codec.model.version, timer)

    async def run(self, fn: Callable[[], T], inline: bool = False, deadline_s: float | None = None) -> T:
        """Admit the job, run it in the threadpool, and answer 504 past the timeout without killing the worker.

        inline=True runs fn on the event loop: only for tiny requests (INLINE_BODY_BYTES), whose work takes
        less than the thread hop and the GIL hand-offs it brings (measured in docs/benchmarks.md).
        deadline_s: the client's remaining deadline (gRPC), when it is shorter than the request timeout.
        """
        self._enter()
        return await self._finish(fn, inline, deadline_s)

    def _enter(self) -> None:
        self.admission.enter()
        metrics.IN_FLIGHT.inc()

    async def _finish(self, fn: Callable[[], T], inline: bool, deadline_s: float | None) -> T:
        """run's part once admitted: the slot is released when fn ends, or when it was never started."""
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


async def arrived(body: B) -> B:
    """A body already in memory (gRPC's parsed message), as serve takes it."""
    return body
