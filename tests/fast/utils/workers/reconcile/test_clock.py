"""Fast layer: the fake clock every timing test relies on."""

from __future__ import annotations

import asyncio

from miles.utils.workers.reconcile.clock import FakeClock, RealClock, time_function


async def test_fake_clock_releases_sleepers_in_deadline_order() -> None:
    clock = FakeClock(start=10.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.time()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("late", 3), ("early", 1), ("mid", 2))]
    await clock.advance(0)
    assert woke == []
    await clock.advance(2.5)
    assert woke == [("early", 11.0), ("mid", 12.0)]
    assert clock.time() == 12.5
    await clock.advance(0.5)
    assert woke[-1] == ("late", 13.0)
    await asyncio.gather(*tasks)


async def test_fake_clock_runs_what_a_woken_sleeper_schedules_before_returning() -> None:
    clock = FakeClock()
    chain: list[float] = []

    async def twice() -> None:
        await clock.sleep(1)
        chain.append(clock.time())
        await clock.sleep(1)
        chain.append(clock.time())

    task = asyncio.create_task(twice())
    await clock.advance(5)
    assert chain == [1.0, 2.0]
    await task


async def test_real_clock_is_the_event_loop_time() -> None:
    before = asyncio.get_running_loop().time()
    assert RealClock().time() >= before


async def test_time_function_reads_what_the_clock_reads() -> None:
    fake = FakeClock(7.0)
    assert time_function(fake)() == 7.0
    real = RealClock()
    before = real.time()
    assert before <= time_function(real)() <= real.time()
