"""The tests' one way to wait for a condition (sync or on an event loop) and to run a coroutine on a loop of
this (main) thread, bounded so that a failing test never hangs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run coro on a new event loop of this (main) thread. Not asyncio.run, which installs a SIGINT handler itself."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def wait_until(
    condition: Callable[[], object], what: str = "the condition", timeout: float = 30.0, every: float = 0.1
) -> None:
    """Poll condition every `every` s until it holds; fail naming `what` after timeout s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(every)


async def until(condition: Callable[[], object], what: str = "the condition", timeout: float = 10.0) -> None:
    """wait_until on an event loop: the loop runs on between polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.005)
