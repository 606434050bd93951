"""Fast layer: ``ReconcileLoop(max_concurrent_reconciles=N)``, ``result.Result(requeue_after=)``
and ``result.TerminalError``: record rows "MaxConcurrentReconciles", "Result{RequeueAfter}" and
"TerminalError"."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.result import Result, TerminalError
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, Switch, fake_loop, replace

_loop = fake_loop


def _pods(*parents: str) -> list[Pod]:
    return [Pod(f"pod-{parent}", parent) for parent in parents]


@dataclass
class _HungOnStuck:
    """A reconcile that hangs on the parent "stuck" until ``hang`` is set and notes every parent
    it finished in ``done``."""

    hang: asyncio.Event = field(default_factory=asyncio.Event)
    done: list[ParentKey] = field(default_factory=list)

    async def __call__(self, parent: ParentKey) -> None:
        if parent == "stuck":
            await self.hang.wait()
        self.done.append(parent)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, None])
async def test_max_concurrent_reconciles_is_a_whole_number_of_at_least_one(value: Any) -> None:
    with pytest.raises(ValueError, match=r"max_concurrent_reconciles must be .*"):
        _loop(FakeSource(), None, FakeClock(), max_concurrent_reconciles=value)


async def test_a_hung_reconcile_holds_only_its_own_parent_with_two_workers() -> None:
    source, clock, reconcile = FakeSource(), FakeClock(), _HungOnStuck()
    source.push(replace(*_pods("stuck", "a", "b", "c")))
    async with _loop(source, reconcile, clock, max_concurrent_reconciles=2) as loop:
        await settle()
        assert reconcile.done == ["a", "b", "c"]
        status = loop.status()
        assert status.max_concurrent_reconciles == 2
        assert [r.parent for r in status.in_flight_all] == ["stuck"]
        assert status.in_flight is not None
        assert status.in_flight.parent == "stuck"
        await clock.advance(61.0)
        assert loop.status().in_flight_all[0].slow, "slow_reconcile_after holds per worker"
        reconcile.hang.set()
        await settle()
        assert loop.status().in_flight_all == ()


async def test_with_one_worker_a_hung_reconcile_holds_the_others_as_before() -> None:
    source, clock, reconcile = FakeSource(), FakeClock(), _HungOnStuck()
    source.push(replace(*_pods("stuck", "a")))
    async with _loop(source, reconcile, clock) as loop:
        await settle()
        assert reconcile.done == []
        assert loop.status().max_concurrent_reconciles == 1
        reconcile.hang.set()
        await settle()
        assert reconcile.done == ["stuck", "a"]


async def test_a_parent_changed_during_its_reconcile_runs_again_after_it_never_beside() -> None:
    source, clock = FakeSource(), FakeClock()
    release = asyncio.Event()
    running: set[ParentKey] = set()
    overlaps: list[ParentKey] = []
    calls: list[ParentKey] = []

    async def reconcile(parent: ParentKey) -> None:
        if parent in running:
            overlaps.append(parent)
        running.add(parent)
        calls.append(parent)
        try:
            if len(calls) == 1:
                await release.wait()
        finally:
            running.discard(parent)

    source.push(replace(*_pods("a")))
    async with _loop(source, reconcile, clock, max_concurrent_reconciles=3) as loop:
        await settle()
        source.push(replace(Pod("pod-a", "a", version=1)))
        await settle()
        assert calls == ["a"], "the change waits for the reconcile in flight"
        release.set()
        await settle()
        assert calls == ["a", "a"]
        assert overlaps == []
        assert loop.status().queue_depth == 0


async def test_timeout_cancels_only_the_worker_that_ran_past_it() -> None:
    source, clock = FakeSource(), FakeClock()
    forever = asyncio.Event()
    done: list[ParentKey] = []

    async def reconcile(parent: ParentKey) -> None:
        if parent == "stuck":
            await forever.wait()
        else:
            await clock.sleep(3.0)
        done.append(parent)

    source.push(replace(*_pods("stuck", "slowish")))
    loop = _loop(source, reconcile, clock, max_concurrent_reconciles=2, reconcile_timeout=5.0)
    async with loop:
        await clock.advance(3.0)
        assert done == ["slowish"]
        await clock.advance(2.5)
        assert loop.reconcile_timeouts == 1
        assert loop.status().retries[0].parent == "stuck"


async def test_requeue_after_runs_the_parent_again_after_its_delay_and_resets_backoff() -> None:
    source, clock = FakeSource(), FakeClock()
    calls: list[tuple[ParentKey, float]] = []
    fail_first = [True]

    async def reconcile(parent: ParentKey) -> Result | None:
        calls.append((parent, clock.time()))
        if fail_first[0]:
            fail_first[0] = False
            raise RuntimeError("first try fails")
        return Result(requeue_after=10.0) if len(calls) < 4 else None

    source.push(replace(*_pods("a")))
    async with _loop(source, reconcile, clock, resync_period=None) as loop:
        await clock.advance(2.0)
        assert len(calls) == 2, "the failure was retried"
        assert loop.status().retries[0].failures == 0, "the requeue forgot the failure"
        await clock.advance(9.0)
        assert len(calls) == 3, "run again 10 s after, at most one poll late"
        assert calls[2][1] - calls[1][1] >= 10.0
        await clock.advance(11.0)
        assert len(calls) == 4
        await clock.advance(100.0)
        assert len(calls) == 4, "None asks for nothing"
        assert loop.status().retries == ()


@pytest.mark.parametrize("after", [-1.0, float("inf"), float("nan"), "5", True])
def test_a_bad_requeue_after_is_refused_naming_it(after: Any) -> None:
    with pytest.raises(ValueError, match="requeue_after must be"):
        Result(requeue_after=after)


async def test_a_terminal_error_is_counted_logged_once_and_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock = FakeSource(), FakeClock()
    calls: list[ParentKey] = []
    registry = CollectorRegistry()

    async def reconcile(parent: ParentKey) -> None:
        calls.append(parent)
        raise TerminalError("spec.replicas is negative")

    source.push(replace(*_pods("a")))
    with caplog.at_level(logging.ERROR):
        async with _loop(source, reconcile, clock, metrics=registry) as loop:
            await clock.advance(300.0)
            status = loop.status()
    assert calls == ["a"]
    assert (status.terminal_failures, status.reconcile_failures, status.retries) == (1, 1, ())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert lines == [
        "[reconcile] reconcile of parent 'a' failed terminally, not retried: "
        "TerminalError: spec.replicas is negative"
    ]
    sample = registry.get_sample_value
    assert (
        sample("controller_runtime_terminal_reconcile_errors_total", {"controller": "reconcile"})
        == 1
    )
    assert sample("controller_runtime_reconcile_errors_total", {"controller": "reconcile"}) == 1


async def test_a_return_that_is_not_a_result_is_one_warning_and_read_as_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock = FakeSource(), FakeClock()

    async def reconcile(parent: ParentKey) -> object:
        return 5.0

    source.push(replace(*_pods("a")))
    with caplog.at_level(logging.WARNING):
        async with _loop(source, reconcile, clock) as loop:
            await clock.advance(100.0)
            assert loop.status().retries == ()
    assert "returned float 5.0, neither None nor a Result" in caplog.text


async def test_the_worker_gauges_read_the_workers() -> None:
    source, clock = FakeSource(), FakeClock()
    hang = asyncio.Event()
    registry = CollectorRegistry()

    async def reconcile(parent: ParentKey) -> None:
        await hang.wait()

    source.push(replace(*_pods("a", "b", "c")))
    labels = {"controller": "reconcile"}
    loop = _loop(source, reconcile, clock, metrics=registry, max_concurrent_reconciles=2)
    async with loop:
        await settle()
        sample = registry.get_sample_value
        assert sample("controller_runtime_max_concurrent_reconciles", labels) == 2
        assert sample("controller_runtime_active_workers", labels) == 2
        await clock.advance(4.0)
        assert (
            sample(
                "workqueue_longest_running_processor_seconds",
                {"name": "reconcile", "controller": "reconcile"},
            )
            == 4.0
        )
        assert (
            sample(
                "workqueue_unfinished_work_seconds",
                {"name": "reconcile", "controller": "reconcile"},
            )
            == 8.0
        )
        hang.set()
        await settle()
        assert sample("controller_runtime_active_workers", labels) == 0
        assert sample("controller_runtime_reconcile_total", {**labels, "result": "success"}) == 3


async def test_leadership_gates_every_worker_and_drain_waits_for_each() -> None:
    source, clock, leadership = FakeSource(), FakeClock(), Switch(leading=False)
    release = asyncio.Event()
    done: list[ParentKey] = []

    async def reconcile(parent: ParentKey) -> None:
        assert leadership.is_leader()
        await release.wait()
        done.append(parent)

    source.push(replace(*_pods("a", "b", "c")))
    loop = _loop(source, reconcile, clock, leadership=leadership, max_concurrent_reconciles=3)
    async with loop:
        await settle()
        assert loop.status().in_flight_all == (), "no worker dispatches while standing by"
        leadership.set(True)
        await settle()
        assert len(loop.status().in_flight_all) == 3
        drained = asyncio.create_task(loop.drain())
        await settle()
        assert not drained.done(), "drain waits for every worker's reconcile"
        release.set()
        await drained
        assert sorted(done) == ["a", "b", "c"]
