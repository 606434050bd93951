"""Fast layer: ``work_queue.py`` rows (workqueue kept as an insertion-ordered dedup set)."""

from __future__ import annotations

import asyncio

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


class _CountingKey(int):
    """A key that counts every hash and comparison made on it, so cost is counted, not timed."""

    touches = 0

    def __hash__(self) -> int:
        _CountingKey.touches += 1
        return int.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _CountingKey.touches += 1
        return int.__eq__(self, other)


async def _touches_per_key(n: int) -> float:
    queue: WorkQueue[_CountingKey] = WorkQueue()
    keys = [_CountingKey(i) for i in range(n)]
    _CountingKey.touches = 0
    for key in keys:
        queue.add(key)
        queue.add(key)
    queue.add_all(keys)
    while len(queue):
        await queue.get()
    return _CountingKey.touches / n


async def test_add_and_get_touch_each_key_a_constant_number_of_times() -> None:
    """Every operation is O(1): the hashes and comparisons per key do not grow with the queue.

    The dict-popped-from-its-front trap this design avoids (9.8 s against 0.035 s to drain 100k
    keys) is measured in the alignment record; timing it here would make a test of the machine.
    """
    small, large = await _touches_per_key(1_000), await _touches_per_key(20_000)
    assert large == small
    assert small <= 8


async def test_a_key_put_back_keeps_its_place_and_is_not_added_again() -> None:
    """``put_back`` (the loop's leadership gate): the key is first again, ``adds`` unchanged, and
    ``on_added`` hears only of keys that really entered."""
    added: list[int] = []
    queue: WorkQueue[str] = WorkQueue(on_added=added.append)
    queue.add_all(["a", "b"])
    assert await queue.get() == "a"
    queue.put_back("a")
    queue.put_back("b")
    assert (len(queue), queue.adds, added) == (2, 2, [2])
    assert [await queue.get(), await queue.get()] == ["a", "b"]
    queue.add("a")
    assert (queue.adds, added) == (3, [2, 1])


async def test_a_key_being_processed_is_not_handed_out_again_until_done() -> None:
    """client-go ``Typed``'s dirty and processing sets: a key added while a worker holds it
    waits for ``done``, then goes to the back of the queue; other keys are served meanwhile."""
    queue: WorkQueue[str] = WorkQueue(one_worker_per_key=True)
    queue.add_all(["a", "b"])
    assert await queue.get() == "a"
    queue.add_all(["a", "c"])
    assert queue.processing() == {"a"}
    assert await queue.get() == "b"
    assert await queue.get() == "c", "a is set aside while it is processing"
    assert len(queue) == 1, "the set-aside key still counts as queued"
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.done("a")
    assert await waiting == "a"
    assert queue.adds == 4, "a, b, a again while processing, c"


async def test_with_one_worker_the_order_is_the_order_of_first_adds() -> None:
    queue: WorkQueue[str] = WorkQueue(one_worker_per_key=True)
    queue.add("a")
    assert await queue.get() == "a"
    queue.add_all(["a", "b"])
    queue.done("a")
    assert [await queue.get(), await queue.get()] == ["a", "b"]


async def test_every_waiting_worker_is_woken_and_each_key_goes_to_one() -> None:
    queue: WorkQueue[str] = WorkQueue()
    waiters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)
    queue.add_all(["x", "y"])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    got = sorted(str(w.result()) for w in waiters if w.done())
    assert got == ["x", "y"]
    queue.shutdown()
    assert [await w for w in waiters if not w.done()] == [None]
