"""Fast layer: ``loop.py`` guards: arguments, the event loop it is bound to, a worker that dies or
hangs, ``reconcile_timeout``, and the order in which one event's parents are reconciled."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from typing import Any

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.loop import ReconcileLoop, ReconcileLoopError
from miles.utils.workers.reconcile.object_store import ObjectStore
from miles.utils.workers.reconcile.retry_scheduler import RetryScheduler
from miles.utils.workers.reconcile.source_event import ParentKey
from miles.utils.workers.reconcile.source_stream_driver import SourceStreamDriver
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    delete,
    fake_loop,
    replace,
    upsert,
)

BAD_NUMBERS = [0, -1.0, math.inf, math.nan, "1", None, True]


def _loop(source: FakeSource, reconcile: Any, clock: FakeClock, **kwargs: Any) -> ReconcileLoop:
    return fake_loop(source, reconcile, clock, **kwargs)


@pytest.mark.parametrize(
    "argument",
    ["failure_base_delay", "failure_max_delay", "source_retry_delay", "slow_reconcile_after"],
)
@pytest.mark.parametrize("value", BAD_NUMBERS)
async def test_every_delay_is_checked_at_construction_naming_it(argument: str, value: Any) -> None:
    before = asyncio.all_tasks()
    with pytest.raises(ValueError, match=rf"{argument} must be .*{value!r}"):
        _loop(FakeSource(), Recorder(), FakeClock(), **{argument: value})
    assert asyncio.all_tasks() == before, "a rejected loop leaves no task behind"


@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, "1", True])
async def test_reconcile_timeout_is_none_or_finite_positive(value: Any) -> None:
    with pytest.raises(ValueError, match=rf"reconcile_timeout must be .*{value!r}"):
        _loop(FakeSource(), Recorder(), FakeClock(), reconcile_timeout=value)


@pytest.mark.parametrize("value", [math.inf, math.nan, "1", True])
async def test_resync_period_must_be_a_number_or_none(value: Any) -> None:
    with pytest.raises(ValueError, match=rf"resync_period must be .*{value!r}"):
        _loop(FakeSource(), Recorder(), FakeClock(), resync_period=value)


async def test_resync_period_none_disables_resync() -> None:
    """``None`` used to raise ``TypeError`` at ``start()``."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    source.push(replace(Pod("a", "cell-0")))
    async with _loop(source, recorder, clock, resync_period=None):
        await clock.advance(100_000.0)
    assert recorder.calls == ["cell-0"]


async def test_the_parts_check_their_own_delays() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match=r"retry_delay must be .*0"):
        SourceStreamDriver(
            source=FakeSource(),
            store=ObjectStore(key_map=None),
            on_affected=lambda parents: None,
            retry_delay=0,
            clock=clock,
        )
    for argument in ("failure_base_delay", "failure_max_delay"):
        delays: dict[str, Any] = {"failure_base_delay": 1.0, "failure_max_delay": 1.0}
        delays[argument] = -1
        with pytest.raises(ValueError, match=rf"{argument} must be"):
            RetryScheduler(on_retry=lambda key: None, clock=clock, **delays)


async def test_a_failing_source_never_reopens_without_waiting() -> None:
    """However small ``source_retry_delay``, reopens back off (doubling, to 30 s,
    starting over every 2 minutes as Go's backoff does)."""
    source, clock = FakeSource(failing_opens=1_000_000), FakeClock()
    loop = _loop(source, Recorder(), clock, source_retry_delay=1e-9)
    starting = asyncio.create_task(loop.start())
    await clock.advance(60.0)
    opens = 1_000_000 - source.failing_opens
    assert opens < 40, f"{opens} opens in 60 s: about 35 doublings from 1 ns reach 30 s"
    await clock.advance(600.0)
    later = 1_000_000 - source.failing_opens - opens
    assert later <= (600 / 120 + 1) * (40 + 120 / 30), "one climb to the cap per 2 minutes"
    await loop.stop()
    await asyncio.wait([starting])


def test_a_loop_used_from_another_event_loop_says_so_at_start() -> None:
    """It used to start, never retry a failed parent, and fail at ``stop()``."""
    source, clock = FakeSource(), FakeClock()

    async def construct() -> ReconcileLoop:
        return _loop(source, Recorder(), clock)

    loop = asyncio.run(construct())

    async def use() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            await loop.start()
        await loop.stop()

    asyncio.run(use())


def test_stop_from_another_live_event_loop_is_refused() -> None:
    ready, done = threading.Event(), threading.Event()
    holder: list[ReconcileLoop] = []
    home: list[asyncio.AbstractEventLoop] = []

    async def own() -> None:
        holder.append(_loop(FakeSource(), Recorder(), FakeClock()))
        home.append(asyncio.get_running_loop())
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, done.wait)
        await holder[0].stop()

    thread = threading.Thread(target=asyncio.run, args=(own(),))
    thread.start()
    ready.wait()

    async def foreign() -> None:
        with pytest.raises(RuntimeError, match="another event loop"):
            await holder[0].stop()

    try:
        asyncio.run(foreign())
    finally:
        done.set()
        thread.join()


class _Fatal(BaseException):
    """A ``BaseException`` that is neither a cancellation nor an exit."""


async def test_a_base_exception_from_reconcile_is_logged_at_once_and_the_loop_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    recorder.failing["cell-0"] = _Fatal("engine wedged")
    loop = _loop(source, recorder, clock)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    async with loop:
        await settle()
        [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert "'cell-0'" in record.getMessage()
        assert "engine wedged" in record.getMessage()
        source.push(upsert(Pod("b", "cell-1", 1)))
        await settle()
        assert recorder.calls == ["cell-0", "cell-1", "cell-1"]
        await clock.advance(1.0)
        assert recorder.calls[-1] == "cell-0", "retried with backoff"
        assert loop.status().reconcile_failures == 2


@pytest.mark.parametrize("fatal", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_stop_the_program_logged_first(
    fatal: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        source, recorder = FakeSource(), Recorder()
        recorder.failing["cell-0"] = fatal()
        source.push(replace(Pod("a", "cell-0")))
        async with _loop(source, recorder, FakeClock()):
            await asyncio.Event().wait()

    with pytest.raises(fatal):
        asyncio.run(main())
    assert "reconcile of parent 'cell-0' raised" in caplog.text
    assert "the loop stops" in caplog.text


async def test_a_dead_task_raises_into_the_async_with_body_and_out_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task of the loop that dies cancels the body of ``async with`` (as a failing
    task cancels an ``asyncio.TaskGroup``'s), which then raises ``ReconcileLoopError``."""
    source, clock = FakeSource(), FakeClock()
    loop = _loop(source, Recorder(), clock, resync_period=10.0)
    source.push(replace(Pod("a", "cell-0")))
    before = asyncio.all_tasks()
    reached: list[str] = []

    def broken_parent_keys() -> set[ParentKey]:
        raise RuntimeError("store index corrupted")

    async def body() -> None:
        async with loop:
            loop._store.parent_keys = broken_parent_keys  # type: ignore[method-assign]
            try:
                await clock.advance(10.0)
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                reached.append("cancelled")
                raise

    with pytest.raises(ReconcileLoopError, match="store index corrupted") as raised:
        await body()
    assert reached == ["cancelled"]
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "reconcile-resync died" in caplog.text
    assert asyncio.all_tasks() <= before
    assert loop.status().error == "RuntimeError: store index corrupted"


async def test_a_dead_task_is_raised_by_wait_and_stop_for_start_stop_callers() -> None:
    source, clock = FakeSource(), FakeClock()
    loop = _loop(source, Recorder(), clock, resync_period=10.0)
    source.push(replace(Pod("a", "cell-0")))
    await loop.start()
    waiting = asyncio.create_task(loop.wait())

    def broken_parent_keys() -> set[ParentKey]:
        raise RuntimeError("store index corrupted")

    loop._store.parent_keys = broken_parent_keys  # type: ignore[method-assign]
    await clock.advance(10.0)
    with pytest.raises(ReconcileLoopError):
        await waiting
    assert loop.status().stopped
    with pytest.raises(ReconcileLoopError, match="store index corrupted"):
        await loop.stop()


async def test_wait_returns_after_stop() -> None:
    source = FakeSource()
    source.push(replace())
    loop = _loop(source, Recorder(), FakeClock())
    await loop.start()
    waiting = asyncio.create_task(loop.wait())
    await settle()
    assert not waiting.done()
    await loop.stop()
    await waiting


async def test_a_body_that_finishes_before_the_death_reaches_it_still_raises() -> None:
    source, clock = FakeSource(), FakeClock()
    loop = _loop(source, Recorder(), clock)
    source.push(replace(Pod("a", "cell-0")))

    async def body() -> None:
        async with loop:
            assert loop._worker is not None
            loop._worker.cancel()
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    with pytest.raises(ReconcileLoopError):
        await body()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_slow_reconcile_is_logged_once_with_its_parent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock = FakeSource(), FakeClock()

    async def reconcile(parent: ParentKey) -> None:
        if parent == "cell-0":
            await clock.sleep(1_000.0)

    loop = _loop(source, reconcile, clock, slow_reconcile_after=30.0)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    async with loop:
        await clock.advance(29.0)
        assert "has run for" not in caplog.text
        await clock.advance(1.0)
        assert caplog.text.count("reconcile of parent 'cell-0' has run for 30s") == 1
        await clock.advance(500.0)
        assert caplog.text.count("has run for") == 1, "once per reconcile"


async def test_reconcile_timeout_cancels_and_retries_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CR's ``ReconciliationTimeout``: a hung reconcile is cancelled at the timeout,
    counted as a failure and retried with backoff, and the other parents are served."""
    source, clock = FakeSource(), FakeClock()
    calls: list[tuple[ParentKey, float]] = []
    cancelled: list[float] = []

    async def reconcile(parent: ParentKey) -> None:
        calls.append((parent, clock.time()))
        if parent == "cell-0":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(clock.time())
                raise

    loop = _loop(source, reconcile, clock, reconcile_timeout=5.0, failure_base_delay=2.0)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    async with loop:
        await clock.advance(4.9)
        assert calls == [("cell-0", 0.0)]
        await clock.advance(0.1)
        assert cancelled == [5.0]
        assert calls == [("cell-0", 0.0), ("cell-1", 5.0)]
        assert "'cell-0' timed out after reconcile_timeout=5.0s" in caplog.text
        status = loop.status()
        assert (status.reconcile_timeouts, status.reconcile_failures) == (1, 1)
        assert status.retries[0].parent == "cell-0"
        await clock.advance(2.0)
        assert calls[-1] == ("cell-0", 7.0), "retried after the base delay"
        await clock.advance(5.0)
        assert cancelled == [5.0, 12.0]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_reconcile_that_swallows_the_timeout_still_lets_stop_work() -> None:
    source, clock = FakeSource(), FakeClock()
    swallowed: list[float] = []

    async def reconcile(parent: ParentKey) -> None:
        try:
            await clock.sleep(100.0)
        except asyncio.CancelledError:
            swallowed.append(clock.time())

    loop = _loop(source, reconcile, clock, reconcile_timeout=5.0)
    source.push(replace(Pod("a", "cell-0")))
    before = asyncio.all_tasks()
    async with loop:
        await clock.advance(6.0)
        assert swallowed == [5.0]
        assert loop.status().reconcile_failures == 0, "it returned: a success, as in Go"
    assert asyncio.all_tasks() <= before


async def test_one_events_parents_are_reconciled_in_a_fixed_order() -> None:
    """A move's old parent before its new one; a replace's parents that lost an
    object first (to deletion in store order, then to a move in listing order), then every
    parent with a member, in listing order."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    source.push(replace(Pod("a", "cell-9"), Pod("b", "cell-5"), Pod("c", "cell-7")))
    async with loop:
        await settle()
        assert recorder.calls == ["cell-9", "cell-5", "cell-7"]
        for _ in range(3):
            recorder.calls.clear()
            source.push(upsert(Pod("a", "cell-1", 1)))
            await settle()
            assert recorder.calls == ["cell-9", "cell-1"]
            source.push(upsert(Pod("a", "cell-9", 2)))
            await settle()
        recorder.calls.clear()
        source.push(replace(Pod("d", "cell-3"), Pod("c", "cell-8"), Pod("a", "cell-3")))
        await settle()
        assert recorder.calls == ["cell-5", "cell-7", "cell-9", "cell-3", "cell-8"]
        recorder.calls.clear()
        source.push(delete(Pod("d", "cell-3")))
        await settle()
        assert recorder.calls == ["cell-3"]


async def test_a_maximum_failure_delay_below_the_base_is_rejected_naming_both() -> None:
    """Chosen as the original did; every delay silently became the maximum."""
    before = asyncio.all_tasks()
    with pytest.raises(
        ValueError, match=r"failure_max_delay \(1.0\) .* failure_base_delay \(2.0\)"
    ):
        _loop(FakeSource(), Recorder(), FakeClock(), failure_base_delay=2.0, failure_max_delay=1.0)
    assert asyncio.all_tasks() == before


async def test_a_stopped_loop_reports_no_retry_and_a_failure_while_stopping_records_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A parent that failed before ``stop()`` is not reported as waiting for a retry
    that will never fire, and a reconcile that fails while the loop stops (it swallowed the
    cancellation) records no retry and says so."""
    source, clock = FakeSource(), FakeClock()
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    release = asyncio.Event()

    async def reconcile(parent: ParentKey) -> None:
        if parent == "cell-0":
            raise RuntimeError("boom")
        try:
            await release.wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    loop = _loop(source, reconcile, clock)
    await loop.start()
    await settle()
    assert [retry.parent for retry in loop.status().retries] == ["cell-0"]
    with caplog.at_level(logging.ERROR):
        await loop.stop()
    assert loop.status().retries == ()
    assert any(
        "'cell-1' failed, not retried: the loop stopped" in r.getMessage() for r in caplog.records
    )
