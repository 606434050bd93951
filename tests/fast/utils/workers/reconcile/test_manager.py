"""Fast layer: ``manager/manager.py`` rows (CR ``pkg/manager``): probes over a real socket on
127.0.0.1, graceful shutdown on a ``FakeClock``, leader election through the real ``LeaderElector``
on a ``FakeLeaseApi``."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from miles.utils.k8s_testenv.testing.lease_fakes import FakeLeaseApi
from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.informer import SharedInformerFactory
from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseLock, LeaseObject
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.manager.manager import Manager, ManagerError, run_until_signalled
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    fake_loop,
    parent_of,
    replace,
    run_until,
    upsert,
)
from tests.fast.utils.workers.reconcile.http_probe import get

GRACE = 30.0


class RecordingLeaseApi(FakeLeaseApi):
    """Notes, at each write that releases the lease, whether every watched loop had stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: list[ReconcileLoop] = []
        self.loops_stopped_at_release: list[bool] = []

    async def replace_lease(self, *, namespace: str, name: str, lease: LeaseObject) -> LeaseObject:
        if not lease["spec"].get("holderIdentity"):
            self.loops_stopped_at_release = [loop.status().stopped for loop in self.watched]
        return await super().replace_lease(namespace=namespace, name=name, lease=lease)


def _elector(api: FakeLeaseApi, clock: FakeClock) -> LeaderElector:
    lock = LeaseLock(lease_api=api, namespace="ns", name="lease", identity="me")
    return LeaderElector(lock=lock, clock=clock)


class Gate:
    """A reconcile that blocks until ``open()``; records starts and finishes."""

    def __init__(self) -> None:
        self.started: list[ParentKey] = []
        self.finished: list[ParentKey] = []
        self.cancelled: list[ParentKey] = []
        self._open = asyncio.Event()

    def open(self) -> None:
        self._open.set()

    async def __call__(self, parent: ParentKey) -> None:
        self.started.append(parent)
        try:
            await self._open.wait()
        except asyncio.CancelledError:
            self.cancelled.append(parent)
            raise
        self.finished.append(parent)


def _loop(
    source: FakeSource, reconcile: Gate, clock: FakeClock, leadership: LeaderElector | None = None
) -> ReconcileLoop:
    return fake_loop(
        source, reconcile, clock, name="pods", resync_period=None, leadership=leadership
    )


def _manager(*loops: ReconcileLoop, clock: FakeClock, **kwargs: object) -> Manager:
    return Manager(
        loops=loops,
        clock=clock,
        health_probe_address="127.0.0.1:0",
        metrics_address="0",
        graceful_shutdown_timeout=GRACE,
        **kwargs,  # type: ignore[arg-type]
    )


def _gated(clock: FakeClock) -> tuple[Manager, ReconcileLoop, FakeSource, Gate]:
    """A manager of one loop whose reconcile of parent "a" waits for its gate."""
    source, gate = FakeSource(), Gate()
    source.push(replace(Pod("p", "a")))
    loop = _loop(source, gate, clock)
    return _manager(loop, clock=clock), loop, source, gate


async def _reconciling(clock: FakeClock) -> tuple[Manager, ReconcileLoop, FakeSource, Gate]:
    """``_gated``'s manager entered, its loop in the reconcile of "a"."""
    manager, loop, source, gate = _gated(clock)
    await manager.__aenter__()
    await _until(lambda: gate.started == ["a"])
    return manager, loop, source, gate


async def _signalled_mid_reconcile(signum: int, then: Callable[[Gate], object]) -> tuple[int, Gate]:
    """``run_until_signalled`` over ``_gated``'s manager, sent ``signum`` while the reconcile of
    "a" waits; ``then`` runs once the stop is requested. The exit code, and the gate."""
    manager, _, _, gate = _gated(FakeClock())

    async def send() -> None:
        await _until(lambda: gate.started == ["a"])
        os.kill(os.getpid(), signum)
        await _until(lambda: manager.stop_requested)
        then(gate)

    sender = asyncio.create_task(send())
    code = await run_until_signalled(manager)
    await sender
    return code, gate


async def _probe(manager: Manager, path: str) -> tuple[int, str]:
    """The probe server's answer to ``path``: its status and body."""
    port = manager.probe_port
    assert port is not None
    answer = await get(port, path)
    return answer.status, answer.body


async def _until(condition: object) -> None:
    for _ in range(1000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition still false")


async def test_readyz_waits_for_every_loop_to_sync_and_healthz_is_ok_meanwhile() -> None:
    clock, source, gate = FakeClock(), FakeSource(), Gate()
    gate.open()
    async with _manager(_loop(source, gate, clock), clock=clock) as manager:
        assert await _probe(manager, "/readyz") == (
            500,
            "[-]pods failed: reason withheld\nhealthz check failed\n",
        )
        port = manager.probe_port
        assert port is not None
        assert (await get(port, "/readyz/pods")).body == "internal server error: not synced\n"
        assert (await get(port, "/healthz")).body == "ok"
        source.push(replace(Pod("p", "a")))
        await settle()
        assert (await get(port, "/readyz")).body == "ok"
        assert (await get(port, "/livez")).status == 404
        manager.request_stop()
        await manager.wait()


async def test_a_dead_loop_fails_healthz_and_wait_raises_one_line() -> None:
    clock, source, gate = FakeClock(), FakeSource(), Gate()
    source.push(replace(Pod("p", "a")))
    loop = ReconcileLoop(
        source=source,
        reconcile=gate,
        key_map=parent_of,
        clock=clock,
        name="pods",
        resync_period=10.0,
    )

    def broken_parent_keys() -> set[ParentKey]:
        raise RuntimeError("store index corrupted")

    manager = _manager(loop, clock=clock)
    async with manager:
        await _until(lambda: loop.status().synced)
        loop._store.parent_keys = broken_parent_keys  # type: ignore[method-assign]
        await clock.advance(10.0)
        with pytest.raises(ManagerError, match="reconcile loop 'pods' stopped: RuntimeError"):
            await manager.wait()
        assert await _probe(manager, "/healthz/pods") == (
            500,
            "internal server error: RuntimeError: store index corrupted\n",
        )


async def test_stop_lets_the_reconcile_in_flight_finish_within_the_grace() -> None:
    clock = FakeClock()
    manager, loop, source, gate = await _reconciling(clock)
    manager.request_stop()
    await manager.wait()
    exiting = asyncio.create_task(manager.__aexit__(None, None, None))
    await clock.advance(GRACE - 1)
    assert not exiting.done()
    source.push(upsert(Pod("q", "b")))
    await settle()
    gate.open()
    await exiting
    assert gate.finished == ["a"]
    assert gate.cancelled == []
    assert loop.status().stopped
    assert loop.status().error is None
    assert gate.started == ["a"]


async def test_a_reconcile_past_the_grace_is_cancelled_and_exit_says_so() -> None:
    clock = FakeClock()
    manager, _, _, gate = await _reconciling(clock)
    manager.request_stop()
    exiting = asyncio.create_task(manager.__aexit__(None, None, None))
    await clock.advance(GRACE)
    with pytest.raises(ManagerError, match=r"within grace period of 30\.0s"):
        await exiting
    assert gate.cancelled == ["a"]


async def test_a_stop_without_grace_cancels_the_reconcile_at_once() -> None:
    clock = FakeClock()
    manager, _, _, gate = await _reconciling(clock)
    manager.request_stop(graceful=False)
    assert manager.grace_cut
    with pytest.raises(ManagerError, match="grace period"):
        await manager.__aexit__(None, None, None)
    assert gate.cancelled == ["a"]


async def test_the_lease_is_released_after_every_loop_stopped() -> None:
    clock, source, gate, api = FakeClock(), FakeSource(), Gate(), RecordingLeaseApi()
    gate.open()
    source.push(replace(Pod("p", "a")))
    elector = _elector(api, clock)
    loop = _loop(source, gate, clock, leadership=elector)
    api.watched.append(loop)
    async with _manager(loop, clock=clock, elector=elector) as manager:
        await _until(lambda: gate.finished == ["a"])
        assert api.spec("ns", "lease")["holderIdentity"] == "me"
        port = manager.probe_port
        assert port is not None
        verbose = await get(port, "/readyz?verbose")
        assert verbose.body == "[+]leader-election ok\n[+]pods ok\nhealthz check passed\n"
        assert (await get(port, "/healthz/leader-election")).body == "ok"
        manager.request_stop()
        await manager.wait()
    assert api.spec("ns", "lease")["holderIdentity"] == ""
    assert api.loops_stopped_at_release == [True]


async def test_a_candidate_standing_by_is_ready_and_reconciles_nothing() -> None:
    clock, source, gate, api = FakeClock(), FakeSource(), Gate(), FakeLeaseApi()
    api.leases[("ns", "lease")] = {"metadata": {"name": "lease", "resourceVersion": "0"}}
    api.edit("ns", "lease", holderIdentity="other", leaseDurationSeconds=15)
    source.push(replace(Pod("p", "a")))
    elector = _elector(api, clock)
    loop = _loop(source, gate, clock, leadership=elector)
    async with _manager(loop, clock=clock, elector=elector) as manager:
        await _until(lambda: loop.status().synced)
        await clock.advance(10.0)
        port = manager.probe_port
        assert port is not None
        assert (await get(port, "/readyz")).body == "ok"
        assert elector.leader == "other"
        manager.request_stop()
    assert gate.started == []
    assert api.spec("ns", "lease")["holderIdentity"] == "other"


async def test_leadership_lost_stops_at_once_with_cr_s_line() -> None:
    clock, source, gate, api = FakeClock(), FakeSource(), Gate(), FakeLeaseApi()
    source.push(replace(Pod("p", "a")))
    elector = _elector(api, clock)
    manager = _manager(_loop(source, gate, clock, leadership=elector), clock=clock, elector=elector)
    await manager.__aenter__()
    await _until(lambda: gate.started == ["a"])
    api.down = True
    await clock.advance(11.0)
    port = manager.probe_port
    assert port is not None
    with pytest.raises(ManagerError, match=r"^leader election lost$") as lost:
        await manager.wait()
    assert (await get(port, "/readyz/leader-election")).status == 500
    await manager.__aexit__(ManagerError, lost.value, None)
    assert gate.cancelled == ["a"]


def test_with_an_elector_every_loop_must_be_gated() -> None:
    async def build() -> None:
        clock = FakeClock()
        with pytest.raises(ValueError, match=r"\['pods'\] would reconcile without leading"):
            Manager(
                loops=[_loop(FakeSource(), Gate(), clock)], elector=_elector(FakeLeaseApi(), clock)
            )

    asyncio.run(build())


async def test_metrics_are_served_from_the_loops_registry() -> None:
    clock, source, gate = FakeClock(), FakeSource(), Gate()
    registry = CollectorRegistry()
    loop = ReconcileLoop(
        source=source, reconcile=gate, key_map=parent_of, clock=clock, name="m", metrics=registry
    )
    source.push(replace())
    manager = Manager(
        loops=[loop],
        clock=clock,
        health_probe_address="0",
        metrics_address="127.0.0.1:0",
        registry=registry,
    )
    async with manager:
        assert manager.probe_port is None
        port = manager.metrics_port
        assert port is not None
        answer = await get(port, "/metrics")
        manager.request_stop()
    assert 'workqueue_depth{controller="m",name="m",priority=""} 0.0' in answer.body


def test_loop_names_are_unique_and_addresses_checked() -> None:
    async def build() -> None:
        clock = FakeClock()
        loops = [_loop(FakeSource(), Gate(), clock), _loop(FakeSource(), Gate(), clock)]
        with pytest.raises(ValueError, match="its own name"):
            Manager(loops=loops)
        with pytest.raises(ValueError, match="host:port"):
            Manager(loops=[], health_probe_address="8081")
        with pytest.raises(ValueError, match="graceful_shutdown_timeout"):
            Manager(loops=[], graceful_shutdown_timeout=-1)

    asyncio.run(build())


async def test_sigterm_stops_gracefully_and_returns_0() -> None:
    code, gate = await _signalled_mid_reconcile(signal.SIGTERM, then=lambda gate: gate.open())
    assert code == 0
    assert gate.finished == ["a"]


async def test_a_second_signal_cuts_the_grace_and_returns_1() -> None:
    code, gate = await _signalled_mid_reconcile(
        signal.SIGINT, then=lambda _: os.kill(os.getpid(), signal.SIGINT)
    )
    assert code == 1
    assert gate.cancelled == ["a"]


async def test_a_port_taken_is_one_line_and_exit_1(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    first = _manager(clock=clock)
    async with first:
        port = first.probe_port
        second = Manager(loops=[], health_probe_address=f"127.0.0.1:{port}", metrics_address="0")
        assert await run_until_signalled(second) == 1
        first.request_stop()
    assert any("health probe server cannot listen" in r.getMessage() for r in caplog.records)


async def test_a_manager_that_cannot_start_leaves_its_loops_stopped_and_no_task() -> None:
    clock, source = FakeClock(), FakeSource()
    before = asyncio.all_tasks()
    async with _manager(clock=clock) as first:
        loop = _loop(source, Gate(), clock)
        second = Manager(
            loops=[loop],
            clock=clock,
            health_probe_address=f"127.0.0.1:{first.probe_port}",
            metrics_address="0",
        )
        with pytest.raises(OSError, match="cannot listen"):
            await second.__aenter__()
        first.request_stop()
    assert loop.status().stopped
    assert asyncio.all_tasks() <= before


async def test_a_zero_grace_cuts_the_reconcile_without_an_error() -> None:
    clock, source, gate = FakeClock(), FakeSource(), Gate()
    source.push(replace(Pod("p", "a")))
    manager = Manager(
        loops=[_loop(source, gate, clock)],
        clock=clock,
        health_probe_address="0",
        metrics_address="0",
        graceful_shutdown_timeout=0,
    )
    async with manager:
        await _until(lambda: gate.started == ["a"])
        manager.request_stop()
    assert gate.cancelled == ["a"]


async def test_two_controllers_share_the_managers_informers_which_close_after_them() -> None:
    """Two loops over the same pods through the manager's ``informers``: one watch, one store;
    leaving the manager stops the loops, then closes the shared stream."""
    clock, upstream = FakeClock(), FakeSource()
    factory = SharedInformerFactory(clock=clock)
    informer = factory.informer("pods", lambda: upstream, name="pods")
    recorders = [Recorder(), Recorder()]
    loops = [
        ReconcileLoop(
            source=informer.subscribe(), reconcile=r, key_map=parent_of, clock=clock, name=f"c{i}"
        )
        for i, r in enumerate(recorders)
    ]
    upstream.push(replace(Pod("a-0", "cell-1")))
    manager = Manager(
        loops=loops, clock=clock, health_probe_address="0", metrics_address="0", informers=factory
    )
    async with manager:
        await run_until(lambda: all(r.calls == ["cell-1"] for r in recorders))
        assert upstream.opened == 1
    assert upstream.closed == 1
    with pytest.raises(RuntimeError, match="closed"):
        informer.subscribe()
