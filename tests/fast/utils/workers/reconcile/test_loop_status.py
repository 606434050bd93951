"""Fast layer: ``status.py`` rows as ``ReconcileLoop.status()`` fills them, and the loop's name."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import FrozenInstanceError

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.log import LOOP_NAME_FIELD
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import ParentKey, ReplaceEvent, SourceEvent
from miles.utils.workers.reconcile.status import (
    ReconcileInFlight,
    RetryStatus,
    SourcePhase,
    SourceStatus,
)
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    fake_loop,
    replace,
    upsert,
)

SOURCE_RETRY = 2.0


def _loop(source: object, reconcile: object, clock: FakeClock, **kwargs: object) -> ReconcileLoop:
    return fake_loop(source, reconcile, clock, source_retry_delay=SOURCE_RETRY, **kwargs)


class _Reflector:
    """A source object that reports on itself, as ``KubernetesReflector`` does."""

    def __init__(self, source: FakeSource, name: str = "ns/app=engine") -> None:
        self.name = name
        self._source = source
        self.report = SourceStatus(phase=SourcePhase.WATCHING, cursor="42", events=7)
        self.failing: Exception | None = None

    def watch(self) -> AsyncIterator[SourceEvent]:
        return self._source()

    def source_status(self) -> SourceStatus:
        if self.failing is not None:
            raise self.failing
        return self.report


async def test_snapshot_is_frozen_and_reports_sync() -> None:
    source, clock = FakeSource(), FakeClock(100.0)
    loop = _loop(source, Recorder(), clock)
    before = loop.status()
    assert before.synced is False
    assert before.taken_at == 100.0
    assert before.source.phase is SourcePhase.STARTING
    with pytest.raises(FrozenInstanceError):
        before.synced = True  # type: ignore[misc]
    source.push(replace(Pod("a", "cell-0")))
    async with loop:
        await settle()
        after = loop.status()
        assert after.synced is True
        assert after.stopped is False
        assert after.error is None
    assert loop.status().stopped is True


async def test_name_defaults_to_the_sources_name_else_reconcile_and_prefixes_every_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every log line of the loop carries its name."""
    clock = FakeClock()
    assert _loop(FakeSource(), Recorder(), clock).name == "reconcile"
    reflector = _Reflector(FakeSource())
    assert _loop(reflector.watch, Recorder(), clock).name == "ns/app=engine"
    assert _loop(reflector.watch, Recorder(), clock, name="trainers").name == "trainers"
    with pytest.raises(ValueError, match="name"):
        _loop(FakeSource(), Recorder(), clock, name="")
    source, recorder = FakeSource(), Recorder()
    recorder.failing["cell-0"] = ValueError("engine down")
    loop = _loop(source, recorder, clock, name="pool-a")
    source.push(replace(Pod("a", "cell-0")), object())
    with caplog.at_level(logging.DEBUG):
        async with loop:
            await settle()
    lines = [r for r in caplog.records if r.name.startswith("miles.utils.workers.reconcile")]
    assert len([r for r in lines if r.levelno >= logging.ERROR]) == 2
    assert all(r.getMessage().startswith("[pool-a] ") for r in lines)
    assert all(getattr(r, LOOP_NAME_FIELD) == "pool-a" for r in lines)
    assert any("source starting -> listing" in r.getMessage() for r in lines), "DEBUG transitions"


async def test_source_status_comes_from_a_reporting_source_bound_method_or_callable() -> None:
    clock = FakeClock()
    fake = FakeSource()
    reflector = _Reflector(fake)
    assert _loop(reflector.watch, Recorder(), clock).status().source is reflector.report

    class CallableSource(_Reflector):
        def __call__(self) -> AsyncIterator[SourceEvent]:
            return self.watch()

    callable_source = CallableSource(fake)
    assert _loop(callable_source, Recorder(), clock).status().source is callable_source.report


async def test_a_failing_source_status_falls_back_to_the_drivers_view_and_says_why() -> None:
    clock = FakeClock(5.0)
    reflector = _Reflector(FakeSource())
    reflector.failing = RuntimeError("reporter broke")
    status = _loop(reflector.watch, Recorder(), clock).status().source
    assert status.phase is SourcePhase.STARTING
    assert status.last_error is not None
    assert "reporter broke" in status.last_error
    assert status.last_error_at == 5.0


async def test_driver_status_phases_counters_and_last_error() -> None:
    """A source that reports nothing gets what the driver itself saw."""
    source, clock = FakeSource(), FakeClock()
    loop = _loop(source, Recorder(), clock)
    starting = asyncio.create_task(loop.start())
    await settle()
    assert loop.status().source.phase is SourcePhase.LISTING
    await clock.advance(1.0)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    await starting
    status = loop.status().source
    assert status.phase is SourcePhase.WATCHING
    assert (status.phase_since, status.last_event_at) == (1.0, 1.0)
    assert (status.lists, status.watches, status.watch_restarts) == (1, 1, 0)
    assert status.relists == {}
    await clock.advance(1.0)
    source.push(upsert(Pod("a", "cell-0", 1)), object(), replace(Pod("a", "cell-0", 2)))
    await settle()
    snapshot = loop.status()
    assert snapshot.source.events == 2, "watch events received: the upsert and the garbage"
    assert snapshot.source.watch_events_received == snapshot.source.events
    assert (snapshot.listings_applied, snapshot.watch_events_applied) == (2, 1)
    assert snapshot.source.lists == snapshot.source.listings_requested == 2
    assert snapshot.events_applied == 3, "the listing, the upsert, the replace; not the garbage"
    assert snapshot.objects_stored == 1, "the replace in the stream left only a"
    assert snapshot.source.last_event_at == 2.0, "sampled by status() itself"
    await clock.advance(5.0)
    source.push(upsert(Pod("b", "cell-1", 1)))
    await clock.advance(1.5)
    assert loop._driver.source_status().last_event_at == 8.0, "sampled every second"
    assert snapshot.source.relists == {"replace in stream": 1}
    source.fail(OSError("watch dropped"))
    await settle()
    status = loop.status().source
    assert status.phase is SourcePhase.BACKING_OFF
    assert status.backoff_until is not None
    assert 8.5 + SOURCE_RETRY <= status.backoff_until < 8.5 + 2 * SOURCE_RETRY
    assert status.last_error == "source stream failed: OSError('watch dropped')"
    assert status.last_error_at == 8.5
    source.push(replace(Pod("a", "cell-0", 3)))
    await clock.advance(2 * SOURCE_RETRY)
    status = loop.status().source
    assert status.phase is SourcePhase.WATCHING
    assert (status.lists, status.watches, status.watch_restarts) == (3, 2, 1)
    assert status.relists == {"replace in stream": 1, "stream reopened": 1}
    await loop.stop()
    assert loop.status().source.phase is SourcePhase.STOPPED


async def test_reconciles_failures_queue_depth_and_retries() -> None:
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    recorder.failing["cell-1"] = ValueError("engine unreachable\nsecond line")
    loop = _loop(source, recorder, clock, failure_base_delay=4.0)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1"), Pod("c", "cell-2")))
    await loop.start()
    assert loop.status().queue_depth == 3, "synced, nothing reconciled yet"
    await settle()
    status = loop.status()
    assert (status.reconciles, status.reconcile_failures, status.queue_depth) == (3, 1, 0)
    assert status.retries == (
        RetryStatus("cell-1", 1, 4.0, "ValueError: engine unreachable second line"),
    )
    await clock.advance(5.0)
    status = loop.status()
    assert (status.reconciles, status.reconcile_failures) == (4, 2)
    assert status.retries == (
        RetryStatus("cell-1", 2, 4.0 + 8.0, "ValueError: engine unreachable second line"),
    ), "failures count up; the retry swept at 4 s failed again, so the next is 8 s later"
    del recorder.failing["cell-1"]
    await clock.advance(9.0)
    assert loop.status().retries == ()
    await loop.stop()


async def test_in_flight_names_the_parent_and_its_start_and_turns_slow() -> None:
    source, clock = FakeSource(), FakeClock()
    release = asyncio.Event()

    async def reconcile(parent: ParentKey) -> None:
        await release.wait()

    loop = _loop(source, reconcile, clock, slow_reconcile_after=10.0)
    source.push(replace(Pod("a", "cell-0")))
    await loop.start()
    await clock.advance(3.0)
    assert loop.status().in_flight == ReconcileInFlight("cell-0", 0.0, slow=False)
    await clock.advance(7.0)
    assert loop.status().in_flight == ReconcileInFlight("cell-0", 0.0, slow=True)
    release.set()
    await settle()
    assert loop.status().in_flight is None
    await loop.stop()


async def test_counts_name_what_they_count_and_a_fresh_loop_has_applied_one_listing() -> None:
    """A synced loop has applied its listing and no watch event; a rejected listing is requested
    but not applied; ``events_applied`` (the older name) stays the two applied counts together."""
    source, clock = FakeSource(), FakeClock()
    loop = _loop(source, Recorder(), clock)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    await loop.start()
    status = loop.status()
    assert (status.source.events, status.watch_events_applied) == (0, 0)
    assert (status.listings_applied, status.source.lists, status.objects_stored) == (1, 1, 2)
    assert status.events_applied == 1
    source.push(upsert(Pod("c", "cell-1")), ReplaceEvent(objects=None))  # type: ignore[arg-type]
    await settle()
    status = loop.status()
    assert (status.source.events, status.watch_events_applied) == (1, 1)
    assert (status.listings_applied, status.source.lists, status.objects_stored) == (1, 2, 3)
    assert status.events_applied == status.listings_applied + status.watch_events_applied == 2
    await loop.stop()
