"""app/server/budget.py: bytes counted against a limit as they arrive, room promised to announced bodies, small
requests past promises, stalled bodies cut while others wait, a short wait for room, then BudgetExhausted.

On real sockets: tests/suites/test_memory_budget.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.errors import BodyTimeout, BudgetExhausted
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


def test_bytes_past_what_is_really_free_wait_then_are_refused() -> None:
    async def run() -> tuple[int, str]:
        budget = Budget(100)
        await budget.take(90)
        body = await budget.admit(0)  # chunked: nothing promised, charged as it arrives
        await body.charge(10)
        with pytest.raises(BudgetExhausted) as refused:
            await body.charge(1)
        return budget.used, refused.value.message

    used, message = asyncio.run(run())
    assert used == 100
    assert message.startswith("1 more bytes would pass the limit of 100 bytes")


def test_a_body_is_charged_as_its_bytes_arrive_and_its_promise_shrinks_as_they_do() -> None:
    async def run() -> list[tuple[int, int]]:
        budget = Budget(1000)
        body = await budget.admit(600)
        seen = [(budget.used, budget.promised)]
        await body.charge(200)
        seen.append((budget.used, budget.promised))
        body.finish()  # whole at 200 (an inflated body ends short of its promise): the rest is given back
        seen.append((budget.used, budget.promised))
        body.close()
        seen.append((budget.used, budget.promised))
        return seen

    assert asyncio.run(run()) == [(0, 600), (200, 400), (200, 0), (0, 0)]


@pytest.mark.parametrize(
    ("size", "waits"), [(6, False), (7, True)], ids=["small-passes-promises", "larger-waits-for-promises"]
)
def test_a_small_request_that_fits_in_what_is_really_free_is_never_blocked_by_promises(size: int, waits: bool) -> None:
    # 1/16 of 100 is 6: promises of 95 bytes not yet arrived leave 100 free, but only small requests pass them.
    async def run() -> bool:
        budget = Budget(100)
        await budget.admit(95)
        try:
            await asyncio.wait_for(budget.admit(size), 0.3)
        except TimeoutError:
            return True
        return False

    assert asyncio.run(run()) is waits


@pytest.mark.parametrize(
    ("rate", "arrived", "cut"),
    [(1000, 0, True), (1000, 10_000, False), (0, 0, False)],
    ids=["stalled-is-cut", "keeping-up-is-not", "rate-off"],
)
def test_a_body_behind_the_minimum_rate_is_cut_when_others_wait(rate: int, arrived: int, cut: bool) -> None:
    async def run() -> tuple[bool, bool, int]:
        budget = Budget(100, min_rate=rate)
        stalled = await budget.admit(100)
        stalled.arrive(arrived)
        stalled.started -= 2.0  # past the grace
        try:
            await budget.take(50, wait_s=0.3)
            admitted = True
        except BudgetExhausted:
            admitted = False
        return stalled.was_cut, admitted, budget.promised

    assert asyncio.run(run()) == (cut, cut, 0 if cut else 100)


def test_a_stalled_body_is_not_cut_while_no_one_waits() -> None:
    async def run() -> bool:
        budget = Budget(100, min_rate=1000)
        stalled = await budget.admit(100)
        stalled.started -= 10.0
        await asyncio.sleep(0.2)
        return stalled.was_cut

    assert asyncio.run(run()) is False


def test_a_cut_ends_the_read_in_progress_and_its_charges_raise_the_408() -> None:
    async def run() -> tuple[str, str]:
        budget = Budget(100, min_rate=1000)
        stalled = await budget.admit(100)
        stalled.started -= 2.0

        async def read() -> str:
            try:
                async with asyncio.timeout(None) as stalled.reading:
                    await asyncio.sleep(10)
            except TimeoutError:
                return "ended"
            return "slept"

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)
        await budget.take(50)
        with pytest.raises(BodyTimeout) as late:
            await stalled.charge(1)
        return await reader, late.value.message

    assert asyncio.run(run()) == (
        "ended",
        "body: arrived slower than 1000 bytes/s (NORMSERVE_MIN_BODY_RATE) while other requests waited for room",
    )


def test_a_body_larger_than_the_whole_budget_is_charged_alone() -> None:
    async def run() -> int:
        budget = Budget(100)
        body = await budget.admit(500)
        await body.charge(300)
        await body.charge(200)
        return budget.used

    assert asyncio.run(run()) == 500


@pytest.mark.parametrize(
    ("held", "refused", "expected"),
    [(100, True, True), (95, True, True), (94, True, False), (100, False, False)],
    ids=["full-and-refused", "no-room-for-a-small-one", "room-for-a-small-one", "full-but-no-refusal"],
)
def test_the_budget_reports_refusing_everything_after_a_refusal_with_no_room_even_for_small_requests(
    held: int, refused: bool, expected: bool
) -> None:
    async def run() -> bool:
        budget = Budget(100)
        await budget.take(held)
        if refused:
            with pytest.raises(BudgetExhausted):
                await budget.take(50, wait_s=0)
        return budget.refusing()

    assert asyncio.run(run()) is expected
