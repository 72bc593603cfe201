"""What a protocol hands the data plane for one inference request (a Codec), and the request's stages (a Job).

DataPlane.infer (app/server/dataplane.py) runs every inference request of every protocol: the model, the body,
admission, the Job on the event loop or in the threadpool, statistics. A protocol only translates: its codec
names the model its request asks for, turns the body into that model's input, and the result into its answer.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from app.core.model import Model
from app.core.modelmonitor import output_statistics, sampled
from app.core.textbatching import Pooled
from app.server.telemetry import metrics
from app.server.telemetry.timer import InferTimer

B = TypeVar("B", contravariant=True)
W = TypeVar("W")
P = TypeVar("P", covariant=True)
Version = str | int | None
Resolve = Callable[[str, Version], Model]  # (name, version) -> the serving model, or 404


class Codec(Protocol[B, W, P]):
    """One request's translation, built by its route: body (B) -> (input, W) for the model it names, then
    (model, W, result) -> answer (P).

    W is what the answer needs of the request (V2's requested outputs, REST's "without the batch dim"),
    handed from decode to encode. The model is the data plane's to find: `named` when the request names it
    before its body (V2's URL, a gRPC message), else `target(body)`; the request, even one that then fails,
    counts in that model's statistics. A codec whose work is not the model's inference defines
    `run(model, input) -> result` in its place (/tokenize's, the tokenizer): admitted, timed and counted alike, with
    no LayerNorm statistics to monitor.
    """

    @property
    def named(self) -> tuple[str, Version] | None: ...

    def size(self, body: B) -> int:
        """The body's bytes as they came in: tiny requests run on the event loop."""
        ...

    def target(self, body: B) -> tuple[str, Version]:
        """The model's name and version the body names (only asked when `named` is None)."""
        ...

    def decode(self, body: B, model: Model) -> tuple[Any, W]: ...

    def encode(self, model: Model, wire: W, result: Any) -> P: ...


class Job(Generic[W, P]):
    """The stages of one request, each marked on its timer in Triton's names: decode (on the event loop for a
    tiny body, or in the thread), then the model's inference and the answer."""

    def __init__(
        self, timer: InferTimer, codec: Codec[Any, W, P], body: Any, model: Model | None, resolve: Resolve
    ) -> None:
        self.timer = timer
        self.codec = codec
        # The body goes once decoded: a 64 MiB request's answer was built while it was still held, 133 MiB
        # above the worker's RSS with the body in at the encode stage, 69 MiB without (in process, /proc VmHWM).
        self._held = [body]
        self.model = model  # the model the request named, once known
        self._resolve = resolve  # the data plane's: finds the model a body names (codec.target)
        self._decoded: tuple[Any, W] | None = None
        self._admitted_at: float | None = None
        self._pending: str | None = None  # the model this request counts as pending for, while it does
        self._queue_lock = threading.Lock()  # whoever takes it first ends the wait: the start, or a give-up

    def admitted(self) -> None:
        """Admission: the wait for computation starts. A request that names its model before its body counts as
        pending for it now; one whose body names it is counted once the body is decoded, at its start."""
        self._admitted_at = time.perf_counter()
        if self.model is not None:
            self._pending = self.model.name
            metrics.queue(self._pending)[0].inc()

    def started(self, model: Model) -> None:
        """Its computation starts: no longer pending; the time since admission is its queue time."""
        if self._admitted_at is None or not self._queue_lock.acquire(blocking=False):
            return
        metrics.queue(model.name)[1].observe(time.perf_counter() - self._admitted_at)
        if self._pending is not None:
            metrics.queue(self._pending)[0].dec()

    def abandoned(self) -> None:
        """It never started (timed out in the queue, drained): no longer pending, and no queue time."""
        if self._queue_lock.acquire(blocking=False) and self._pending is not None:
            metrics.queue(self._pending)[0].dec()

    def decode(self) -> Model:
        """The queue and compute_input stages: the model the request names, and its input."""
        self.timer.mark("queue")
        body = self._held.pop()
        if self.model is None:
            self.model = self._resolve(*self.codec.target(body))
        model = self.model
        self.started(model)
        self._decoded = self.codec.decode(body, model)
        del body
        self.timer.model = (model.name, model.version)
        self.timer.note_input(self._decoded[0])
        self.timer.mark("compute_input")
        return model

    def __call__(self) -> P:
        """The rest of the request's stages (decode too, unless it already ran): its answer."""
        if self._decoded is None:
            self.decode()
        assert self._decoded is not None and self.model is not None
        request, wire = self._decoded
        self._decoded = None
        run = getattr(self.codec, "run", None)  # a request whose work is not the model's inference (/tokenize)
        monitoring = run is None and bool(self.model.monitor.layers) and sampled(self.model.monitor_sample)
        if monitoring:
            request = monitored(request)
        result = self.model.infer(request) if run is None else run(self.model, request)
        if monitoring:  # in the request's thread
            observe(self.model, request, result)
        del request
        self.timer.mark("compute_infer")
        payload = self.codec.encode(self.model, wire, result)
        self.timer.mark("compute_output")
        return payload


def monitored(request: Any) -> Any:
    """The request as the monitor needs it run. A pooled text keeps its statistics only when asked (/v1/embeddings'
    return_layer_norms): the monitor asks too, and the codec still answers only what the client asked for."""
    if isinstance(request, Pooled) and not request.layer_norms:
        return dataclasses.replace(request, layer_norms=True)
    return request


def observe(model: Model, request: Any, result: Any) -> None:
    """The monitor's work on one answer: each LayerNorm's statistics at its real positions counted."""
    model.monitor.observe(output_statistics(result, _padding(request)))


def _padding(request: Any) -> Any:
    """The positions that are padding: an encoder's padding_mask (true = padding), a text encoder's attention_mask
    (0 = padding); None when every position is real."""
    mask = getattr(request, "padding_mask", None)
    attention = getattr(request, "attention_mask", None)
    return mask if mask is not None or attention is None else attention == 0
