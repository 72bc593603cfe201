"""Graceful drain on SIGTERM: not ready at once, in-flight inferences finish, then the server's own shutdown.

uvicorn (0.54, `Server.capture_signals`) installs its SIGTERM/SIGINT handler with `signal.signal`
before the lifespan starts. That handler stops the listener at once, so a load balancer would see
refused connections instead of a 503 from the readiness probe. `Drain.install` runs in the lifespan,
finds uvicorn's handler in place, and wraps it: the first signal only marks the worker draining
(readiness and new inferences answer 503; the listener stays open), waits in a background task until
nothing is in flight or the drain timeout passes, and then calls uvicorn's handler, whose shutdown
and re-raise of the signal then run as usual. With several workers each worker process drains.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from app.server import compat
from app.server.admission import Admission

log = logging.getLogger("normserve.lifecycle")

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any]


class Drain:
    """Wraps the server's signal handlers so that the first SIGTERM or SIGINT drains before shutting down."""

    def __init__(self, admission: Admission, timeout_s: float) -> None:
        self.admission = admission
        self.timeout_s = timeout_s
        self.signalled_at: float | None = None  # time.monotonic() of the first signal
        self._previous: dict[int, Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def install(self) -> bool:
        """Wrap the handlers the server installed; False where there are none to wrap (or not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return False  # signal.signal works only there (e.g. Starlette's TestClient runs lifespans elsewhere)
        self._loop = asyncio.get_running_loop()
        for sig in DRAIN_SIGNALS:
            previous = signal.getsignal(sig)
            # SIG_DFL, SIG_IGN or Python's KeyboardInterrupt: no server handler that would run a shutdown.
            if callable(previous) and previous is not signal.default_int_handler:
                self._previous[sig] = previous
                signal.signal(sig, self._on_signal)
        if not self._previous:
            log.warning("no server signal handlers to wrap; SIGTERM will not drain")
        return bool(self._previous)

    def uninstall(self) -> None:
        """Put the server's handlers back (a signal during its shutdown then goes straight to it)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)

    def server_config(self) -> Any | None:
        """The config of the uvicorn Server whose handlers were wrapped (after install), or None.

        uvicorn reads `http_protocol_class` from it for every new connection, so the lifespan may still
        change it: app/server/http/heads.py."""
        return compat.server_config(self._previous.values())

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        # Runs on the main thread between two bytecodes, possibly inside Admission.enter holding its
        # lock: so no lock here, only an attribute store (atomic) and a thread-safe hand-off to the loop.
        if self.signalled_at is not None or self._loop is None:
            self._previous[sig](sig, frame)  # a second signal: the server's own behaviour (SIGINT twice forces)
            return
        self.admission.draining = True
        self.signalled_at = time.monotonic()
        self._loop.call_soon_threadsafe(self._start, sig)

    def _start(self, sig: int) -> None:
        self.admission.publish()  # here, on the loop: the signal handler only set `draining`
        self._task = asyncio.ensure_future(self._drain_then_shutdown(sig))

    async def _drain_then_shutdown(self, sig: int) -> None:
        assert self.signalled_at is not None
        name = signal.Signals(sig).name
        log.warning("%s: draining %d in-flight requests (up to %.1f s)", name, self.admission.in_flight, self.timeout_s)
        idle = await asyncio.to_thread(self.admission.wait_idle, self.timeout_s)
        elapsed = time.monotonic() - self.signalled_at
        if idle:
            log.warning("%s: drained in %.3f s; shutting down", name, elapsed)
        else:
            abandoned = self.admission.abandon_all()
            log.error("%s: drain timeout after %.1f s; %d requests answered 503", name, elapsed, abandoned)
        previous = self._previous[sig]
        # The server's own shutdown then waits for open connections within what is left of the timeout.
        compat.bound_graceful_shutdown(previous, max(0.5, self.timeout_s - elapsed))
        previous(sig, None)
