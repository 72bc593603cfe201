"""Dynamic batching (Triton-style): concurrent encoder requests of one sequence length share one session.run.

Worker threads call `Batcher.run(x, mask, names)` and block; one batching thread per model
takes the oldest request, gathers others with the same (seq length, outputs) until the
batch holds NORMSERVE_BATCH_MAX_SIZE rows or NORMSERVE_BATCH_DELAY_US has passed, runs the
merged batch once and hands each caller its own rows. Rows of a batch never see each
other (attention is within a sequence, LayerNorm within a position), so each caller gets
what an unbatched run gives; tests/test_batching.py checks that against the reference.

It stops waiting early once every request in flight in this worker is in the batch
(`in_flight`): with nobody else coming, waiting would only add latency; a request alone in
the worker (concurrency 1) runs in its own thread, without the hand-off, and so does a
sequence longer than NORMSERVE_BATCH_MAX_SEQ_LEN, which a merged run makes no cheaper on CPU.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

RunFn = Callable[[dict[str, np.ndarray], list[str]], list[np.ndarray]]


@dataclass(eq=False)
class _Pending:
    x: np.ndarray  # B,T,C float32
    mask: np.ndarray  # B,T bool
    names: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[np.ndarray] | None = None
    error: BaseException | None = None

    @property
    def key(self) -> tuple[int, tuple[str, ...]]:
        return self.x.shape[1], tuple(self.names)


class Batcher:
    """Merges concurrent runs of one encoder; `run` has the signature and results of an unbatched run."""

    def __init__(
        self,
        run: RunFn,
        max_size: int,
        delay_us: int,
        in_flight: Callable[[], int] | None = None,
        name: str = "",
        max_seq_len: int | None = None,
    ) -> None:
        self._run = run
        self.max_size = max_size
        self.max_seq_len = max_seq_len
        self.delay_s = delay_us / 1e6
        self._in_flight = in_flight
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._name = name
        self._closed = False

    def close(self) -> None:
        """Merge no more (the model version is retired): queued requests still run, later ones run alone."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def run(self, x: np.ndarray, mask: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """Queue one request and block until its rows of a batch come back."""
        too_long = self.max_seq_len is not None and x.shape[1] > self.max_seq_len
        if too_long or self._closed or (self._in_flight is not None and self._in_flight() <= 1):
            # Long sequences cost as much merged as alone (NORMSERVE_BATCH_MAX_SEQ_LEN); a request alone in
            # this worker has nothing to merge with: either way, run here, without the hand-off.
            return self._run({"input": x, "padding_mask": mask}, names)
        item = _Pending(x, mask, names)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"batcher-{self._name}", daemon=True)
                self._thread.start()
            self._queue.append(item)
            self._cond.notify_all()
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def _loop(self) -> None:
        while batch := self._gather():
            self._execute(batch)

    def _gather(self) -> list[_Pending]:
        """The oldest request and every compatible one that arrives before the batch is full or the delay ends."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queue) or self._closed)
            if not self._queue:
                return []  # closed and drained: the thread ends
            first = self._queue.popleft()
            batch, rows = [first], len(first.x)
            deadline = time.monotonic() + self.delay_s
            while rows < self.max_size:
                rows += self._take_compatible(first.key, batch, self.max_size - rows)
                if rows >= self.max_size or self._nobody_else_coming(len(batch)):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return batch

    def _take_compatible(self, key: tuple[int, tuple[str, ...]], batch: list[_Pending], room: int) -> int:
        """Move queued requests of the same key that fit into the batch; the rows added."""
        added = 0
        for item in list(self._queue):
            if item.key == key and len(item.x) <= room - added:
                self._queue.remove(item)
                batch.append(item)
                added += len(item.x)
        return added

    def _nobody_else_coming(self, batched: int) -> bool:
        if self._in_flight is None:
            return False  # no signal: wait the whole delay, as Triton does
        return batched + len(self._queue) >= self._in_flight()

    def _execute(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            self._execute_alone(batch[0])
            return
        try:
            x = np.concatenate([p.x for p in batch])  # N,T,C
            mask = np.concatenate([p.mask for p in batch])  # N,T
            outs = self._run({"input": x, "padding_mask": mask}, batch[0].names)
        except Exception:
            # A failed merged run must not fail the others: run each alone, so only its own error reaches it.
            for item in batch:
                self._execute_alone(item)
            return
        start = 0
        for item in batch:
            stop = start + len(item.x)
            item.result = [o[start:stop] for o in outs]  # every output is batch-major: B,T,... rows
            start = stop
            item.done.set()

    def _execute_alone(self, item: _Pending) -> None:
        try:
            item.result = self._run({"input": item.x, "padding_mask": item.mask}, item.names)
        except BaseException as e:  # handed to the caller's thread, which raises it
            item.error = e
        item.done.set()
