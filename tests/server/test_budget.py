"""app/server/budget.py: bytes counted against a limit, a short wait for room, then BudgetExhausted naming the setting.

On real sockets: tests/suites/test_memory_budget.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.errors import BudgetExhausted
from app.server.budget import Budget


def test_bytes_within_the_limit_are_counted_and_given_back() -> None:
    async def run() -> list[int]:
        budget = Budget(100)
        seen = []
        async with budget.hold(60):
            seen.append(budget.used)
            await budget.take(40)
            seen.append(budget.used)
            budget.give(40)
        seen.append(budget.used)
        return seen

    assert asyncio.run(run()) == [60, 100, 0]


def test_past_the_limit_a_request_waits_then_is_refused_naming_the_setting() -> None:
    async def run() -> tuple[str, float]:
        budget = Budget(100)
        await budget.take(80)
        start = time.monotonic()
        with pytest.raises(BudgetExhausted) as refused:
            await budget.take(30, wait_s=0.2)
        return refused.value.message, time.monotonic() - start

    message, waited = asyncio.run(run())
    assert message == (
        "30 more bytes would pass the limit of 100 bytes of request bodies in flight (80 now,"
        " NORMSERVE_MAX_INFLIGHT_BYTES); retry shortly"
    )
    assert 0.2 <= waited < 1.0


def test_a_waiting_request_goes_ahead_once_room_is_given_back() -> None:
    async def run() -> int:
        budget = Budget(100)
        await budget.take(80)
        asyncio.get_running_loop().call_later(0.05, budget.give, 80)
        await budget.take(30, wait_s=1.0)
        return budget.used

    assert asyncio.run(run()) == 30


def test_a_body_larger_than_the_whole_budget_is_admitted_alone() -> None:
    async def run() -> int:
        budget = Budget(100)
        await budget.take(500, wait_s=0)
        return budget.used

    assert asyncio.run(run()) == 500


def test_a_body_growing_past_the_limit_is_refused_at_once() -> None:
    budget = Budget(100)
    budget.grow(90)
    with pytest.raises(BudgetExhausted):
        budget.grow(11)
    assert budget.used == 90
