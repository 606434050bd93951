"""Fast layer: ``CollectorPause``, the shared pause of the cyclic garbage collector (row
``gc_pause.py``): holders counted across awaits, the collector restored only by the last one, and
only if it was on, whatever ends a holder's block."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from miles.utils.workers.reconcile.gc_pause import CollectorPause


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def test_a_holder_pauses_the_collector_and_restores_it() -> None:
    pause = CollectorPause()
    with pause.held():
        assert not gc.isenabled()
        assert pause.holders == 1
    assert gc.isenabled()
    assert pause.holders == 0


def test_a_collector_that_was_off_stays_off() -> None:
    pause = CollectorPause()
    gc.disable()
    with pause.held():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_exception_restores_the_collector() -> None:
    pause = CollectorPause()
    with pytest.raises(RuntimeError, match="boom"), pause.held():
        raise RuntimeError("boom")
    assert gc.isenabled()
    assert pause.holders == 0


async def test_overlapping_holders_across_awaits_restore_it_only_when_the_last_leaves() -> None:
    """Two reflectors listing at once: the first to finish must not switch the collector back
    on under the second."""
    pause = CollectorPause()
    first_in, second_in, first_may_leave, second_may_leave = (asyncio.Event() for _ in range(4))
    seen: list[tuple[str, bool]] = []

    async def holder(name: str, entered: asyncio.Event, may_leave: asyncio.Event) -> None:
        with pause.held():
            entered.set()
            await may_leave.wait()
        seen.append((name, gc.isenabled()))

    first = asyncio.create_task(holder("first", first_in, first_may_leave))
    await first_in.wait()
    second = asyncio.create_task(holder("second", second_in, second_may_leave))
    await second_in.wait()
    assert pause.holders == 2
    first_may_leave.set()
    await first
    assert not gc.isenabled()
    second_may_leave.set()
    await second
    assert seen == [("first", False), ("second", True)]
    assert pause.holders == 0


async def test_a_cancelled_holder_restores_the_collector() -> None:
    pause = CollectorPause()
    entered = asyncio.Event()

    async def holder() -> None:
        with pause.held():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(holder())
    await entered.wait()
    assert not gc.isenabled()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gc.isenabled()
    assert pause.holders == 0
