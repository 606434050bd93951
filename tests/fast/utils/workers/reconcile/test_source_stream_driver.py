"""Fast layer: ``source_stream_driver.py`` rows (cache before notify, sync, reopen, close)."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet

import pytest

from miles.utils.workers.reconcile.backoff import Backoff
from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.object_store import ObjectStore
from miles.utils.workers.reconcile.source_event import (
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
    UpsertEvent,
)
from miles.utils.workers.reconcile.source_stream_driver import SourceStreamDriver
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    delete,
    parent_of,
    replace,
    upsert,
)

RETRY = 3.0


class _Harness:
    def __init__(self, source: SourceWatchFn) -> None:
        self.clock = FakeClock()
        self.store = ObjectStore(key_map=parent_of)
        self.notified: list[AbstractSet[ParentKey]] = []
        self.driver = SourceStreamDriver(
            source=source,
            store=self.store,
            on_affected=self.notified.append,
            retry_delay=RETRY,
            clock=self.clock,
            backoff=Backoff(clock=self.clock, initial=RETRY, rand=lambda: 0.0),
        )
        self.task = asyncio.create_task(self.driver.run())

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.wait([self.task])
        assert self.task.cancelled()
        await self.driver.aclose()


async def test_row_cache_before_notify_the_store_holds_the_event_when_on_affected_runs() -> None:
    """Row "Cache-before-notify ordering: Kept": on_affected sees the store already updated."""
    source = FakeSource()
    seen: list[object] = []
    store = ObjectStore(key_map=parent_of)

    def on_affected(parents: AbstractSet[ParentKey]) -> None:
        seen.append([pod for parent in sorted(parents) for pod in store.get_by_parent(parent)])

    driver = SourceStreamDriver(
        source=source, store=store, on_affected=on_affected, retry_delay=RETRY, clock=FakeClock()
    )
    task = asyncio.create_task(driver.run())
    a, a2 = Pod("a", "cell-0"), Pod("a", "cell-1")
    source.push(replace(a), upsert(a2), delete(a2))
    await settle()
    assert seen == [[a], [a2], []]
    task.cancel()
    await asyncio.wait([task])


async def test_row_wait_for_cache_sync_returns_only_after_the_first_replace_event() -> None:
    """Row "WaitForCacheSync: Kept": wait_for_sync() blocks until a ReplaceEvent was applied."""
    source = FakeSource()
    h = _Harness(source)
    waiter = asyncio.create_task(h.driver.wait_for_sync())
    await settle()
    assert not waiter.done()
    source.push(replace(Pod("a", "cell-0")))
    await settle()
    assert waiter.done()
    assert "a" in h.store
    await h.stop()


async def test_row_streaming_list_dropped_a_stream_not_opening_with_replace_is_reopened(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "Streaming a listing into the store: Dropped ... a stream that does not open with one
    is reopened": the upsert is not applied, the stream is closed and reopened after retry_delay."""
    source = FakeSource()
    h = _Harness(source)
    with caplog.at_level(logging.ERROR):
        source.push(upsert(Pod("early", "cell-0")))
        await settle()
    assert "early" not in h.store
    assert h.notified == []
    assert (source.opened, source.closed) == (1, 1)
    assert "UpsertEvent instead of a ReplaceEvent" in caplog.text
    assert h.driver.events_applied == 0, "received, not applied"
    assert h.driver.source_status().events == 1
    await h.clock.advance(RETRY - 0.5)
    assert source.opened == 1, "not reopened before retry_delay"
    await h.clock.advance(0.5)
    assert source.opened == 2
    source.push(replace(Pod("a", "cell-0")))
    await settle()
    assert "a" in h.store
    await h.stop()


async def test_a_stream_that_ends_or_raises_is_logged_and_reopened_after_retry_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "Retry inside vs outside the stream: Kept at both levels" (the outer level)."""
    source = FakeSource()
    h = _Harness(source)
    source.push(replace(Pod("a", "cell-0")))
    source.end()
    await settle()
    assert "source stream ended" in caplog.text
    await h.clock.advance(RETRY)
    assert source.opened == 2
    source.fail(OSError("connection reset"))
    await settle()
    assert "connection reset" in caplog.text
    assert source.opened == 2
    await h.clock.advance(2 * RETRY - 0.5)
    assert source.opened == 2, "the second step of the backoff is twice the first"
    await h.clock.advance(0.5)
    assert source.opened == 3
    assert h.store.get("a") == Pod("a", "cell-0"), "the store survives reopening"
    source.push(replace(Pod("b", "cell-1")))
    await settle()
    assert h.store.parent_keys() == {"cell-1"}
    assert h.notified[-1] == {"cell-0", "cell-1"}
    await h.stop()


async def test_a_source_factory_that_raises_is_logged_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource(failing_opens=2)
    h = _Harness(source)
    await settle()
    assert source.opened == 0
    assert "source factory raised" in caplog.text
    assert "source factory refused" in caplog.text
    await h.clock.advance(RETRY)
    assert source.opened == 0
    await h.clock.advance(2 * RETRY)
    assert source.opened == 1
    await h.stop()


async def test_a_stream_yielding_garbage_is_skipped_with_a_log_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a non-source event is logged by type and truncated repr, then skipped."""
    source = FakeSource()
    h = _Harness(source)
    garbage = {"type": "ADDED", "blob": "x" * 10_000}
    source.push(replace(Pod("a", "cell-0")), garbage, upsert(Pod("b", "cell-1")))
    with caplog.at_level(logging.ERROR):
        await settle()
    assert "b" in h.store, "the stream keeps flowing past garbage"
    assert "a" in h.store
    assert source.opened == 1
    [record] = [r for r in caplog.records if "not a source event" in r.getMessage()]
    message = record.getMessage()
    assert "dict" in message
    assert "'ADDED'" in message
    assert len(message) < 400, "the repr is truncated"
    await h.stop()


async def test_an_event_the_store_rejects_is_skipped_and_the_stream_continues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource()
    h = _Harness(source)
    bad = UpsertEvent(key=["unhashable"], obj=Pod("x", "cell-0"))  # type: ignore[arg-type]
    source.push(replace(Pod("a", "cell-0")), bad, upsert(Pod("b", "cell-1")))
    await settle()
    assert "store rejected" in caplog.text
    assert "unhashable" in caplog.text
    assert "a" in h.store
    assert "b" in h.store
    assert source.opened == 1
    await h.stop()


class _StreamFailingToClose:
    """An ``AsyncIterator`` that yields scripted items, then hangs; closing it raises."""

    def __init__(self, *items: object) -> None:
        self._items = list(items)
        self.close_attempts = 0

    def __aiter__(self) -> _StreamFailingToClose:
        return self

    async def __anext__(self) -> SourceEvent:
        if self._items:
            return self._items.pop(0)  # type: ignore[return-value]
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.close_attempts += 1
        raise RuntimeError("close exploded")


async def test_row_close_failures_are_logged_never_raised_when_reopening(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "Closing a stream during teardown: Replaced: every close is logged, none propagates"."""
    streams: list[_StreamFailingToClose] = []

    def source() -> AsyncIterator[SourceEvent]:
        streams.append(_StreamFailingToClose(upsert(Pod("not-a-listing"))))
        return streams[-1]

    h = _Harness(source)
    await settle()
    assert streams[0].close_attempts == 1
    assert "close exploded" in caplog.text
    assert not h.task.done(), "the driver keeps running"
    await h.clock.advance(RETRY)
    assert len(streams) == 2
    await h.stop()


async def test_row_close_failure_never_masks_the_cancellation_it_unwinds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "Closing a stream during teardown": run()'s finally closes the stream once and clears it,
    so a cancelled driver ends cancelled and aclose() then finds nothing left to close."""
    stream = _StreamFailingToClose(ReplaceEvent(objects={}))
    h = _Harness(lambda: stream)
    await settle()
    await h.stop()
    assert stream.close_attempts == 1
    assert "close exploded" in caplog.text


async def test_aclose_closes_a_stream_left_open_and_swallows_its_failure() -> None:
    stream = _StreamFailingToClose(ReplaceEvent(objects={}))
    driver = SourceStreamDriver(
        source=lambda: stream,
        store=ObjectStore(key_map=None),
        on_affected=lambda parents: None,
        retry_delay=RETRY,
        clock=FakeClock(),
    )
    pump = asyncio.create_task(driver._run_one_stream())
    await settle()
    await driver.aclose()
    await driver.aclose()
    assert stream.close_attempts == 1
    pump.cancel()
    await asyncio.wait([pump])
    assert stream.close_attempts == 1, "run's finally found the stream already taken"


async def test_a_stream_ending_before_its_replace_event_is_reopened(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource()
    h = _Harness(source)
    source.end()
    await settle()
    assert "ended before its ReplaceEvent" in caplog.text
    await h.clock.advance(RETRY)
    assert source.opened == 2
    await h.stop()


async def test_an_upsert_that_changes_nothing_still_notifies() -> None:
    """Row "Predicates: Dropped": every applied event notifies its parent, changed or not."""
    source = FakeSource()
    h = _Harness(source)
    pod = Pod("a", "cell-0")
    source.push(replace(pod), upsert(pod), upsert(pod))
    await settle()
    assert h.notified == [{"cell-0"}, {"cell-0"}, {"cell-0"}]
    await h.stop()


async def test_an_opening_replace_event_the_store_rejects_does_not_sync(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A listing the store cannot apply is not a sync: the stream is reopened instead."""
    source = FakeSource()
    h = _Harness(source)
    synced = asyncio.create_task(h.driver.wait_for_sync())
    source.push(ReplaceEvent(objects=None))  # type: ignore[arg-type]
    await settle()
    assert not synced.done()
    assert "store rejected" in caplog.text
    assert source.closed == 1
    await h.clock.advance(RETRY)
    source.push(replace(Pod("a", "cell-0")))
    await settle()
    assert synced.done()
    assert "a" in h.store
    await h.stop()


async def test_row_no_event_kept_an_object_the_store_replaced_is_freed() -> None:
    """Row "Events not kept once applied": once the store has replaced an object of the opening
    ReplaceEvent, nothing of the driver's keeps it (that event used to live as long as its stream,
    a whole stale copy of the pool)."""
    source = FakeSource()
    harness = _Harness(source)
    first = Pod("a", "cell-0")
    gone = weakref.ref(first)
    source.push(replace(first), upsert(Pod("a", "cell-0", version=1)))
    del first
    await settle()
    gc.collect()
    assert harness.store.get_by_parent("cell-0") == [Pod("a", "cell-0", version=1)]
    assert gone() is None
    await harness.stop()
