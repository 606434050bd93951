"""Fast layer: ``loop.py`` rows (lifecycle, the single worker, resync) and the loop end to end."""

from __future__ import annotations

import asyncio
import inspect
import logging
from contextlib import AsyncExitStack
from functools import partial

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.loop import DEFAULT_RESYNC_PERIOD, ReconcileLoop
from miles.utils.workers.reconcile.source_event import ParentKey, ReplaceEvent
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    delete,
    fake_loop,
    parent_of,
    replace,
    run_until,
    upsert,
)

SOURCE_RETRY = 2.0


def _loop(
    source: FakeSource,
    reconcile: Recorder,
    clock: FakeClock,
    *,
    resync_period: float = DEFAULT_RESYNC_PERIOD,
    failure_base_delay: float = 1.0,
    failure_max_delay: float = 60.0,
) -> ReconcileLoop:
    return fake_loop(
        source,
        reconcile,
        clock,
        resync_period=resync_period,
        failure_base_delay=failure_base_delay,
        failure_max_delay=failure_max_delay,
        source_retry_delay=SOURCE_RETRY,
    )


def _holds(loop: ReconcileLoop, parent: ParentKey) -> bool:
    return bool(loop.get_by_parent(parent))


async def _started(loop: ReconcileLoop, source: FakeSource, *pods: Pod) -> None:
    source.push(replace(*pods))
    await loop.start()
    await settle()


def test_constructor_is_the_contracts_keyword_only_signature() -> None:
    """Row "source.Channel: Dropped": events enter only through ``source``; the constructor is
    the contract's, keyword-only, with Go's 10 h resync as the default; what was added since
    (name, the reconcile watchdog) comes after it, also keyword-only and optional."""
    parameters = inspect.signature(ReconcileLoop).parameters
    assert list(parameters)[:8] == [
        "source",
        "reconcile",
        "key_map",
        "resync_period",
        "failure_base_delay",
        "failure_max_delay",
        "source_retry_delay",
        "clock",
    ]
    assert all(p.default is not inspect.Parameter.empty for p in list(parameters.values())[2:])
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    defaults = {name: p.default for name, p in parameters.items()}
    assert defaults["resync_period"] == DEFAULT_RESYNC_PERIOD == 36000.0
    assert (defaults["failure_base_delay"], defaults["failure_max_delay"]) == (1.0, 60.0)
    assert (defaults["key_map"], defaults["source_retry_delay"], defaults["clock"]) == (
        None,
        1.0,
        None,
    )


async def test_row_wait_for_cache_sync_start_returns_only_after_the_first_replace_event() -> None:
    """Row "WaitForCacheSync: Kept ... start() awaits it"."""
    source, clock = FakeSource(), FakeClock()
    loop = _loop(source, Recorder(), clock)
    starting = asyncio.create_task(loop.start())
    source.push(upsert(Pod("early", "cell-0")))
    await clock.advance(2 * SOURCE_RETRY)
    assert not starting.done(), "an upsert before any listing does not sync the store"
    assert source.opened == 2, "the stream that did not open with a ReplaceEvent was reopened"
    source.push(replace(Pod("a", "cell-0")))
    await settle()
    assert starting.done()
    assert loop.get_by_parent("cell-0") == [Pod("a", "cell-0")]
    await loop.stop()


async def test_row_cache_before_notify_reconcile_sees_the_event_that_woke_it() -> None:
    """Row "Cache-before-notify ordering": reconcile reads the store with the event applied."""
    source, clock = FakeSource(), FakeClock()
    seen: list[tuple[ParentKey, list[Pod]]] = []

    async def reconcile(parent: ParentKey) -> None:
        seen.append((parent, loop.get_by_parent(parent)))

    loop = ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=clock)
    source.push(replace(Pod("a", "cell-0")))
    async with loop:
        await settle()
        assert seen == [("cell-0", [Pod("a", "cell-0")])]
        source.push(upsert(Pod("a", "cell-0", version=1)))
        await settle()
        assert seen[-1] == ("cell-0", [Pod("a", "cell-0", version=1)])
        source.push(upsert(Pod("a", "cell-1", version=2)))
        await settle()
        assert sorted(seen[-2:]) == [("cell-0", []), ("cell-1", [Pod("a", "cell-1", version=2)])]


async def test_row_deltafifo_dropped_a_burst_on_one_parent_reconciles_it_once() -> None:
    """Row "DeltaFIFO: Dropped": no delta chain, the queue dedups parent keys."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    source.push(replace(*(Pod(f"p{i}", "cell-0") for i in range(50))))
    for i in range(50):
        source.push(upsert(Pod(f"p{i}", "cell-0", version=1)))
    async with loop:
        await settle()
    assert recorder.calls.count("cell-0") <= 2
    assert recorder.calls[-1] == "cell-0"


async def test_row_replace_re_drives_parents_emptied_by_a_relist() -> None:
    """Row "Replace() on relist": a ReplaceEvent mid-stream (the reflector's inner-level relist)
    synthesizes deletions, and a parent it emptied is reconciled with no members."""
    source, clock = FakeSource(), FakeClock()
    seen: dict[ParentKey, list[Pod]] = {}

    async def reconcile(parent: ParentKey) -> None:
        seen[parent] = loop.get_by_parent(parent)

    loop = ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=clock)
    await _started(loop, source, Pod("a", "cell-0"), Pod("b", "cell-1"))
    seen.clear()
    source.push(replace(Pod("b", "cell-1")))
    await settle()
    assert seen == {"cell-0": [], "cell-1": [Pod("b", "cell-1")]}
    assert loop.parent_keys() == {"cell-1"}
    assert source.opened == 1, "the relist arrived without reopening the stream"
    await loop.stop()


async def test_row_replace_after_reopen_re_drives_parents_deleted_while_disconnected() -> None:
    """Row "Retry inside vs outside the stream" (outer level): a stream that dies is reopened
    after source_retry_delay, and its listing removes what was deleted meanwhile."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    await _started(loop, source, Pod("a", "cell-0"), Pod("b", "cell-1"))
    recorder.calls.clear()
    source.fail(OSError("watch dropped"))
    await settle()
    assert source.opened == 1
    source.push(replace(Pod("b", "cell-1")))
    await clock.advance(2 * SOURCE_RETRY)
    assert source.opened == 2
    assert sorted(recorder.calls) == ["cell-0", "cell-1"]
    assert loop.parent_keys() == {"cell-1"}
    await loop.stop()


async def test_move_re_drives_both_parents() -> None:
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    await _started(loop, source, Pod("a", "cell-0"))
    recorder.calls.clear()
    source.push(upsert(Pod("a", "cell-1")))
    await settle()
    assert sorted(recorder.calls) == ["cell-0", "cell-1"]
    await loop.stop()


async def test_key_map_raising_evicts_re_drives_the_old_parent_and_keeps_the_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a key_map that raises evicts the object, re-drives its old parent, logs the key,
    and every other parent keeps being served."""

    def key_map(pod: Pod) -> ParentKey | None:
        if pod.version < 0:
            raise KeyError("cell label malformed")
        return pod.parent

    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = ReconcileLoop(source=source, reconcile=recorder, key_map=key_map, clock=clock)
    await _started(loop, source, Pod("a", "cell-0"), Pod("b", "cell-1"))
    recorder.calls.clear()
    source.push(upsert(Pod("a", "cell-0", version=-1)), upsert(Pod("b", "cell-1", version=1)))
    await settle()
    assert recorder.calls == ["cell-0", "cell-1"]
    assert loop.get_by_parent("cell-0") == []
    assert loop.get_by_parent("cell-1") == [Pod("b", "cell-1", version=1)]
    assert "'a'" in caplog.text
    assert "cell label malformed" in caplog.text
    source.push(upsert(Pod("b", None)), upsert(Pod("c", "cell-2")))
    await settle()
    assert recorder.calls[-2:] == ["cell-1", "cell-2"], "a None key_map re-drives the old parent"
    assert loop.parent_keys() == {"cell-2"}
    await loop.stop()


async def test_a_source_factory_that_raises_delays_start_and_never_loses_the_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a source factory that raises is logged and retried after source_retry_delay,
    both before the first sync and after, and the store keeps what it had meanwhile."""
    source, clock, recorder = FakeSource(failing_opens=1), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    starting = asyncio.create_task(loop.start())
    await settle()
    assert not starting.done()
    assert "source factory refused" in caplog.text
    await clock.advance(2 * SOURCE_RETRY)
    await starting
    source.failing_opens = 2
    source.end()
    await clock.advance(2 * SOURCE_RETRY)
    assert source.opened == 1
    assert loop.parent_keys() == {"cell-0", "cell-1"}, "nothing stored is lost"
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")), upsert(Pod("c", "cell-2")))
    await clock.advance(56.0)
    assert source.opened == 2, "steps two to four of the backoff: 28 to 56 s"
    assert loop.parent_keys() == {"cell-0", "cell-1", "cell-2"}
    assert recorder.calls[-1] == "cell-2"
    await loop.stop()


async def test_reconcile_failure_is_logged_with_the_key_retried_with_backoff_and_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a reconcile that raises is logged naming the parent and the reason, retried at
    base * 2**(n-1), and every other parent keeps being served."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    recorder.failing["cell-0"] = ValueError("engine unreachable")
    loop = _loop(source, recorder, clock, failure_base_delay=2.0)
    await _started(loop, source, Pod("a", "cell-0"), Pod("b", "cell-1"))
    assert sorted(recorder.calls) == ["cell-0", "cell-1"]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "'cell-0'" in record.getMessage()
    assert "engine unreachable" in record.getMessage()
    assert record.exc_info is not None
    source.push(upsert(Pod("b", "cell-1", version=1)))
    await settle()
    assert recorder.calls[-1] == "cell-1", "the failing parent does not stall the others"
    recorder.calls.clear()
    await clock.advance(1.0)
    assert recorder.calls == []
    await clock.advance(1.0)
    assert recorder.calls == ["cell-0"], "first retry after base delay"
    await clock.advance(3.0)
    assert recorder.calls == ["cell-0"]
    await clock.advance(1.0)
    assert recorder.calls == ["cell-0", "cell-0"], "second retry after twice the base"
    del recorder.failing["cell-0"]
    await clock.advance(8.0)
    assert recorder.calls == ["cell-0"] * 3
    await clock.advance(600.0)
    assert recorder.calls == ["cell-0"] * 3, "success forgets the key: no further retries"
    await loop.stop()


async def test_a_reconcile_raising_cancelled_error_on_its_own_is_a_failure_not_a_crash() -> None:
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    recorder.failing["cell-0"] = asyncio.CancelledError()
    loop = _loop(source, recorder, clock)
    await _started(loop, source, Pod("a", "cell-0"), Pod("b", "cell-1"))
    source.push(upsert(Pod("b", "cell-1", version=1)))
    await settle()
    assert sorted(recorder.calls) == ["cell-0", "cell-1", "cell-1"]
    assert recorder.calls[-1] == "cell-1"
    await clock.advance(1.0)
    assert recorder.calls[-1] == "cell-0"
    await loop.stop()


async def test_row_requeue_after_dropped_a_successful_reconcile_is_not_repeated() -> None:
    """Row "Result{RequeueAfter}: Dropped": no timed re-check besides backoff and resync."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    await _started(loop, source, Pod("a", "cell-0"))
    await clock.advance(600.0)
    assert recorder.calls == ["cell-0"]
    await loop.stop()


async def test_row_resync_re_enqueues_only_parents_that_still_have_members() -> None:
    """Row "Resync period: Kept ... re-enqueues parents that still have members"."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock, resync_period=100.0)
    await _started(loop, source, Pod("a", "cell-0"), Pod("b", "cell-1"), Pod("c", "cell-2"))
    source.push(delete(Pod("c", "cell-2")))
    await settle()
    recorder.calls.clear()
    await clock.advance(99.0)
    assert recorder.calls == []
    await clock.advance(1.0)
    assert sorted(recorder.calls) == ["cell-0", "cell-1"]
    await clock.advance(100.0)
    assert sorted(recorder.calls) == ["cell-0", "cell-0", "cell-1", "cell-1"]
    await loop.stop()


async def test_resync_period_zero_disables_resync() -> None:
    """Go's informer convention: a resync period of 0 means no resync."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock, resync_period=0)
    await _started(loop, source, Pod("a", "cell-0"))
    await clock.advance(300.0)
    assert recorder.calls == ["cell-0"]
    await loop.stop()


async def test_row_max_concurrent_reconciles_dropped_one_reconcile_at_a_time() -> None:
    """Row "MaxConcurrentReconciles: Dropped; one worker"."""
    source, clock = FakeSource(), FakeClock()
    running: list[int] = [0]
    peak: list[int] = [0]

    async def reconcile(parent: ParentKey) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await clock.sleep(1.0)
        running[0] -= 1

    loop = ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=clock)
    await _started(loop, source, *(Pod(f"p{i}", f"cell-{i}") for i in range(5)))
    await clock.advance(10.0)
    assert peak == [1]
    await loop.stop()


async def test_worker_yields_so_events_enter_the_store_while_10000_parents_are_queued() -> None:
    """The worker yields between reconciles: with 10,000 parents queued and a reconcile that
    never awaits, new source events still reach the store long before the queue drains."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = ReconcileLoop(source=source, reconcile=recorder, clock=clock)
    source.push(ReplaceEvent(objects={f"cell-{i:05}": i for i in range(10_000)}))
    await loop.start()
    assert len(recorder.calls) < 10
    arrivals: list[int] = []
    for wave in range(20):
        source.push(upsert(Pod(f"late-{wave}")))
        await run_until(partial(_holds, loop, f"late-{wave}"))
        arrivals.append(len(recorder.calls))
    assert arrivals[-1] < 1_000, f"events waited for the queue to drain: {arrivals}"
    await run_until(lambda: len(recorder.calls) == 10_020)
    assert recorder.calls[-20:] == [f"late-{wave}" for wave in range(20)]
    await loop.stop()


async def test_row_stop_inside_reconcile_asserts_and_create_task_stop_works() -> None:
    """Row "ShutDown vs ShutDownWithDrain ... Awaiting it inside reconcile asserts (use
    asyncio.create_task)"."""
    source, clock = FakeSource(), FakeClock()
    raised: list[BaseException] = []
    stopper: list[asyncio.Task[None]] = []

    async def reconcile(parent: ParentKey) -> None:
        try:
            await loop.stop()
        except AssertionError as exc:
            raised.append(exc)
        stopper.append(asyncio.create_task(loop.stop()))

    before = asyncio.all_tasks()
    loop = ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=clock)
    await _started(loop, source, Pod("a", "cell-0"))
    [exc] = raised
    assert "asyncio.create_task(loop.stop())" in str(exc)
    await stopper[0]
    assert asyncio.all_tasks() == before


async def test_row_lifecycle_async_with_leaves_no_task() -> None:
    """Row "Lifecycle: async with loop": after the block no task of the loop is left."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    before = asyncio.all_tasks()
    source.push(replace(Pod("a", "cell-0")))
    async with _loop(source, recorder, clock, resync_period=5.0) as loop:
        await clock.advance(12.0)
        assert loop.parent_keys() == {"cell-0"}
        assert len(asyncio.all_tasks() - before) == 5, (
            "driver, worker, watchdog, resync, retry poller"
        )
    assert asyncio.all_tasks() == before
    assert recorder.calls == ["cell-0"] * 3
    assert source.closed == source.opened == 1


async def test_row_lifecycle_async_exit_stack_hands_teardown_to_its_owner() -> None:
    """Row "Lifecycle": AsyncExitStack.enter_async_context(loop) keeps start and stop paired."""
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    before = asyncio.all_tasks()
    source.push(replace(Pod("a", "cell-0")))
    async with AsyncExitStack() as stack:
        loop = await stack.enter_async_context(_loop(source, recorder, clock))
        assert loop.parent_keys() == {"cell-0"}
    assert asyncio.all_tasks() == before


async def test_row_cancelled_start_leaves_no_task_and_stop_a_no_op() -> None:
    """Row "ShutDown vs ShutDownWithDrain": a start() that was cancelled unwinds with its own
    CancelledError, and the caller's ``except: await stop()`` returns without raising."""
    source, clock = FakeSource(), FakeClock()
    before = asyncio.all_tasks()
    loop = _loop(source, Recorder(), clock)
    unwound: list[str] = []

    async def owner() -> None:
        try:
            await loop.start()
        except BaseException:
            await loop.stop()
            unwound.append("stopped")
            raise

    starting = asyncio.create_task(owner())
    await settle()
    starting.cancel()
    await asyncio.wait([starting])
    assert starting.cancelled()
    assert unwound == ["stopped"]
    await loop.stop()
    assert asyncio.all_tasks() == before


async def test_row_start_that_raised_leaves_no_task_and_stop_a_no_op() -> None:
    """Row "ShutDown vs ShutDownWithDrain": a stop() racing start() makes start() raise; the
    failed start() leaves no task, and stop() afterwards returns without raising."""
    source, clock = FakeSource(), FakeClock()
    before = asyncio.all_tasks()
    loop = _loop(source, Recorder(), clock)
    starting = asyncio.create_task(loop.start())
    await settle()
    await loop.stop()
    await asyncio.wait([starting])
    with pytest.raises(RuntimeError, match="stopped before the store synced"):
        starting.result()
    await loop.stop()
    assert asyncio.all_tasks() == before
    with pytest.raises(RuntimeError, match="once"):
        await loop.start()


async def test_stop_is_idempotent_and_concurrent_stops_both_wait_for_teardown() -> None:
    source, clock = FakeSource(), FakeClock()
    before = asyncio.all_tasks()
    loop = _loop(source, Recorder(), clock)
    await _started(loop, source, Pod("a", "cell-0"))
    await asyncio.gather(loop.stop(), loop.stop())
    assert asyncio.all_tasks() == before
    await loop.stop()


async def test_stop_cancels_an_in_flight_reconcile_and_leaves_no_task() -> None:
    """Row "ShutDown vs ShutDownWithDrain: Dropped": stop() cancels everything, then waits."""
    source, clock = FakeSource(), FakeClock()
    state: list[str] = []

    async def reconcile(parent: ParentKey) -> None:
        state.append("began")
        try:
            await clock.sleep(1000.0)
        except asyncio.CancelledError:
            state.append("cancelled")
            raise

    before = asyncio.all_tasks()
    loop = ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=clock)
    await _started(loop, source, Pod("a", "cell-0"))
    await loop.stop()
    assert state == ["began", "cancelled"]
    assert asyncio.all_tasks() == before


async def test_stop_without_start_shuts_the_retry_poller_down() -> None:
    before = asyncio.all_tasks()
    loop = _loop(FakeSource(), Recorder(), FakeClock())
    assert len(asyncio.all_tasks() - before) == 1
    await loop.stop()
    assert asyncio.all_tasks() == before


async def test_a_stream_yielding_garbage_never_stops_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock, recorder = FakeSource(), FakeClock(), Recorder()
    loop = _loop(source, recorder, clock)
    await _started(loop, source, Pod("a", "cell-0"))
    source.push(object(), None, upsert(Pod("b", "cell-1")))
    await settle()
    assert recorder.calls == ["cell-0", "cell-1"]
    assert loop.parent_keys() == {"cell-0", "cell-1"}
    assert caplog.text.count("not a source event") == 2
    await loop.stop()


async def test_cache_sync_timeout_dropped_the_caller_bounds_start_with_asyncio_timeout() -> None:
    """CR's CacheSyncTimeout is not built in: the caller bounds start() with asyncio.timeout, and
    a start() that timed out leaves no task of the loop (timeout(0) fires without waiting)."""
    source, clock = FakeSource(), FakeClock()
    before = asyncio.all_tasks()
    loop = _loop(source, Recorder(), clock)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await loop.start()
    assert asyncio.all_tasks() == before
    await loop.stop()


async def test_a_stop_racing_a_start_that_just_synced_leaves_no_task() -> None:
    """stop() issued in the same turn the store syncs: start() must not spawn after teardown."""
    source, clock = FakeSource(), FakeClock()
    before = asyncio.all_tasks()
    loop = _loop(source, Recorder(), clock)
    starting = asyncio.create_task(loop.start())
    await settle()
    source.push(replace(Pod("a", "cell-0")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    stopping = asyncio.create_task(loop.stop())
    await run_until(stopping.done)
    await run_until(starting.done)
    assert stopping.result() is None
    assert asyncio.all_tasks() == before
