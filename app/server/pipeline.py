"""What a protocol hands the Worker for one inference request (a Codec), and the request's stages (a Job).

Worker.serve (app/server/worker.py) runs every inference request of every protocol: the body, admission,
the Job on the event loop or in the threadpool, statistics. A protocol only translates: its codec turns
a body into the model and the data plane's input, and the model's result into its answer.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from app.core.model import Model
from app.server.telemetry.timer import InferTimer

B = TypeVar("B", contravariant=True)
W = TypeVar("W")
P = TypeVar("P", covariant=True)


class Codec(Protocol[B, W, P]):
    """One request's translation, built by its route: body (B) -> (model, input, W), then (W, result) -> answer (P).

    W is what the answer needs of the request (V2's requested outputs, REST's "without the batch dim"),
    handed from decode to encode. `model` is the model the request named, once known: set by the route
    when its URL names it (V2), by decode when the body does (REST); the request, even one that then
    fails, counts in that model's statistics.
    """

    @property
    def model(self) -> Model | None: ...

    def size(self, body: B) -> int:
        """The body's bytes as they came in: tiny requests run on the event loop."""
        ...

    def decode(self, body: B) -> tuple[Model, Any, W]: ...

    def encode(self, wire: W, result: Any) -> P: ...


class Job(Generic[W, P]):
    """The stages of one request, each marked on its timer in Triton's names: decode (on the event loop for a
    tiny body, or in the thread), then the model's inference and the answer."""

    def __init__(self, timer: InferTimer, codec: Codec[Any, W, P], body: Any) -> None:
        self.timer = timer
        self.codec = codec
        # The body goes once decoded: a 64 MiB request's answer was built while it was still held, 133 MiB
        # above the worker's RSS with the body in at the encode stage, 69 MiB without (in process, /proc VmHWM).
        self._held = [body]
        self._decoded: tuple[Model, Any, W] | None = None

    def decode(self) -> Model:
        """The queue and compute_input stages: the model the request names, and its input."""
        self.timer.mark("queue")
        model, request, wire = self.codec.decode(self._held.pop())
        self.timer.model = (model.name, model.version)
        self.timer.note_input(request)
        self.timer.mark("compute_input")
        self._decoded = model, request, wire
        return model

    def __call__(self) -> P:
        """The rest of the request's stages (decode too, unless it already ran): its answer."""
        if self._decoded is None:
            self.decode()
        assert self._decoded is not None
        model, request, wire = self._decoded
        self._decoded = None
        result = model.infer(request)
        self.timer.mark("compute_infer")
        payload = self.codec.encode(wire, result)
        self.timer.mark("compute_output")
        return payload
