"""Request heads and connections on uvicorn's HTTP protocols: a head deadline, a 64 KiB head, a connection limit.

uvicorn (0.54) closes no connection that has not sent a whole request head: 1,100 connections that sent
nothing, or half a head, held a worker's file descriptors until every request and probe failed. Neither
of its parsers bounds a head either: httptools took 20.5 s of the event loop to parse one 128 MiB header
(and h11 answers a 16 KiB one with a 400). `guarded(cls, settings)` subclasses the protocol uvicorn chose
(httptools or h11; `normserve serve` names GuardedHttpToolsProtocol in uvicorn's Config, and for a bare
`uvicorn app.main:app` the lifespan installs it through drain.server_config) with:

- the head deadline, NORMSERVE_HEADER_TIMEOUT_S: a connection whose request head is not complete within it,
  from the connection or from the head's first byte, is closed (between requests, uvicorn's keep-alive
  timeout closes an idle connection);
- heads over MAX_HEAD_BYTES answered 431 and closed, the parser never fed more than that;
- NORMSERVE_MAX_CONNECTIONS per worker, and never more than half the descriptors the process may open (the
  rest is headroom for gRPC, model files and logs): past it, an idle connection (one waiting for a head) is
  closed to make room, else the one whose unfinished head began first, so a probe's new connection is served.
  Connections that kept sending header lines were never idle, and the newcomer closed itself: 0 of 45 probes
  were answered beside 600 of them (issue 37, D7). With every connection past its head (bodies, inferences),
  up to PROBE_SLOTS more are kept for probes: such a connection is answered only for a health route (the
  reserved slot; another request on it gets 503 and is closed).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.server.admission import connection_limit
from app.settings import Settings

log = logging.getLogger("normserve.connections")
LINGER_S = 0.5  # on shutdown, how long a connection whose request is on its way has to send it
# A connection accepted this recently whose head has not begun yet is not idle but on its way: under load the loop
# accepts several connections before it reads any, and a probe's was closed to make room for the next trickler
# (1 to 3 of 10 readiness probes lost beside 48 renewing tricklers, tests/suites/test_connection_limits.py).
FRESH_S = 0.25
PROBE_SLOTS = 4  # connections past the limit that may carry a readiness or liveness probe
PROBES = {b"/v2/health/live", b"/v2/health/ready"}
_503 = b'{"error":"connections: past NORMSERVE_MAX_CONNECTIONS only health probes are served; retry shortly"}'
PROBES_ONLY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_503), _503)
)
MAX_HEAD_BYTES = 64 * 1024  # request line and headers; Node's default is 16 KiB, nginx's 32 KiB (4 x 8k)
_431 = b'{"error":"headers: the request head exceeds 65536 bytes"}'
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_431), _431)
)


class HeadGuard:
    """Mixed in before uvicorn's HttpToolsProtocol or H11Protocol, whose attributes it reads
    (app/server/compat.py's PROTOCOL_ATTRIBUTES and CYCLE_ATTRIBUTES, tested on the uvicorn installed)."""

    header_timeout_s: float
    max_connections: int
    transport: asyncio.Transport
    connections: set[Any]
    cycle: Any
    loop: asyncio.AbstractEventLoop
    _head_bytes = 0
    _head_of: Any = None  # the cycle the head being counted follows (None: the connection's first head)
    _head_timer: asyncio.TimerHandle | None = None
    _head_since = 0.0  # when the head being waited for began to be waited for (loop time)
    _probe_only = False  # a connection past the limit, in a probe slot
    _opened = 0.0  # loop time of connection_made
    _lingering = False  # shut down while its first request was on its way (shutdown)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()
        self._opened = self.loop.time()
        if len(self.connections) > self.max_connections:
            others = [c for c in self.connections if c is not self]
            heads = [c for c in others if c._in_head()]
            now = self.loop.time()
            settled = [c for c in heads if not (c._idle() and now - c._head_since < FRESH_S)]
            idle = [c for c in settled if c._idle()]
            victim = min(idle or settled, key=_since, default=None)  # the longest idle, else the oldest head
            if victim is not None:
                victim.transport.close()
            elif sum(c._probe_only for c in others) < PROBE_SLOTS:
                self._probe_only = True
            else:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        """Feed the parser at most MAX_HEAD_BYTES + 1 bytes of a head: past that, 431 and close."""
        while data and not self.transport.is_closing():
            if not self._in_head():
                super().data_received(data)  # type: ignore[misc]
                break
            if self._head_timer is None:
                self._arm()
            piece, data = data[: MAX_HEAD_BYTES + 1 - self._head_bytes], data[MAX_HEAD_BYTES + 1 - self._head_bytes :]
            self._head_bytes += len(piece)
            super().data_received(piece)  # type: ignore[misc]
            if self.cycle is not self._head_of:  # a head completed within the piece: its rest is uncounted
                self._head_of, self._head_bytes = self.cycle, 0
                self._disarm()
                if self._lingering:
                    self.cycle.keep_alive = False
                if self._probe_only and self.cycle.scope["raw_path"] not in PROBES:
                    self.transport.write(PROBES_ONLY)
                    self.transport.close()
            elif self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                log.warning("request head over %d bytes: 431", MAX_HEAD_BYTES)
                self.transport.write(TOO_LARGE)
                self.transport.close()

    def shutdown(self) -> None:
        """uvicorn's shutdown closes at once a connection whose request has not begun, and with it a request on
        its way: connections opened in the last moment of a drain were reset unanswered (issue 37, D13). One that
        has begun a head, or opened within LINGER_S, gets LINGER_S for it; it is answered (the draining 503,
        `Connection: close`) and closed."""
        fresh = self.cycle is None and self.loop.time() - self._opened < LINGER_S
        if self._in_head() and (self._head_bytes > 0 or fresh):
            self._lingering = True
            self.loop.call_later(LINGER_S, self._linger_over)
            return
        super().shutdown()  # type: ignore[misc]

    def _linger_over(self) -> None:
        if self._in_head() and not self.transport.is_closing():
            super().shutdown()  # type: ignore[misc]
        elif self.cycle is not None:
            self.cycle.keep_alive = False

    def _in_head(self) -> bool:
        """Whether bytes arriving now belong to a request head: no request yet, or the last one's body ended."""
        return self.cycle is None or not self.cycle.more_body or self.cycle.response_complete

    def _idle(self) -> bool:
        """Waiting for a request head that has not begun (a connection that may be closed to make room)."""
        return self._head_bytes == 0 and (self.cycle is None or self.cycle.response_complete)

    def _arm(self) -> None:
        self._disarm()
        self._head_since = self.loop.time()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout, self.cycle)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self, cycle: Any) -> None:
        self._head_timer = None
        if self.cycle is cycle and self._in_head():
            self.transport.close()


def _since(connection: HeadGuard) -> float:
    return connection._head_since


class GuardedHttpToolsProtocol(HeadGuard, HttpToolsProtocol):
    """uvicorn's httptools protocol guarded, as `normserve serve` names it in uvicorn's Config (`http=`, PROTOCOL)."""


class GuardedH11Protocol(HeadGuard, H11Protocol):
    """uvicorn's h11 protocol guarded."""


GUARDED = (GuardedHttpToolsProtocol, GuardedH11Protocol)
# Config's public `http=` takes an import string: each worker process (spawned) imports the class itself.
PROTOCOL = f"{GuardedHttpToolsProtocol.__module__}:{GuardedHttpToolsProtocol.__qualname__}"


def configure(settings: Settings) -> None:
    """The limits of the guarded protocols from a worker's settings (the lifespan's, before the first connection)."""
    for cls in GUARDED:
        cls.header_timeout_s = settings.header_timeout_s
        cls.max_connections = connection_limit(settings)


configure(Settings())  # a worker's own NORMSERVE_* settings until its lifespan configures them


def guarded(protocol: type[Any], settings: Settings) -> type[Any]:
    """uvicorn's HTTP protocol class with HeadGuard in front, bound to the settings (the same class if guarded)."""
    if issubclass(protocol, HeadGuard):
        return protocol
    attrs = {"header_timeout_s": settings.header_timeout_s, "max_connections": connection_limit(settings)}
    return type(f"Guarded{protocol.__name__}", (HeadGuard, protocol), attrs)


def install(config: Any, settings: Settings) -> None:
    """Guard the HTTP protocol a uvicorn Config creates from now on; h11's own head limit made larger than ours.

    The fallback for a bare `uvicorn app.main:app`, whose Config the lifespan finds (app/server/compat.py):
    `normserve serve` names PROTOCOL in its Config. A Config not loaded (a Server that serves nothing, as in
    tests) has no protocol to guard yet."""
    protocol = getattr(config, "http_protocol_class", None)
    if protocol is None:
        return
    config.h11_max_incomplete_event_size = 2 * MAX_HEAD_BYTES
    config.http_protocol_class = guarded(protocol, settings)
