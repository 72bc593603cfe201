"""The worker's budget of request body bytes in flight (NORMSERVE_MAX_INFLIGHT_BYTES), on every transport.

Admission counts inferences only once their bodies are in memory, so it bounded nothing while they
arrived: 8 concurrent 61 MiB gRPC calls took a worker to 2,330 MiB, past its pod's 2 GiB, and 32
uploads refused by NORMSERVE_MAX_IN_FLIGHT=2 had still been read whole (docs/reliability.md). Here a
body is counted before it is read where its size is known (Content-Length; a gRPC message's length as
soon as grpc hands it over), and as it grows where it is not (chunked). Past the budget a request
waits up to WAIT_S for room, then is refused: 503 / RESOURCE_EXHAUSTED with Retry-After. A body larger
than the whole budget is admitted alone, when nothing else is counted.

HTTP counts a body as its route reads it (app/server/http/budget.py); the gRPC handlers use `Budget.hold`
around the call. grpc reads a message whole before any handler runs, so there the bound is grpc's: RPCs at
once and their message size (app/server/api/v2/grpc/server.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from app.errors import BudgetExhausted

# How long a request waits for room before its 503: long enough for a big body ahead of it to be answered
# (a 61 MiB binary request takes ~0.3 s), short against any client's timeout.
WAIT_S = 1.0
# A body past this is followed by trim_heap (below).
TRIM_AFTER_BYTES = 8 * 2**20


class Budget:
    """Bytes counted now against a limit; used on the event loop only (HTTP and grpc.aio share it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: list[asyncio.Future[None]] = []

    def fits(self, n: int) -> bool:
        return self.used + n <= self.limit or self.used == 0

    async def take(self, n: int, wait_s: float = WAIT_S, what: str = "") -> None:
        """Count n bytes, waiting up to wait_s for room; BudgetExhausted after that (naming them as `what`)."""
        deadline = time.monotonic() + wait_s
        while not self.fits(n):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._exhausted(what or f"{n} more bytes")
            woken = asyncio.get_running_loop().create_future()
            self._waiting.append(woken)
            try:
                await asyncio.wait_for(woken, remaining)  # no queue: whoever fits first goes first
            except TimeoutError:
                pass
            finally:
                if woken in self._waiting:
                    self._waiting.remove(woken)
        self.used += n

    def grow(self, n: int) -> None:
        """Count n more bytes of a body already being read, at once or BudgetExhausted (no waiting mid-body)."""
        if self.used + n > self.limit:
            raise self._exhausted(f"{n} more bytes")
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n
        waiting, self._waiting = self._waiting, []
        for woken in waiting:
            if not woken.done():
                woken.set_result(None)

    @asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        """n bytes counted for the block's duration."""
        await self.take(n)
        try:
            yield
        finally:
            self.give(n)

    def _exhausted(self, what: str) -> BudgetExhausted:
        return BudgetExhausted(
            f"{what} would pass the limit of {self.limit} bytes of request bodies in flight"
            f" ({self.used} now, NORMSERVE_MAX_INFLIGHT_BYTES); retry shortly"
        )


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
