"""Fast layer: ``informer.SharedInformer`` and ``SharedInformerFactory`` (client-go's shared
informers): loops subscribed to one informer share one watch and one store, each with its own
parent index; a loop added after the sync sees the cache as adds."""

from __future__ import annotations

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.informer import SharedInformer, SharedInformerFactory
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.resource import PODS
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    delete,
    parent_of,
    replace,
    run_until,
    upsert,
)


def _by_name_prefix(pod: Pod) -> ParentKey:
    return pod.name.split("-")[0]


def _informer(source: FakeSource, clock: FakeClock) -> SharedInformer:
    return SharedInformer(source=source, name="pods", clock=clock)


async def test_two_subscribed_loops_open_one_watch_and_hold_the_same_objects() -> None:
    clock, upstream = FakeClock(), FakeSource()
    informer = _informer(upstream, clock)
    first, second = Recorder(), Recorder()
    by_label = ReconcileLoop(
        source=informer.subscribe("by-label"), reconcile=first, key_map=parent_of, clock=clock
    )
    by_name = ReconcileLoop(
        source=informer.subscribe("by-name"), reconcile=second, key_map=_by_name_prefix, clock=clock
    )
    upstream.push(replace(Pod("a-0", "cell-1"), Pod("b-0", "cell-1")))
    try:
        async with by_label, by_name:
            await run_until(lambda: len(second.calls) == 2)
            assert upstream.opened == 1, "one watch for both loops"
            assert first.calls == ["cell-1"]
            assert sorted(second.calls) == ["a", "b"]
            assert by_label.get_by_parent("cell-1")[0] is by_name.get_by_parent("a")[0]
            upstream.push(upsert(Pod("a-1", "cell-2")), delete(Pod("b-0", "cell-1")))
            await run_until(lambda: by_name.get_by_parent("b") == [])
            await run_until(lambda: by_label.parent_keys() == {"cell-1", "cell-2"})
            assert [p.name for p in by_name.get_by_parent("a")] == ["a-0", "a-1"]
            assert len(informer) == 2
            assert by_label.status().source == informer.source_status()
            assert informer.streams_opened == 2
    finally:
        await informer.aclose()
    assert upstream.closed == 1


async def test_a_loop_added_after_the_sync_sees_the_cache_as_adds() -> None:
    clock, upstream = FakeClock(), FakeSource()
    informer = _informer(upstream, clock)
    early = Recorder()
    upstream.push(replace(Pod("a-0", "cell-1")))
    loop = ReconcileLoop(
        source=informer.subscribe(), reconcile=early, key_map=parent_of, clock=clock
    )
    try:
        async with loop:
            upstream.push(upsert(Pod("a-1", "cell-2")))
            await run_until(lambda: set(early.calls) == {"cell-1", "cell-2"})
            late_calls = Recorder()
            late = ReconcileLoop(
                source=informer.subscribe(), reconcile=late_calls, key_map=parent_of, clock=clock
            )
            async with late:
                await run_until(lambda: len(late_calls.calls) == 2)
                assert sorted(late_calls.calls) == ["cell-1", "cell-2"]
                assert late.status().listings_applied == 1
                assert upstream.opened == 1
    finally:
        await informer.aclose()


async def test_a_relist_reaches_every_subscriber() -> None:
    clock, upstream = FakeClock(), FakeSource()
    informer = _informer(upstream, clock)
    one, two = Recorder(), Recorder()
    loops = [
        ReconcileLoop(source=informer.subscribe(), reconcile=r, key_map=parent_of, clock=clock)
        for r in (one, two)
    ]
    upstream.push(replace(Pod("a-0", "cell-1")))
    try:
        async with loops[0], loops[1]:
            upstream.push(replace(Pod("b-0", "cell-2")))
            await run_until(lambda: all(lp.parent_keys() == {"cell-2"} for lp in loops))
            assert [lp.status().listings_applied for lp in loops] == [2, 2]
            assert informer.keys() == {"b-0"}
    finally:
        await informer.aclose()


async def test_a_closed_informer_refuses_subscriptions_and_streams() -> None:
    informer = _informer(FakeSource(), FakeClock())
    subscription = informer.subscribe()
    await informer.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        informer.subscribe()
    with pytest.raises(RuntimeError, match="cannot open"):
        await anext(subscription())


class _Api:
    """What the factory reads of a resource API to key its informers; never called here."""

    def __init__(self, model: type, metadata_only: bool = False) -> None:
        self.resource = PODS
        self.model = model
        self.metadata_only = metadata_only

    async def list_page(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("the factory made a request")

    def stream(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("the factory made a request")

    def stream_list(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("the factory made a request")


async def test_the_factory_shares_by_resource_model_representation_and_selectors() -> None:
    async with SharedInformerFactory(clock=FakeClock()) as factory:
        full = factory.for_resource(_Api(Pod), namespace="ns", label_selector="app=x")
        assert factory.for_resource(_Api(Pod), namespace="ns", label_selector="app=x") is full
        assert (
            factory.for_resource(_Api(Pod, True), namespace="ns", label_selector="app=x")
            is not full
        )
        assert factory.for_resource(_Api(Pod), namespace="ns") is not full
        assert (
            factory.for_resource(_Api(Pod), namespace="other", label_selector="app=x") is not full
        )
        assert len(factory.informers()) == 4
        assert full.name == "pods in ns (app=x)"
        made: list[FakeSource] = []

        def build() -> FakeSource:
            made.append(FakeSource())
            return made[-1]

        assert factory.informer("k", build) is factory.informer("k", build)
        assert len(made) == 1
    with pytest.raises(RuntimeError, match="closed"):
        factory.informer("j", build)
    await settle()
