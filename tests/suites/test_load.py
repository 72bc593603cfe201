"""Load: 60 s at concurrency 32 of mixed valid and invalid requests; no 5xx, no wrong answer, flat memory."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from app.core.runtime import Runtime
from tests.live_server import server_process
from tests.loadgen import Tally, mixed_cases, run_load

SECONDS = 60.0
CONCURRENCY = 32
WINDOW_S = 10.0  # RSS is compared between the first and the last window of this length
MAX_REQUESTS = 2_000_000  # a bound in count as well as in time


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc (VmRSS, in KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


async def sample_rss(pid: int, until: float, samples: list[tuple[float, int]]) -> None:
    while time.monotonic() < until:
        samples.append((time.monotonic(), rss_kib(pid)))
        await asyncio.sleep(0.5)


async def load_with_rss(base: str, pid: int, runtime: Runtime) -> tuple[Tally, list[tuple[float, int]]]:
    tally, samples = Tally(), []
    cases = mixed_cases(runtime)
    start = time.monotonic()
    await asyncio.gather(
        run_load(base, cases, CONCURRENCY, SECONDS, MAX_REQUESTS, tally),
        sample_rss(pid, start + SECONDS, samples),
    )
    return tally, samples


@pytest.mark.slow
def test_sixty_seconds_of_mixed_load_loses_nothing_and_memory_stays_flat(runtime: Runtime) -> None:
    with server_process({"NORMSERVE_LOG_LEVEL": "warning"}) as (base, proc):
        tally, samples = asyncio.run(load_with_rss(base, proc.pid, runtime))
        assert proc.poll() is None, "the server died under load"
    t0, t1 = samples[0][0], samples[-1][0]
    first = statistics.median(kib for t, kib in samples if t <= t0 + WINDOW_S)
    last = statistics.median(kib for t, kib in samples if t >= t1 - WINDOW_S)
    growth = (last - first) / first
    summary = tally.summary()
    print(f"\nload: {summary}, RSS first {first / 1024:.1f} MiB, last {last / 1024:.1f} MiB, growth {growth:+.1%}")
    assert t1 - t0 >= SECONDS - 2, "the load ended early"
    assert summary["valid"] > 1000 and summary["invalid"] > 300, summary
    assert tally.failures(valid=True) == [], tally.failures(valid=True)[:5]
    assert tally.failures(valid=False) == [], tally.failures(valid=False)[:5]
    assert growth < 0.10, f"RSS grew {growth:.1%} between the first and the last {WINDOW_S:.0f} s"
