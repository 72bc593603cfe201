"""The worker's budget of request body bytes in flight (NORMSERVE_MAX_INFLIGHT_BYTES), on every transport.

Admission counts inferences only once their bodies are in memory, so it bounded nothing while they
arrived: 8 concurrent 61 MiB gRPC calls took a worker to 2,330 MiB, past its pod's 2 GiB, and 32
uploads refused by NORMSERVE_MAX_IN_FLIGHT=2 had still been read whole (docs/reliability.md).

The budget counts what a request holds in memory, as it comes to hold it (issue 37):

- A body is admitted (`admit`) with room promised for what it announces (Content-Length; a gRPC
  message's largest size), then charged (`Body.charge`) as its bytes arrive, and a compressed body at
  its inflated size as it inflates: counting wire bytes let 32 gzip bodies of 66 KB hold 3.1 GiB.
  Bytes past the promise, or past what is really free, wait for room (the body's reading pauses).
- Promised room is no memory: a request that fits in what is really free (not held) and is small
  (at most 1/16 of the budget) is admitted even when promises fill the budget. Four uploads that
  announced 64 MiB and sent nothing had refused every request for 30 s.
- A body that falls behind NORMSERVE_MIN_BODY_RATE (after STALL_GRACE_S) while others wait for room is
  cut: its promise is given back at once and its request ends 408 (its connection closed).

Past the budget a request waits up to WAIT_S for room, then is refused: 503 / RESOURCE_EXHAUSTED with
Retry-After. A body larger than the whole budget is admitted alone, when nothing else is counted.
HTTP bodies are counted by app/server/http/budget.py (inflated ones by http/body.py); gRPC's ModelInfer
by calls.gated, a stream's messages by `hold` (grpc reads a message whole, so there the promise is the
largest message, charged before grpc is let read it).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from app.errors import BodyTimeout, BudgetExhausted

# How long a request waits for room before its 503: long enough for a big body ahead of it to be answered
# (a 61 MiB binary request takes ~0.3 s), short against any client's timeout.
WAIT_S = 1.0
# How often a waiting request looks for stalled bodies to cut (a stall is a matter of time, not of an event).
POLL_S = 0.1
# A body is judged by NORMSERVE_MIN_BODY_RATE only after this long: its first bytes may take a round trip or two.
STALL_GRACE_S = 1.0
# A request this small (as a share of the budget) is admitted past promises, into what is really free.
SMALL_SHARE = 16
# How long after a refusal readiness may report the budget refusing everything (a probe comes every few seconds).
REFUSING_S = 2 * WAIT_S
# A body past this is followed by trim_heap (below).
TRIM_AFTER_BYTES = 8 * 2**20


class Budget:
    """Bytes held and room promised against a limit; used on the event loop only (HTTP and grpc.aio share it)."""

    def __init__(self, limit: int, min_rate: int = 0) -> None:
        self.limit = limit
        self.min_rate = min_rate  # bytes/s a body must keep up while others wait (0: never cut)
        self.used = 0  # bytes held now
        self.promised = 0  # room promised to admitted bodies, not yet held
        self._waiting: list[asyncio.Future[None]] = []
        self._bodies: set[Body] = set()
        self._refused_at = -float("inf")

    def refusing(self) -> bool:
        """Whether the worker refuses every request with a body now: a refusal within REFUSING_S, and bytes held
        leave no room even for a small request (readiness says so: app/server/admission.py)."""
        recent = time.monotonic() - self._refused_at < REFUSING_S
        return recent and self.used + self.limit // SMALL_SHARE > self.limit

    def fits(self, n: int) -> bool:
        return self.used + self.promised + n <= self.limit or self.used + self.promised == 0

    async def admit(self, n: int, what: str = "") -> Body:
        """A body announcing n bytes, with room promised for them; waits up to WAIT_S, else BudgetExhausted."""
        small = n <= self.limit // SMALL_SHARE
        # A body of unknown length (chunked) is only charged as it arrives. Room checked before any wait: most
        # bodies fit at once, and the wait's closure and call were a small /normalize's budget cost (callgrind).
        if n and not self.fits(n):
            await self._wait(lambda: self.fits(n) or (small and self.used + n <= self.limit), what or f"{n} more bytes")
        body = Body(self, n)
        self.promised += n
        self._bodies.add(body)
        return body

    async def take(self, n: int, wait_s: float = WAIT_S, what: str = "") -> None:
        """Count n bytes held, waiting up to wait_s for room; BudgetExhausted after that (naming them as `what`)."""
        await self._wait(lambda: self.fits(n), what or f"{n} more bytes", wait_s)
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n
        self._wake()

    @asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        """n bytes counted for the block's duration."""
        await self.take(n)
        try:
            yield
        finally:
            self.give(n)

    def _wake(self) -> None:
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, []
        for woken in waiting:
            if not woken.done():
                woken.set_result(None)

    async def _wait(self, room: Callable[[], bool], what: str, wait_s: float = WAIT_S) -> None:
        """Until room() (no queue: whoever fits first goes first), cutting stalled bodies while waiting."""
        deadline = time.monotonic() + wait_s
        while not room():
            self._cut_stalled()
            if room():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._exhausted(what)
            woken = asyncio.get_running_loop().create_future()
            self._waiting.append(woken)
            try:
                await asyncio.wait_for(woken, min(remaining, POLL_S) if self.min_rate else remaining)
            except TimeoutError:
                pass
            finally:
                if woken in self._waiting:
                    self._waiting.remove(woken)

    def _cut_stalled(self) -> None:
        if not self.min_rate:
            return
        now = time.monotonic()
        for body in [b for b in self._bodies if b.stalled(now)]:
            body.cut()

    def _exhausted(self, what: str) -> BudgetExhausted:
        self._refused_at = time.monotonic()
        return BudgetExhausted(
            f"{what} would pass the limit of {self.limit} bytes of request bodies in flight"
            f" ({self.used + self.promised} now, NORMSERVE_MAX_INFLIGHT_BYTES); retry shortly"
        )


class Body:
    """One request body's account: room promised, bytes held, bytes arrived (its rate); `close()` gives all back."""

    def __init__(self, budget: Budget, promised: int) -> None:
        self.budget = budget
        self.promised = promised
        self.held = 0
        self.arrived = 0  # bytes received so far (wire bytes: the rate is the client's)
        self.started = time.monotonic()
        self.complete = False  # arrived in full: no longer judged by the rate
        self.was_cut = False
        # The read of its bytes in progress (`async with asyncio.timeout(...) as body.reading`): a cut ends it at once.
        self.reading: asyncio.Timeout | None = None

    async def charge(self, n: int, what: str = "") -> None:
        """n more bytes held (arrived, or inflated): from the promise, else from free room, waiting up to WAIT_S."""
        budget = self.budget
        own = min(n, self.promised)
        if not self._room(n, own):
            await budget._wait(lambda: self._room(n, own), what or f"{n} more bytes")
        self.promised -= own
        budget.promised -= own
        budget.used += n
        self.held += n

    def _room(self, n: int, own: int) -> bool:
        if self.was_cut:
            raise self.stall_error()
        budget = self.budget
        if budget.used == self.held and budget.promised == self.promised:  # alone: a body larger than the budget
            return True
        # Its promise is room no other promise counts on, yet it must not pass what is really free (the small
        # requests admitted past promises hold some of it for a moment).
        return budget.used + n <= budget.limit and (own == n or budget.fits(n - own))

    def arrive(self, n: int) -> None:
        self.arrived += n

    def finish(self) -> None:
        """The body is whole: what it promised beyond its bytes is given back, and the rate no longer applies."""
        self.complete = True
        self._unpromise()

    def release(self, n: int) -> None:
        """n of its bytes are no longer held."""
        self.held -= n
        self.budget.give(n)

    def close(self, *_: object) -> None:
        """Everything given back (its arguments ignored: it is a done callback of the call or task holding it)."""
        if not self.complete or self.promised:
            self.finish()
        self.budget._bodies.discard(self)
        self.release(self.held)

    def stalled(self, now: float) -> bool:
        elapsed = now - self.started - STALL_GRACE_S
        return not (self.complete or self.was_cut) and elapsed > 0 and self.arrived < self.budget.min_rate * elapsed

    def cut(self) -> None:
        """Stalled while others wait: its promise goes back now, its bytes when its request ends (408)."""
        self.was_cut = True
        self._unpromise()
        if self.reading is not None:
            self.reading.reschedule(asyncio.get_running_loop().time())

    def stall_error(self, field: str = "body") -> BodyTimeout:
        rate = f"{self.budget.min_rate} bytes/s (NORMSERVE_MIN_BODY_RATE)"
        return BodyTimeout(f"arrived slower than {rate} while other requests waited for room", field)

    def _unpromise(self) -> None:
        self.budget.promised -= self.promised
        self.promised = 0
        self.budget._wake()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None  # glibc only
    return trim


async def trim_heap(size: int) -> None:
    """After a body of `size` bytes has arrived, hand the heap's free pages back to the OS (glibc's malloc_trim).

    grpc receives a message in many small buffers, then copies it into one bytes object and frees them; glibc kept
    those pages (its trim threshold grows with the large blocks it has freed), so a 61 MiB ModelInfer peaked at
    3.1x its body in some runs and 4.1x in others; with the trim, 3.1x in every run (scripts/peak_memory.py)."""
    trim = _malloc_trim()
    if size > TRIM_AFTER_BYTES and trim is not None:
        await asyncio.to_thread(trim, 0)  # milliseconds on a large heap: off the event loop
