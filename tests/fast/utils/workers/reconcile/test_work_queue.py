"""Fast layer: ``work_queue.py`` rows (workqueue kept as an insertion-ordered dedup set)."""

from __future__ import annotations

import asyncio
import time

from miles.utils.workers.reconcile.clock import settle
from miles.utils.workers.reconcile.work_queue import WorkQueue


async def test_row_workqueue_dedups_and_a_re_added_key_keeps_its_place() -> None:
    """Row "workqueue: Kept as a dedup set": insertion order, and a queued key keeps its place."""
    queue: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert [await queue.get() for _ in range(3)] == ["a", "b", "c"]
    assert len(queue) == 0


async def test_a_key_taken_by_the_worker_can_be_queued_again() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("b")
    assert await queue.get() == "a"
    queue.add("a")
    assert [await queue.get(), await queue.get()] == ["b", "a"]


async def test_add_all_is_add_for_each_key_in_order() -> None:
    """``add_all`` (what the driver's notifications use) keeps ``add``'s dedup and order rules."""
    queue: WorkQueue[str] = WorkQueue()
    queue.add("b")
    getter_queue: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(getter_queue.get())
    await settle()
    queue.add_all(["a", "b", "c", "a"])
    getter_queue.add_all(["x", "y"])
    await settle()
    assert [await queue.get() for _ in range(3)] == ["b", "a", "c"]
    assert getter.result() == "x"
    assert len(getter_queue) == 1
    queue.shutdown()
    queue.add_all(["late"])
    assert len(queue) == 0


async def test_get_waits_for_a_key_and_wakes_on_add() -> None:
    queue: WorkQueue[int] = WorkQueue()
    getter = asyncio.create_task(queue.get())
    await settle()
    assert not getter.done()
    queue.add(7)
    await settle()
    assert getter.result() == 7


async def test_get_returns_none_at_once_after_shutdown_even_with_keys_left() -> None:
    """Row "ShutDown vs ShutDownWithDrain: Dropped": shutdown never drains."""
    queue: WorkQueue[str] = WorkQueue()
    queue.add("left-behind")
    queue.shutdown()
    assert await queue.get() is None
    queue.add("after")
    assert len(queue) == 1, "add is a no-op once shut down"


async def test_shutdown_wakes_a_waiting_get_with_none() -> None:
    queue: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(queue.get())
    await settle()
    queue.shutdown()
    await settle()
    assert getter.result() is None


async def test_a_cancelled_get_leaves_the_queue_usable() -> None:
    queue: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(queue.get())
    await settle()
    getter.cancel()
    await asyncio.wait([getter])
    queue.add("a")
    assert await queue.get() == "a"


def _drain_seconds(n: int) -> float:
    async def fill_and_drain() -> float:
        queue: WorkQueue[int] = WorkQueue()
        started = time.perf_counter()
        for key in range(n):
            queue.add(key)
            queue.add(key)
        while len(queue):
            await queue.get()
        return time.perf_counter() - started

    return min(asyncio.run(fill_and_drain()) for _ in range(3))


def test_add_and_get_are_constant_time_so_draining_is_linear() -> None:
    """Every operation is O(1): draining 4x the keys costs about 4x, not 16x (a dict popped from
    its front would rescan its deleted slots on every get)."""
    small, large = _drain_seconds(25_000), _drain_seconds(100_000)
    assert large / small < 8, (small, large)
