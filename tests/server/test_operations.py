"""app/server/operations.py: a worker's loads and unloads run one at a time, off the event loop and off every shared
pool, and a call that waits past its bound answers 503 naming the setting."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio.to_thread
import pytest

from app.errors import NotReady
from app.server.operations import Operations


def test_operations_run_one_at_a_time_in_the_order_they_came_on_one_thread() -> None:
    operations = Operations(wait_s=5)
    order: list[tuple[int, str]] = []

    def step(i: int) -> None:
        order.append((i, threading.current_thread().name))
        time.sleep(0.02)

    async def main() -> None:
        await asyncio.gather(*(operations.run("load", lambda _, i=i: step(i)) for i in range(5)))

    asyncio.run(main())
    assert [i for i, _ in order] == [0, 1, 2, 3, 4]
    assert {name for _, name in order} == {"normserve-control_0"}


@pytest.mark.parametrize("action", ["load", "unload"])
def test_a_call_that_waits_past_its_bound_answers_503_and_the_next_one_runs(action: str) -> None:
    operations = Operations(wait_s=0.2)
    release = threading.Event()

    async def main() -> tuple[BaseException | None, float]:
        first = asyncio.create_task(operations.run(action, lambda _: release.wait(5)))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(NotReady) as refused:
            await operations.run(action, lambda _: None)
        waited = time.monotonic() - started
        release.set()
        assert await first is True
        assert await operations.run(action, lambda deadline: deadline - time.monotonic()) > 0.1
        return refused.value, waited

    refused, waited = asyncio.run(main())
    assert str(refused) == (
        f"model control is busy: this {action} waited 0.2 s (NORMSERVE_MODEL_CONTROL_WAIT_S) behind other loads and "
        "unloads of the server; retry"
    )
    assert 0.15 < waited < 1.0


def test_a_caller_that_gives_up_does_not_let_the_next_operation_overlap_the_running_one() -> None:
    operations = Operations(wait_s=5)
    running = threading.Event()
    overlapped: list[bool] = []

    def slow(_: float) -> None:
        running.set()
        time.sleep(0.2)
        running.clear()

    async def main() -> None:
        first = asyncio.create_task(operations.run("load", slow))
        await asyncio.sleep(0.05)
        first.cancel()  # the client went away: the operation goes on to its end, holding its turn
        await operations.run("load", lambda _: overlapped.append(running.is_set()))

    asyncio.run(main())
    assert overlapped == [False]


def test_calls_waiting_their_turn_hold_no_thread_of_the_inference_threadpool() -> None:
    """200 HTTP loads waiting for the server-wide lock each held one of its threads: an inference waited 12 s."""
    operations = Operations(wait_s=5)
    release = threading.Event()

    async def main() -> tuple[int, int]:
        queued = [asyncio.create_task(operations.run("load", lambda _: release.wait(5))) for _ in range(100)]
        await asyncio.sleep(0.1)
        limiter = anyio.to_thread.current_default_thread_limiter()
        held = limiter.borrowed_tokens
        inference = await anyio.to_thread.run_sync(lambda: threading.current_thread().name)
        release.set()
        await asyncio.gather(*queued)
        return held, int(inference.startswith("AnyIO worker thread"))

    assert asyncio.run(main()) == (0, 1)
