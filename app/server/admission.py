"""Admission control: readiness, draining, a bounded number of inferences in flight, and connections per worker."""

from __future__ import annotations

import resource
import threading

import anyio

from app.errors import NotReady, Overloaded
from app.server.telemetry import metrics
from app.settings import Settings

FD_RESERVE = 64  # descriptors never given to HTTP connections: model files, logs, the listening sockets


def connection_limit(settings: Settings) -> int:
    """NORMSERVE_MAX_CONNECTIONS, within half of the descriptors left after FD_RESERVE (RLIMIT_NOFILE).

    HTTP's guard (app/server/http/heads.py) and the gRPC server both hold their connections to it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return settings.max_connections
    return max(1, min(settings.max_connections, (soft - FD_RESERVE) // 2))


class Admission:
    """Counts inferences in flight; past the limit a request is refused at once, never queued.

    Setting `ready` publishes the readiness gauge; `draining` is a plain attribute, since the drain sets it in a
    signal handler, which must not take the gauge's lock: the drain publishes it afterwards, on the event loop.
    """

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._ready = False
        self.draining = False
        # Start-up is over though some model failed: not ready (strict readiness), but the models that loaded
        # take requests, as Triton's do.
        self.started = False
        self.not_ready_reason = "models are loading"
        self._lock = threading.Lock()  # released from worker threads, acquired on the event loop
        self._idle = threading.Condition(self._lock)
        # The cancel scopes of the requests awaiting an inference; cancelled (on the event loop) when a
        # drain times out, so that each answers 503 and a load balancer retries it elsewhere.
        self.abandonable: set[anyio.CancelScope] = set()
        metrics.IN_FLIGHT_LIMIT.set(max_in_flight)
        self.publish()

    @property
    def ready(self) -> bool:
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = value
        self.publish()

    def publish(self) -> None:
        """Set the readiness gauge from the state now (normserve_ready: 1 while accepting)."""
        metrics.set_ready(self.accepting)

    @property
    def accepting(self) -> bool:
        return self.ready and not self.draining

    @property
    def not_accepting_reason(self) -> str:
        return "shutting down" if self.draining else self.not_ready_reason

    def count(self) -> int:
        """Inferences in flight now."""
        return self.in_flight

    def enter(self) -> None:
        with self._lock:
            if self.draining:
                raise NotReady("server is shutting down; retry on another replica")
            if not (self.ready or self.started):
                raise NotReady(f"server is not ready: {self.not_ready_reason}")
            if self.in_flight >= self.max_in_flight:
                raise Overloaded(f"{self.in_flight} requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)")
            self.in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.notify_all()

    def abandon_all(self) -> int:
        """Make every request awaiting an inference answer 503 now (call on the event loop); how many."""
        scopes = list(self.abandonable)
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is in flight or the timeout passes; True when idle."""
        with self._lock:
            return self._idle.wait_for(lambda: self.in_flight == 0, timeout)
