"""Fast layer, property: ``ReconcileLoop(max_concurrent_reconciles=N)`` for N in 1..4 under random
events, reconcile durations, failures and requeue delays on the fake clock (record row
"MaxConcurrentReconciles"):

1. one parent is never reconciled by two workers at once;
2. once quiet, every parent's latest state has been reconciled: its last reconcile started after
   its last event was applied, and saw that state;
3. a parent whose reconcile returned ``Result(requeue_after=d)`` at ``t`` is reconciled again,
   starting by ``t + d``, one retry poll and the time the workers were busy with the others.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.result import Result
from miles.utils.workers.reconcile.retry_scheduler import POLL_INTERVAL
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, parent_of, replace, upsert

PARENTS = ("a", "b", "c", "d", "e")
DURATIONS = (0.0, 0.5, 2.0)
QUIET = 400.0
"""Fake seconds after the last step: more than every backoff, requeue and reconcile left."""

_outcome = st.one_of(st.just("ok"), st.just("fail"), st.sampled_from((1.0, 3.0, 7.5)))
_plan = st.lists(st.tuples(st.sampled_from(DURATIONS), _outcome), max_size=6)
_step = st.one_of(
    st.tuples(st.just("event"), st.sampled_from(PARENTS), st.integers(0, 1)),
    st.tuples(st.just("advance"), st.sampled_from((0.0, 0.3, 1.0, 2.5)), st.just(0)),
)


@dataclass
class _Run:
    workers: int
    plans: dict[ParentKey, list[tuple[float, str | float]]]
    clock: FakeClock = field(default_factory=FakeClock)
    running: set[ParentKey] = field(default_factory=set)
    overlaps: list[ParentKey] = field(default_factory=list)
    calls: list[tuple[ParentKey, float, tuple[tuple[str, int], ...]]] = field(default_factory=list)
    requeues: list[tuple[ParentKey, float, float]] = field(default_factory=list)
    loop: ReconcileLoop | None = None

    async def reconcile(self, parent: ParentKey) -> Result | None:
        assert self.loop is not None
        if parent in self.running:
            self.overlaps.append(parent)
        self.running.add(parent)
        seen = tuple(sorted((pod.name, pod.version) for pod in self.loop.get_by_parent(parent)))
        self.calls.append((parent, self.clock.time(), seen))
        plan = self.plans.get(parent)
        duration, outcome = plan.pop(0) if plan else (0.0, "ok")
        try:
            if duration:
                await self.clock.sleep(duration)
            if outcome == "fail":
                raise RuntimeError("planned failure")
            if isinstance(outcome, float):
                self.requeues.append((parent, self.clock.time(), outcome))
                return Result(requeue_after=outcome)
            return None
        finally:
            self.running.discard(parent)


async def _scenario(
    run: _Run, steps: list[tuple[str, object, int]]
) -> dict[ParentKey, tuple[tuple[str, int], ...]]:
    source = FakeSource()
    pods = {parent: Pod(f"{parent}-0", parent) for parent in PARENTS[:2]}
    source.push(replace(*pods.values()))
    latest: dict[str, Pod] = {pod.name: pod for pod in pods.values()}
    versions: dict[str, int] = defaultdict(int)
    run.loop = ReconcileLoop(
        source=source,
        reconcile=run.reconcile,
        key_map=parent_of,
        clock=run.clock,
        resync_period=None,
        failure_base_delay=0.5,
        failure_max_delay=8.0,
        max_concurrent_reconciles=run.workers,
    )
    async with run.loop:
        for kind, what, index in steps:
            if kind == "event":
                name = f"{what}-{index}"
                versions[name] += 1
                pod = latest[name] = Pod(name, str(what), versions[name])
                source.push(upsert(pod))
            else:
                assert isinstance(what, float)
                await run.clock.advance(what)
        await run.clock.advance(QUIET)
        assert not run.running, "quiet: no reconcile left running"
    final: dict[ParentKey, list[tuple[str, int]]] = defaultdict(list)
    for pod in latest.values():
        assert pod.parent is not None
        final[pod.parent].append((pod.name, pod.version))
    return {parent: tuple(sorted(state)) for parent, state in final.items()}


@settings(max_examples=150, deadline=None)
@given(
    workers=st.integers(1, 4),
    plans=st.dictionaries(st.sampled_from(PARENTS), _plan),
    steps=st.lists(_step, max_size=30),
)
def test_no_parent_runs_twice_at_once_the_latest_state_is_reconciled_and_requeues_run(
    workers: int,
    plans: dict[ParentKey, list[tuple[float, str | float]]],
    steps: list[tuple[str, object, int]],
) -> None:
    run = _Run(workers, {parent: list(plan) for parent, plan in plans.items()})
    final = asyncio.run(_scenario(run, steps))
    assert run.overlaps == [], "a parent was reconciled by two workers at once"
    last_seen: dict[ParentKey, tuple[tuple[str, int], ...]] = {}
    for parent, _, seen in run.calls:
        last_seen[parent] = seen
    for parent, state in final.items():
        assert last_seen.get(parent) == state, f"{parent}: latest state not reconciled"
    busy = len(PARENTS) * max(DURATIONS)
    for parent, at, after in run.requeues:
        later = [start for p, start, _ in run.calls if p == parent and start >= at]
        assert later, f"{parent}: requeue_after={after} at {at} never ran again"
        assert min(later) <= at + after + POLL_INTERVAL + busy
