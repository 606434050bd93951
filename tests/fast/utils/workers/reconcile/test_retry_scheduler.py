"""Fast layer: ``retry_scheduler.py`` rows (latest-wins deadlines swept by one poll loop)."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.retry_scheduler import POLL_INTERVAL, RetryScheduler


class _Fired:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: list[tuple[str, float]] = []

    def __call__(self, key: str) -> None:
        self.at.append((key, self.clock.time()))


def _scheduler(
    *, base: float = 1.0, cap: float = 60.0
) -> tuple[FakeClock, _Fired, RetryScheduler[str]]:
    """A scheduler on a fake clock whose retries are noted, with the times they fired at."""
    clock = FakeClock()
    fired = _Fired(clock)
    scheduler = RetryScheduler(
        on_retry=fired, failure_base_delay=base, failure_max_delay=cap, clock=clock
    )
    return clock, fired, scheduler


async def test_poll_interval_is_one_second() -> None:
    assert POLL_INTERVAL == 1.0


async def test_row_delaying_queue_replaced_retry_fires_at_most_one_poll_interval_late() -> None:
    """Row "Delaying queue ... Replaced by latest-wins deadlines swept by one POLL_INTERVAL loop":
    a retry never fires early and at most one POLL_INTERVAL after its deadline."""
    clock, fired, scheduler = _scheduler(base=2.0)
    await clock.advance(0.3)
    scheduler.note_failure("cell-0")
    await clock.advance(2.0)
    assert fired.at == [], "the tick at 2.0 comes before the 2.3 deadline"
    await clock.advance(1.0)
    assert fired.at == [("cell-0", 3.0)]
    assert 2.3 <= fired.at[0][1] <= 2.3 + POLL_INTERVAL
    await clock.advance(10)
    assert fired.at == [("cell-0", 3.0)], "a fired retry does not repeat"
    await scheduler.shutdown()


async def test_backoff_doubles_per_failure_and_is_capped() -> None:
    """Delay is base * 2**(n-1), capped at failure_max_delay."""
    clock, fired, scheduler = _scheduler(base=1.0, cap=5.0)
    fire_times = []
    for _ in range(5):
        failed_at = clock.time()
        scheduler.note_failure("k")
        while not fired.at:
            await clock.advance(POLL_INTERVAL)
        fire_times.append(fired.at.pop()[1] - failed_at)
    assert fire_times == [1.0, 2.0, 4.0, 5.0, 5.0]
    await scheduler.shutdown()


async def test_latest_failure_wins_over_an_earlier_deadline() -> None:
    """Latest-wins: a new failure overwrites the deadline instead of adding a second one."""
    clock, fired, scheduler = _scheduler(base=1.0)
    scheduler.note_failure("k")  # due at 1
    scheduler.note_failure("k")  # due at 2, replaces 1
    await clock.advance(1.0)
    assert fired.at == []
    await clock.advance(1.0)
    assert fired.at == [("k", 2.0)]
    await scheduler.shutdown()


async def test_success_forgets_the_key_and_its_pending_retry() -> None:
    clock, fired, scheduler = _scheduler(base=1.0)
    for _ in range(4):
        scheduler.note_failure("k")
    scheduler.note_success("k")
    await clock.advance(100)
    assert fired.at == []
    scheduler.note_failure("k")
    await clock.advance(1.0)
    assert fired.at == [("k", 101.0)], "the count restarted at one failure"
    await scheduler.shutdown()


async def test_row_bucket_limiter_dropped_many_keys_retry_on_their_own_schedules() -> None:
    """Row "Bucket rate limiter: Dropped": no global budget; 500 failing keys all fire on time."""
    clock, fired, scheduler = _scheduler(base=1.0)
    for i in range(500):
        scheduler.note_failure(f"k{i}")
    await clock.advance(1.0)
    assert len(fired.at) == 500
    await scheduler.shutdown()


async def test_row_on_retry_callback_replaces_the_queue_embedded_in_the_delaying_queue() -> None:
    """Row "Delaying queue is a queue: Replaced by an on_retry callback": the scheduler only
    pushes, and any sink works; a sink that raises is logged and the poller keeps sweeping."""
    clock = FakeClock()
    pushed: list[int] = []

    def sink(key: int) -> None:
        if key == 0:
            raise RuntimeError("sink refused")
        pushed.append(key)

    scheduler: RetryScheduler[int] = RetryScheduler(
        on_retry=sink, failure_base_delay=1.0, failure_max_delay=1.0, clock=clock
    )
    scheduler.note_failure(0)
    scheduler.note_failure(1)
    await clock.advance(1.0)
    scheduler.note_failure(2)
    await clock.advance(1.0)
    assert pushed == [1, 2]
    await scheduler.shutdown()


async def test_row_poller_starts_in_init_and_shutdown_leaves_no_task() -> None:
    """Row "Delaying queue": the poller is created in __init__ (so construction needs a running
    loop) and ticks while idle; shutdown() cancels and awaits it."""
    before = asyncio.all_tasks()
    clock, _, scheduler = _scheduler()
    await clock.advance(0)
    assert clock.sleepers == 1, "idle poller parked on the clock"
    await clock.advance(5 * POLL_INTERVAL)
    assert clock.sleepers == 1
    assert len(asyncio.all_tasks() - before) == 1
    await scheduler.shutdown()
    assert asyncio.all_tasks() == before


def test_row_poller_construction_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        RetryScheduler(on_retry=print, failure_base_delay=1, failure_max_delay=1, clock=FakeClock())


async def test_huge_failure_counts_stay_capped_without_overflow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, fired, scheduler = _scheduler(base=1.0, cap=30.0)
    with caplog.at_level(logging.ERROR):
        for _ in range(5000):
            scheduler.note_failure("k")
    await clock.advance(30)
    assert fired.at == [("k", 30.0)]
    assert not caplog.records
    await scheduler.shutdown()


@pytest.mark.parametrize("stop", ["shutdown", "cancel"])
async def test_after_shutdown_nothing_is_pending_and_a_failure_records_nothing(stop: str) -> None:
    """A retry that can never fire is not pending. What waited is dropped at
    shutdown, and a failure noted later returns an infinite delay and records nothing."""
    clock, fired, scheduler = _scheduler()
    scheduler.note_failure("cell-0", "boom")
    assert [retry.key for retry in scheduler.pending()] == ["cell-0"]
    if stop == "shutdown":
        await scheduler.shutdown()
    else:
        scheduler.cancel()
    assert scheduler.stopped
    assert scheduler.pending() == []
    assert scheduler.note_failure("cell-1", "late") == math.inf
    assert (scheduler.pending(), scheduler.failures("cell-1"), scheduler.retries) == ([], 0, 1)
    await clock.advance(100.0)
    assert fired.at == []
    await scheduler.shutdown()


@pytest.mark.parametrize(("base", "cap"), [(2.0, 1.0), (1.0, 0.5), (60.0, 1e-9)])
async def test_a_maximum_delay_below_the_base_is_rejected_naming_both(
    base: float, cap: float
) -> None:
    """It used to make every delay the maximum, silently (client-go's
    ``ItemExponentialFailureRateLimiter`` does the same); the original rejected it."""
    before = asyncio.all_tasks()
    message = rf"failure_max_delay \({cap!r}\) must be at least failure_base_delay \({base!r}\)"
    with pytest.raises(ValueError, match=message):
        _scheduler(base=base, cap=cap)
    assert asyncio.all_tasks() == before
