"""Fast layer: ``loop.py``'s leadership gate on a ``FakeClock``: the store syncs and stays warm
while the loop stands by, and no reconcile is ever dispatched while ``is_leader()`` is false,
checked inside every reconcile; a parent taken while not leading waits for the next term. Driven
by a switchable leadership and by a real ``LeaderElector`` on ``FakeLeaseApi``."""

from __future__ import annotations

import inspect

from miles.utils.k8s_testenv.testing.lease_fakes import FakeLeaseApi
from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseLock
from miles.utils.workers.reconcile.loop import Leadership, ReconcileLoop
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Switch,
    fake_loop,
    parent_of,
    replace,
    upsert,
)


class GatedRecorder:
    """A reconcile that notes each parent, and every call made while not leading."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership
        self.calls: list[ParentKey] = []
        self.while_not_leading: list[ParentKey] = []

    async def __call__(self, parent: ParentKey) -> None:
        if not self.leadership.is_leader():
            self.while_not_leading.append(parent)
        self.calls.append(parent)


def _loop(source: FakeSource, reconcile: GatedRecorder, clock: FakeClock) -> ReconcileLoop:
    return fake_loop(source, reconcile, clock, leadership=reconcile.leadership)


def test_leadership_is_an_optional_keyword_off_by_default() -> None:
    parameter = inspect.signature(ReconcileLoop).parameters["leadership"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    assert parameter.default is None


async def test_a_loop_standing_by_syncs_its_store_and_reconciles_nothing() -> None:
    clock, source, switch = FakeClock(), FakeSource(), Switch(leading=False)
    reconcile = GatedRecorder(switch)
    source.push(replace(Pod("a-0", "a"), Pod("b-0", "b")))
    async with _loop(source, reconcile, clock) as loop:
        assert loop.get_by_parent("a") == [Pod("a-0", "a")]
        source.push(upsert(Pod("c-0", "c")))
        await clock.advance(3600)
        assert loop.get_by_parent("c") == [Pod("c-0", "c")], "the cache stays warm"
        assert reconcile.calls == []
        assert loop.status().queue_depth == 3
        switch.set(True)
        await settle()
        assert sorted(reconcile.calls) == ["a", "b", "c"]
    assert reconcile.while_not_leading == []


async def test_a_parent_taken_as_leadership_ends_waits_for_the_next_term() -> None:
    """The worker waits for a parent while leading; leadership ends before the parent arrives:
    the parent is not reconciled, stays queued, and is reconciled once leading again."""
    clock, source, switch = FakeClock(), FakeSource(), Switch(leading=True)
    reconcile = GatedRecorder(switch)
    source.push(replace())
    async with _loop(source, reconcile, clock) as loop:
        await settle()
        switch.leading = False
        source.push(upsert(Pod("a-0", "a")))
        await clock.advance(60)
        assert reconcile.calls == []
        assert loop.status().queue_depth == 1
        switch.set(True)
        await settle()
        assert reconcile.calls == ["a"]
    assert reconcile.while_not_leading == []


async def test_without_leadership_the_loop_reconciles_as_before() -> None:
    clock, source = FakeClock(), FakeSource()
    calls: list[ParentKey] = []

    async def reconcile(parent: ParentKey) -> None:
        calls.append(parent)

    source.push(replace(Pod("a-0", "a")))
    async with ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=clock):
        await settle()
        assert calls == ["a"]


async def test_never_a_reconcile_while_the_elector_does_not_hold_the_lease() -> None:
    """A real ``LeaderElector``: a foreign holder keeps the loop standing by until its lease
    expired; then the loop reconciles; the apiserver goes away and dispatch stops at the renew
    deadline, before another candidate could take the lease. Every reconcile checks
    ``is_leader()`` as it starts."""
    clock, source, api = FakeClock(), FakeSource(), FakeLeaseApi()
    api.leases[("ns", "lease")] = {
        "metadata": {"name": "lease", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15},
    }
    lock = LeaseLock(lease_api=api, namespace="ns", name="lease", identity="me")
    elector = LeaderElector(lock=lock, clock=clock)
    reconcile = GatedRecorder(elector)
    source.push(replace(Pod("a-0", "a")))
    async with elector, _loop(source, reconcile, clock) as loop:
        await clock.advance(10)
        assert reconcile.calls == []
        assert loop.get_by_parent("a") == [Pod("a-0", "a")]
        while not elector.is_leader():
            await clock.advance(0.5)
        await settle()
        assert reconcile.calls == ["a"]
        api.down = True
        lost_by = clock.time() + 10
        while elector.is_leader():
            source.push(upsert(Pod("a-0", "a", version=int(clock.time() * 10))))
            await clock.advance(0.5)
        assert clock.time() <= lost_by + 0.5
        dispatched = len(reconcile.calls)
        assert dispatched > 2
        source.push(upsert(Pod("b-0", "b")))
        await clock.advance(60)
        assert len(reconcile.calls) == dispatched
        assert loop.status().queue_depth >= 1
    assert reconcile.while_not_leading == []
