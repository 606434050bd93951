"""Fast layer: a state change the runtime logs is logged at the moment it takes effect, before
anyone can see it. Log records and effects go into one timeline: an observer task that reads the
state on every turn of the event loop (``is_leader()``, ``status()``), and a leadership-gated
reconcile; the order is asserted for leadership gained, lost and released, the loop's sync and
start, and the reflector's phases. On a ``FakeClock`` and ``FakeLeaseApi`` / ``ContractPodApi``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from miles.utils.k8s_testenv.testing.k8s_fakes import ContractPodApi, pod
from miles.utils.k8s_testenv.testing.lease_fakes import FakeLeaseApi
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_values import PodListPage, PodWatchEvent
from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseLock
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import ParentKey
from miles.utils.workers.reconcile.status import SourcePhase
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, parent_of, replace, run_until

NS, NAME = "default", "leader"
RETRY, RENEW = 2.0, 10.0
RUNTIME = "miles.utils.workers.reconcile"


class Timeline(logging.Handler):
    """What happened, in one list: ``log <module>: <message>`` for each record, and each effect
    as the test notes it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.entries.append(f"log {record.name.rsplit('.', 1)[-1]}: {record.getMessage()}")

    def note(self, effect: str) -> None:
        self.entries.append(effect)

    def first(self, fragment: str, start: int = 0) -> int:
        for index in range(start, len(self.entries)):
            if fragment in self.entries[index]:
                return index
        raise AssertionError(f"no {fragment!r} in the timeline: {self.entries}")

    def next_seen(self, name: str, after: int) -> str:
        """The observer's first reading of ``name`` after entry ``after``."""
        return self.entries[self.first(f"{name}: ", after + 1)]


@contextmanager
def timeline_of_runtime() -> Iterator[Timeline]:
    timeline, logger = Timeline(), logging.getLogger(RUNTIME)
    level = logger.level
    logger.addHandler(timeline)
    logger.setLevel(logging.DEBUG)
    try:
        yield timeline
    finally:
        logger.removeHandler(timeline)
        logger.setLevel(level)


@asynccontextmanager
async def observing(timeline: Timeline, **reads: Callable[[], object]) -> AsyncIterator[None]:
    """Reads each value on every turn of the event loop, and notes ``name: value`` when it changed
    or when anything was added to the timeline since the last note: so the first reading after a
    log line is always in the timeline, and a change seen before its line shows up before it."""

    async def observe() -> None:
        seen: dict[str, object] = {}
        count = -1
        while True:
            values = {name: read() for name, read in reads.items()}
            if values != seen or len(timeline.entries) != count:
                for name, value in values.items():
                    timeline.note(f"{name}: {value}")
                seen, count = values, len(timeline.entries)
            await asyncio.sleep(0)

    task = asyncio.create_task(observe())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _elector(api: FakeLeaseApi, clock: FakeClock) -> LeaderElector:
    lock = LeaseLock(lease_api=api, namespace=NS, name=NAME, identity="a")
    return LeaderElector(lock=lock, clock=clock, renew_deadline=RENEW, retry_period=RETRY)


async def _until(clock: FakeClock, condition: Callable[[], bool], limit: float) -> None:
    end = clock.time() + limit
    while not condition():
        assert clock.time() < end, f"not reached within {limit}s"
        await clock.advance(0.05)


def _assert_announced(timeline: Timeline, line: str, name: str, value: object) -> int:
    """The last reading of ``name`` before ``line`` is not ``value`` yet, and the first reading
    after it is: the change took effect at the moment it was logged, not an await earlier or
    later."""
    logged = timeline.first(line)
    before = [e for e in timeline.entries[:logged] if e.startswith(f"{name}: ")]
    assert before, f"{name} was never read before {line!r}: {timeline.entries}"
    assert before[-1] != f"{name}: {value}", (
        f"{name} read {value} before {line!r}: {timeline.entries}"
    )
    assert timeline.next_seen(name, logged) == f"{name}: {value}", timeline.entries
    return logged


# -- leadership ------------------------------------------------------------------------------------


async def test_acquired_is_logged_before_is_leader_and_before_the_first_gated_reconcile() -> None:
    """Go logs "successfully acquired lease" inside ``acquire``, before ``OnStartedLeading`` runs:
    here the line comes before ``is_leader()`` first reads true and before the first reconcile
    the gate lets through (it came an await after both: the attempt's cleanup ran between)."""
    api, clock, source = FakeLeaseApi(), FakeClock(), FakeSource()
    elector = _elector(api, clock)
    source.push(replace(Pod("p-0", "cell-0")))
    with timeline_of_runtime() as timeline:

        async def reconcile(parent: ParentKey) -> None:
            timeline.note("reconcile")

        loop = ReconcileLoop(
            source=source, reconcile=reconcile, key_map=parent_of, clock=clock, leadership=elector
        )
        async with loop, observing(timeline, leading=elector.is_leader), elector:
            await run_until(lambda: "reconcile" in timeline.entries)
    acquired = _assert_announced(timeline, "acquired lease", "leading", True)
    assert timeline.entries.index("reconcile") > acquired


async def test_lost_at_the_renew_deadline_is_logged_before_anyone_reads_is_leader_false() -> None:
    """The apiserver goes away: whoever first calls ``is_leader()`` past the renew deadline (here
    the observer, as a gate would) gets false only after the "lost lease" line is written."""
    api, clock = FakeLeaseApi(), FakeClock()
    with timeline_of_runtime() as timeline:
        async with _elector(api, clock) as elector:
            await elector.wait_until_leading()
            async with observing(timeline, leading=elector.is_leader):
                api.down = True
                await _until(clock, elector._lost.is_set, RENEW + 1)
                await clock.advance(0.1)
    lost = _assert_announced(timeline, "lost lease", "leading", False)
    assert "not renewed within renew_deadline" in timeline.entries[lost]
    assert sum("lost lease" in entry for entry in timeline.entries) == 1, timeline.entries


async def test_lost_to_another_holder_is_logged_before_is_leader_reads_false() -> None:
    api, clock = FakeLeaseApi(), FakeClock()
    with timeline_of_runtime() as timeline:
        async with _elector(api, clock) as elector:
            await elector.wait_until_leading()
            async with observing(timeline, leading=elector.is_leader):
                api.edit(NS, NAME, holderIdentity="intruder")
                await clock.advance(RETRY)
                await clock.advance(0.1)
    lost = _assert_announced(timeline, "lost lease", "leading", False)
    assert "held by 'intruder'" in timeline.entries[lost]
    assert timeline.first("new leader observed") > lost


async def test_leaving_is_logged_before_is_leader_reads_false_and_released_after_the_write() -> (
    None
):
    api, clock = FakeLeaseApi(), FakeClock()
    with timeline_of_runtime() as timeline:
        elector = _elector(api, clock)
        async with observing(timeline, leading=elector.is_leader):
            async with elector:
                await elector.wait_until_leading()
                await clock.advance(RETRY)
            await clock.advance(0.1)
    stopped = _assert_announced(timeline, "stopped leading lease", "leading", False)
    assert "releasing it" in timeline.entries[stopped]
    assert timeline.first("released lease") > timeline.first("leading: False", stopped)
    assert api.spec(NS, NAME)["holderIdentity"] == ""


# -- the loop and the reflector ---------------------------------------------------------------


def _next_phase(message: str) -> SourcePhase | None:
    """The phase a reflector transition line (``<state> -> <next move>``) announces."""
    if " -> " not in message:
        return None
    move = message.split(" -> ", 1)[1]
    if move == "stopped":
        return SourcePhase.STOPPED
    if move.endswith("s") and " in " in move:
        return SourcePhase.BACKING_OFF
    if move.startswith("listing by"):
        return SourcePhase.LISTING
    if move.startswith("relisting by"):
        return SourcePhase.RELISTING
    return SourcePhase.WATCHING


def _listing(rv: str, *names: str) -> PodListPage:
    return PodListPage(tuple(pod(name, resource_version=rv) for name in names), rv)


@dataclass
class _Answering(ContractPodApi):
    """Each LIST yields to the event loop before it answers, as a request over a socket does, so
    the observer reads the phase while it is in flight."""

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        await asyncio.sleep(0)
        return await super().list_pods(namespace=namespace, label_selector=label_selector)


async def test_the_reflector_s_phases_and_the_loop_s_sync_are_logged_as_they_take_effect() -> None:
    """LIST, WATCH, a 410 that relists after a backoff step, a LIST that fails and is retried
    after another, WATCH again, stop: ``status()`` never shows a phase but the one the reflector's
    last transition line announced (a change read before its line, or a line read before its
    change, would break that), and it shows every one of them. The store's sync is logged before
    ``status().synced`` reads true, the loop's start before the first reconcile."""
    clock = FakeClock()
    gone = PodWatchEvent("ERROR", None, None, rejects_cursor=True, code=410)
    api = _Answering(
        lists=[_listing("10", "a"), ConnectionRefusedError("refused"), _listing("20", "a")],
        watches=[[lambda: asyncio.sleep(0), gone]],
    )
    reflector = KubernetesReflector(
        kube_client=api, namespace="ns", label_selector="app=x", retry_delay=RETRY, clock=clock
    )
    with timeline_of_runtime() as timeline:

        async def reconcile(parent: ParentKey) -> None:
            timeline.note("reconcile")

        loop = ReconcileLoop(source=reflector.watch, reconcile=reconcile, clock=clock)
        reads: dict[str, Callable[[], object]] = {
            "phase": lambda: loop.status().source.phase,
            "synced": lambda: loop.status().synced,
        }

        def watching_again() -> bool:
            return len(api.list_calls) == 3 and loop.status().source.phase is SourcePhase.WATCHING

        async with observing(timeline, **reads):
            await loop.start()
            await run_until(lambda: "reconcile" in timeline.entries)
            await _until(clock, watching_again, 30)
            await loop.stop()
            await clock.advance(0)
    _assert_announced(timeline, "synced: the store holds the opening listing", "synced", True)
    assert timeline.entries.index("reconcile") > timeline.first("started: synced, worker running")
    announced, shown = SourcePhase.STARTING, [SourcePhase.STARTING]
    for entry in timeline.entries:
        line = entry.removeprefix("log k8s_reflector: ")
        if line != entry and _next_phase(line) is not None:
            announced = _next_phase(line) or announced
        elif entry.startswith("phase: "):
            assert entry == f"phase: {announced}", (
                f"{entry!r} after {announced}: {timeline.entries}"
            )
            if announced is not shown[-1]:
                shown.append(announced)
    expected = ["starting", "listing", "watching", "backing off", "relisting", "backing off"]
    assert [str(p) for p in shown] == [*expected, "relisting", "watching", "stopped"]
