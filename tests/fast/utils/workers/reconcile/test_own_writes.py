"""Fast layer: ``own_writes.py`` (read your own writes, KEP-5647) with the loop's dispatch gate."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import pytest

from miles.utils.workers.reconcile.client import Client, RawResponse
from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.own_writes import OwnWrites, resource_version_of
from miles.utils.workers.reconcile.resource import CONFIG_MAPS, PODS
from miles.utils.workers.reconcile.source_event import ParentKey, UpsertEvent
from miles.utils.workers.reconcile.status import SourcePhase, SourceStatus
from tests.fast.utils.workers.reconcile.fake_transport import RecordingTransport, Sent
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, parent_of, replace, upsert

POOL = "pool-a"


def _version(pod: Pod) -> str:
    return str(pod.version)


@dataclass
class _NaiveController:
    """Wants one worker pod per pool; creates one whenever its cache shows none (its names are
    generated, so the apiserver cannot refuse a second)."""

    loop: ReconcileLoop | None = None
    tracker: OwnWrites | None = None
    next_version: int = 3
    created: list[Pod] = field(default_factory=list)

    async def __call__(self, parent: ParentKey) -> None:
        assert self.loop is not None
        if any(pod.name.startswith("worker") for pod in self.loop.get_by_parent(parent)):
            return
        pod = Pod(name=f"worker-{len(self.created)}", parent=parent, version=self.next_version)
        self.next_version += 1
        self.created.append(pod)
        if self.tracker is not None:
            self.tracker.wrote(_version(pod))


@pytest.mark.parametrize("read_own_writes", [False, True])
async def test_a_late_watch_makes_a_naive_controller_create_twice_and_the_gate_once(
    read_own_writes: bool,
) -> None:
    clock, source = FakeClock(), FakeSource()
    tracker = OwnWrites(clock=clock, version_of=_version) if read_own_writes else None
    controller = _NaiveController(tracker=tracker)
    loop = ReconcileLoop(
        source=source if tracker is None else tracker.watching(source),
        reconcile=controller,
        key_map=parent_of,
        clock=clock,
        dispatch_gate=tracker,
    )
    controller.loop = loop
    source.push(replace(Pod("marker", POOL, version=1)))
    async with loop:
        await settle()
        assert len(controller.created) == 1
        # An older change to the pool (version 2, before our create at 3) arrives first.
        source.push(upsert(Pod("marker", POOL, version=2)))
        await settle()
        for pod in list(controller.created):
            source.push(upsert(pod))
        await clock.advance(1.0)
        await settle()
        for pod in controller.created[1:]:
            source.push(upsert(pod))
        await settle()
    assert len(controller.created) == (1 if read_own_writes else 2)
    assert tracker is None or tracker.waits == 1
    assert {p.name for p in loop.get_by_parent(POOL)} >= {p.name for p in controller.created}


async def test_a_write_the_watch_never_delivers_holds_its_parent_for_the_bound_then_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    tracker = OwnWrites(clock=clock, bound=300.0, version_of=_version, name="pools")
    tracker.observe(upsert(Pod("marker", POOL, version=1)))
    tracker.wrote("7", parent=POOL)
    released = False

    async def dispatch() -> None:
        nonlocal released
        await tracker.wait(POOL)
        released = True

    with caplog.at_level(logging.WARNING):
        task = asyncio.ensure_future(dispatch())
        await clock.advance(299.0)
        assert not released
        await clock.advance(1.0)
        await task
    assert released
    lines = [r.getMessage() for r in caplog.records if "resourceVersion 7" in r.getMessage()]
    assert len(lines) == 1
    assert "pool-a" in lines[0]
    assert "300.0s" in lines[0]
    assert tracker.pending(POOL) is None


async def test_the_newest_write_of_a_reconcile_is_the_one_waited_for() -> None:
    tracker = OwnWrites(clock=FakeClock(), version_of=_version)
    with tracker.dispatching(POOL):
        tracker.wrote("12")
        tracker.wrote("9")
    tracker.wrote("99")  # outside a reconcile: no parent, nothing recorded
    assert tracker.pending(POOL) == "12"
    tracker.observe(upsert(Pod("x", POOL, version=11)))
    assert tracker.pending(POOL) == "12"
    tracker.observe(replace(Pod("x", POOL, version=5), Pod("y", None, version=12)))
    assert tracker.pending(POOL) is None
    await tracker.wait(POOL)
    assert tracker.waits == 0


async def test_a_version_that_is_not_an_integer_waits_for_the_watch_to_carry_it() -> None:
    tracker = OwnWrites(clock=FakeClock(), version_of=resource_version_of)
    tracker.wrote("a7", parent=POOL)
    tracker.observe(upsert(Pod("x", POOL)))  # a Pod of the fakes has no metadata: no version
    tracker.observe(_event_with_version("1000"))
    assert tracker.pending(POOL) == "a7"
    tracker.observe(_event_with_version("a7"))
    assert tracker.pending(POOL) is None


def _event_with_version(version: str) -> UpsertEvent:
    return UpsertEvent(key="x", obj={"metadata": {"name": "x", "resourceVersion": version}})


@pytest.mark.parametrize("version", ["", "0012", "-3", "1e3"])
def test_resource_versions_that_do_not_parse_have_no_order(version: str) -> None:
    tracker = OwnWrites(clock=FakeClock())
    tracker.observe(_event_with_version("5"))
    tracker.wrote(version, parent=POOL)
    assert tracker.pending(POOL) == (version or None)


@dataclass
class _AnsweringTransport(RecordingTransport):
    """Answers every request with the object it names, at the next resourceVersion."""

    version: int = 40

    def answer(self, sent: Sent) -> RawResponse:
        self.version += 1
        name = sent.path.rsplit("/", 1)[-1]
        body = {"kind": "X", "metadata": {"name": name, "resourceVersion": str(self.version)}}
        return RawResponse(200, json.dumps(body).encode())


async def test_the_client_records_its_writes_of_the_cached_kinds_for_the_parent_reconciled() -> (
    None
):
    tracker = OwnWrites(clock=FakeClock())
    client = Client(transport=_AnsweringTransport(), on_write=tracker.observer(PODS))
    pod = {"metadata": {"name": "worker-0"}}
    await client.create(PODS, pod, namespace="ns")  # outside a reconcile: no parent
    assert tracker.pending(POOL) is None
    with tracker.dispatching(POOL):
        await client.create(PODS, pod, namespace="ns")
        await client.get(PODS, "worker-0", namespace="ns")
        await client.create(CONFIG_MAPS, {"metadata": {"name": "c"}}, namespace="ns")
    assert tracker.pending(POOL) == "42"


async def test_a_watched_source_keeps_its_name_and_status_for_the_loop() -> None:
    class _Named(FakeSource):
        name = "pods-in-ns"

        def source_status(self) -> SourceStatus:
            return SourceStatus(phase=SourcePhase.WATCHING)

    source, clock = _Named(), FakeClock()
    tracker = OwnWrites(clock=clock)
    loop = ReconcileLoop(source=tracker.watching(source), reconcile=_NaiveController(), clock=clock)
    assert loop.name == "pods-in-ns"
    assert loop.source_status().phase is SourcePhase.WATCHING
