"""Fast layer: ``tasks.first_of``, the one race of awaitables: the first to finish ends it, the
racers it started are cancelled and awaited, the caller's futures are left alone."""

from __future__ import annotations

import asyncio

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.tasks import finished, first_of


async def test_the_first_to_finish_wins_and_the_rest_are_cancelled_and_awaited() -> None:
    clock = FakeClock()
    ended: list[str] = []

    async def sleeper(name: str, seconds: float) -> str:
        try:
            await clock.sleep(seconds)
            return name
        finally:
            ended.append(name)

    race = asyncio.create_task(first_of(sleeper("slow", 5.0), sleeper("fast", 1.0)))
    await clock.advance(1.0)
    slow, fast = await race
    assert finished(fast)
    assert fast.result() == "fast"
    assert slow.cancelled()
    assert not finished(slow)
    assert sorted(ended) == ["fast", "slow"], "the loser had ended when the race returned"


async def test_a_future_of_the_caller_is_watched_never_cancelled() -> None:
    clock = FakeClock()
    theirs = asyncio.get_running_loop().create_future()
    race = asyncio.create_task(first_of(theirs, clock.sleep(2.0)))
    await clock.advance(2.0)
    mine, timer = await race
    assert mine is theirs
    assert not theirs.done(), "the caller's future is not cancelled"
    assert finished(timer)
    theirs.set_result(7)
    [won] = await first_of(theirs)
    assert won.result() == 7


async def test_a_cancelled_caller_leaves_no_racer_running() -> None:
    before = asyncio.all_tasks()
    clock = FakeClock()
    race = asyncio.create_task(first_of(clock.sleep(5.0), asyncio.Event().wait()))
    await settle()
    race.cancel()
    with pytest.raises(asyncio.CancelledError):
        await race
    assert asyncio.all_tasks() == before


async def test_a_losers_exception_is_kept_for_the_caller_and_not_logged() -> None:
    async def fails() -> None:
        raise ValueError("late")

    async def wins() -> str:
        return "first"

    won, lost = await first_of(wins(), fails())
    assert won.result() == "first"
    if finished(lost):
        with pytest.raises(ValueError, match="late"):
            lost.result()


async def test_a_race_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        await first_of()
