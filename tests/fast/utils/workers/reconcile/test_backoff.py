"""Backoff: Go's wait.Backoff steps, jitter bounds, the cap and the reset every reset_after."""

from __future__ import annotations

import math

import pytest

from miles.utils.workers.reconcile.backoff import Backoff
from miles.utils.workers.reconcile.clock import FakeClock


def _no_jitter(clock: FakeClock, **kwargs: float) -> Backoff:
    return Backoff(clock=clock, rand=lambda: 0.0, **kwargs)


def test_delays_double_from_initial_up_to_the_cap() -> None:
    backoff = _no_jitter(FakeClock())
    assert [backoff.next_delay() for _ in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]


def test_jitter_stretches_each_delay_by_up_to_its_own_length() -> None:
    low = Backoff(clock=FakeClock(), rand=lambda: 0.0)
    high = Backoff(clock=FakeClock(), rand=lambda: 0.999)
    assert low.next_delay() == pytest.approx(0.8)
    assert high.next_delay() == pytest.approx(0.8 * 1.999)


async def test_steps_start_over_every_reset_after_even_while_failures_continue() -> None:
    """Go ``backoffManager.Step``: the reset is timed from the last reset, not from the last
    step, so failures every 30 s do not hold the delay at the cap."""
    clock = FakeClock()
    backoff = _no_jitter(clock)
    delays = []
    for _ in range(6):
        delays.append(backoff.next_delay())
        await clock.advance(30.0)
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 0.8]


async def test_a_delay_asked_for_long_after_the_last_reset_starts_over() -> None:
    clock = FakeClock()
    backoff = _no_jitter(clock)
    for _ in range(5):
        backoff.next_delay()
    await clock.advance(119.0)
    assert backoff.next_delay() == 25.6
    await clock.advance(2.0)
    assert backoff.next_delay() == 0.8


async def test_reset_restarts_the_reset_interval() -> None:
    clock = FakeClock()
    backoff = _no_jitter(clock)
    await clock.advance(100.0)
    backoff.reset()
    backoff.next_delay()
    await clock.advance(100.0)
    assert backoff.next_delay() == 1.6


def test_reset_starts_over() -> None:
    backoff = _no_jitter(FakeClock(), initial=2.0)
    backoff.next_delay()
    backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 2.0


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan])
def test_a_non_positive_or_infinite_initial_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="initial"):
        Backoff(clock=FakeClock(), initial=bad)
