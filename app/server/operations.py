"""A worker's repository loads and unloads: one at a time, queued on the event loop with a bounded wait, each run
on the worker's own control thread.

Why neither the inference threadpool nor asyncio's default executor: an operation may wait for the server-wide lock
(app/server/modelsync.py) and then for its peers to apply it. In the inference pool each waiting call held a
thread inference needs (200 HTTP loads delayed one inference by 12 s); in the default executor, shared with the
model-state watcher and the drain, six waiting gRPC calls left the worker unable to apply the generation the lock's
holder waited for: 300 s per operation, 23 of 24 calls past their deadline, and a drain of 261 s. Queued calls here
hold no thread; past NORMSERVE_MODEL_CONTROL_WAIT_S (also spent waiting for the server-wide lock) they answer 503
with Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from app.errors import NotReady

T = TypeVar("T")


def busy(action: str, wait_s: float) -> NotReady:
    """The refusal of an operation that waited its whole bound (here, or for the server-wide lock)."""
    return NotReady(
        f"model control is busy: this {action} waited {wait_s:g} s (NORMSERVE_MODEL_CONTROL_WAIT_S) behind other "
        "loads and unloads of the server; retry"
    )


class Operations:
    """The queue of one worker's loads and unloads (HTTP and gRPC alike)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._lock: asyncio.Lock | None = None  # made on the event loop that first runs an operation
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="normserve-control")

    async def run(self, action: str, operation: Callable[[float], T]) -> T:
        """operation(deadline) on the control thread once the operations queued before it ended; `deadline`
        (time.monotonic()) bounds what it may still wait for. 503 if this one's turn does not come in time."""
        deadline = time.monotonic() + self.wait_s
        lock = self._lock = self._lock or asyncio.Lock()
        try:
            await asyncio.wait_for(lock.acquire(), self.wait_s)
        except TimeoutError:
            raise busy(action, self.wait_s) from None
        try:
            done = asyncio.get_running_loop().run_in_executor(self._thread, operation, deadline)
        except BaseException:
            lock.release()
            raise
        # The next one starts when this one ends, not when its caller stops waiting (a client gone, a shutdown).
        done.add_done_callback(lambda _: lock.release())
        return await asyncio.shield(done)
