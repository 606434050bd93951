"""The process around reconcile loops: probes, metrics, leader election and graceful shutdown.
Go: CR ``pkg/manager`` (``controllerManager``).

``async with Manager(loops=[...]) as manager: await manager.wait()`` starts, in CR's order, the
probe server (``/healthz``, ``/readyz``) and the metrics server (``/metrics``), then the leader
elector if one is given (it campaigns in the background), then every loop (each lists and syncs in
the background, so ``/readyz`` answers while they do). ``wait()`` returns once ``request_stop()``
is called and raises ``ManagerError`` if a loop stops on its own or leadership is lost. Leaving the
block stops in CR's order: every loop stops taking work and finishes the reconcile in flight within
``graceful_shutdown_timeout``, the loops stop, the elector releases its lease, the servers close.

Leader election is off unless an elector is given; the loops themselves wait for leadership
(``ReconcileLoop(..., leadership=elector)``), so their caches stay warm while they stand by.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from contextlib import AsyncExitStack, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.loop import ReconcileLoop, ReconcileLoopError
from miles.utils.workers.reconcile.manager.healthz import HealthChecks
from miles.utils.workers.reconcile.manager.http_server import (
    HttpServer,
    Request,
    Response,
    not_found,
    parse_address,
)
from miles.utils.workers.reconcile.tasks import finished, first_of

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from miles.utils.workers.reconcile.informer import SharedInformerFactory

logger = logging.getLogger(__name__)

DEFAULT_HEALTH_PROBE_ADDRESS = ":8081"
DEFAULT_METRICS_ADDRESS = ":8080"
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT = 30.0
LIVENESS_ENDPOINT = "/healthz"
READINESS_ENDPOINT = "/readyz"
LEADER_ELECTION_CHECK = "leader-election"
LEADER_ELECTION_LOST = "leader election lost"


class Elector(Protocol):
    """What the manager needs of a leader elector (``leader_election.LeaderElector``)."""

    @property
    def identity(self) -> str: ...

    def is_leader(self) -> bool: ...

    async def wait_until_lost(self) -> None: ...

    def check(self) -> str | None: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Any: ...


class ManagerError(RuntimeError):
    """Why the manager stopped on its own, in one line (Go: the error ``Manager.Start`` returns)."""


class Manager:
    """Runs ``loops`` with probes, metrics and, given an ``elector``, leader election.

    Addresses are Go's: ``":8081"`` listens on every interface, ``"127.0.0.1:0"`` on a free port
    (``probe_port`` / ``metrics_port`` say which), ``"0"`` switches a server off. ``/metrics``
    renders ``registry`` (default: ``prometheus_client``'s global one), so give the loops the same
    (``ReconcileLoop(metrics=registry)``); it needs the ``metrics`` extra. ``healthz`` and
    ``readyz`` take more checks before the manager starts (Go: ``AddHealthzCheck``).
    ``informers`` (an ``informer.SharedInformerFactory`` its loops subscribe through, so loops over
    the same resource share one watch and store, as controllers share CR's manager cache) is
    closed once every loop has stopped.
    Construct it, like its loops, inside the running event loop.
    """

    def __init__(
        self,
        *,
        loops: Sequence[ReconcileLoop],
        elector: Elector | None = None,
        health_probe_address: str = DEFAULT_HEALTH_PROBE_ADDRESS,
        metrics_address: str = DEFAULT_METRICS_ADDRESS,
        registry: CollectorRegistry | None = None,
        graceful_shutdown_timeout: float | None = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
        clock: Clock | None = None,
        informers: SharedInformerFactory | None = None,
    ) -> None:
        names = [loop.name for loop in loops]
        if len(set(names)) != len(names):
            raise ValueError(f"every loop of a manager needs its own name, got {names}")
        if elector is not None:
            _check_gated(loops)
        self._loops = tuple(loops)
        self._elector = elector
        self._grace = (
            None
            if graceful_shutdown_timeout is None
            else _non_negative("graceful_shutdown_timeout", graceful_shutdown_timeout)
        )
        self._clock: Clock = RealClock() if clock is None else clock
        self._probe_address = parse_address(health_probe_address)
        self._metrics_address = parse_address(metrics_address)
        self._registry = registry
        if self._metrics_address is not None:
            _require_metrics_extra(metrics_address)
        self.healthz = HealthChecks(LIVENESS_ENDPOINT)
        self.readyz = HealthChecks(READINESS_ENDPOINT)
        for loop in self._loops:
            self.healthz.add(loop.name, _alive(loop))
            self.readyz.add(loop.name, _synced(loop))
        if elector is not None:
            self.healthz.add(LEADER_ELECTION_CHECK, elector.check)
            self.readyz.add(LEADER_ELECTION_CHECK, self._campaigning)
        self._stack = AsyncExitStack()
        if informers is not None:
            self._stack.push_async_callback(informers.aclose)
        self._probe_server: HttpServer | None = None
        self._metrics_server: HttpServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_requested = False
        self._woken = asyncio.Event()
        self._cut_grace = asyncio.Event()
        self._failure: str | None = None
        self._lost = False
        self._entered = False

    @property
    def probe_port(self) -> int | None:
        return None if self._probe_server is None else self._probe_server.port

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics_server is None else self._metrics_server.port

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def grace_cut(self) -> bool:
        """Whether ``request_stop(graceful=False)`` was called."""
        return self._cut_grace.is_set()

    def request_stop(self, *, graceful: bool = True) -> None:
        """Makes ``wait()`` return; ``graceful=False`` also cuts the grace period to nothing."""
        self._stop_requested = True
        self._woken.set()
        if not graceful:
            self._cut_grace.set()

    async def wait(self) -> None:
        """Returns once ``request_stop()`` is called; raises ``ManagerError`` if a loop stopped on
        its own or leadership was lost first. Go: ``Manager.Start`` blocking."""
        await self._woken.wait()
        if self._failure is not None:
            raise ManagerError(self._failure)

    async def __aenter__(self) -> Manager:
        if self._entered:
            raise RuntimeError("a Manager is entered once")
        self._entered = True
        try:
            await self._start()
        except BaseException:
            await self._shut_down()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        overran = await self._shut_down()
        # Go: a zero GracefulShutdownTimeout cuts runnables short without an error.
        if overran and exc_type is None and self._grace != 0:
            raise ManagerError(
                f"failed waiting for all runnables to end within grace period of {self._grace}s"
            )

    async def _start(self) -> None:
        if self._probe_address is not None:
            host, port = self._probe_address
            probe = HttpServer(self._probe, host=host, port=port, name="health probe")
            self._probe_server = await self._stack.enter_async_context(probe)
        if self._metrics_address is not None:
            from miles.utils.workers.reconcile.manager.metrics_server import metrics_server

            host, port = self._metrics_address
            server = metrics_server(host, port, self._registry)
            self._metrics_server = await self._stack.enter_async_context(server)
        if self._elector is not None:
            await self._stack.enter_async_context(self._elector)
            self._spawn(self._watch_leadership(self._elector), "manager-leadership")
        for loop in self._loops:
            self._spawn(self._run(loop), f"manager-loop-{loop.name}")

    def _spawn(self, work: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(work, name=name))

    async def _run(self, loop: ReconcileLoop) -> None:
        try:
            await loop.start()
            await loop.wait()
        except ReconcileLoopError as exc:
            self._fail(str(exc))
        except Exception as exc:
            self._fail(f"reconcile loop {loop.name!r} did not start: {exc!r}")

    async def _watch_leadership(self, elector: Elector) -> None:
        await elector.wait_until_lost()
        self._lost = True
        self._fail(LEADER_ELECTION_LOST)

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            self._woken.set()

    def _campaigning(self) -> str | None:
        return LEADER_ELECTION_LOST if self._lost else None

    async def _probe(self, request: Request) -> Response:
        for checks in (self.healthz, self.readyz):
            if checks.serves(request.path):
                return checks.serve(request)
        return not_found()

    async def _shut_down(self) -> bool:
        """Stops everything in CR's order; returns whether the grace period ran out."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        overran = False
        try:
            # Go: OnStoppedLeading sets gracefulShutdownTimeout to 0.
            overran = await self._drain(0.0 if self._lost else self._grace)
            for loop in self._loops:
                with suppress(ReconcileLoopError):
                    await loop.stop()
        finally:
            await self._stack.aclose()
        return overran

    async def _drain(self, grace: float | None) -> bool:
        """Lets every loop finish its reconcile in flight within ``grace``; ``True`` if one had
        not when the grace ran out (or ``request_stop(graceful=False)`` cut it)."""
        if any(loop.in_flight_since() is not None for loop in self._loops):
            logger.info("stopping: waiting up to %ss for the reconciles in flight", grace)
        grace_ends = () if grace is None else (self._clock.sleep(grace),)
        drained, *_ = await first_of(self._drain_all(), self._cut_grace.wait(), *grace_ends)
        return not finished(drained)

    async def _drain_all(self) -> None:
        await asyncio.gather(*(loop.drain() for loop in self._loops))


def _alive(loop: ReconcileLoop) -> Any:
    def check() -> str | None:
        return loop.status().error

    return check


def _synced(loop: ReconcileLoop) -> Any:
    def check() -> str | None:
        return None if loop.status().synced else "not synced"

    return check


def _check_gated(loops: Sequence[ReconcileLoop]) -> None:
    ungated = [loop.name for loop in loops if loop.leadership is None]
    if ungated:
        raise ValueError(
            f"reconcile loops {ungated} would reconcile without leading: with an elector, construct"
            " every loop with leadership=elector (Go: LeaderElectionRunnable)"
        )


def _non_negative(name: str, value: float) -> float:
    return 0.0 if value == 0 else positive_finite(name, value)


def _require_metrics_extra(address: str) -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ValueError(
            f"metrics_address={address!r} serves /metrics, which needs the metrics extra"
            " (pip install 'miles-reconcile[metrics]'); metrics_address='0' switches it off"
        ) from None


async def run_until_signalled(
    manager: Manager, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> int:
    """Runs ``manager`` until SIGTERM or SIGINT; the exit status for a ``main()``: 0 after a
    graceful stop, 1 (with one log line why) if it stopped on its own, could not start, or ran
    out of grace. A second signal stops without waiting for the reconcile in flight (Go's
    ``SetupSignalHandler`` exits 1 at once). Go: ``mgr.Start(ctrl.SetupSignalHandler())``."""
    event_loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        if manager.stop_requested:
            logger.warning("%s again: stopping without waiting for reconciles", signum.name)
            manager.request_stop(graceful=False)
        else:
            logger.info("%s: stopping", signum.name)
            manager.request_stop()

    for signum in signals:
        event_loop.add_signal_handler(signum, on_signal, signum)
    try:
        async with manager:
            await manager.wait()
    except (ManagerError, OSError) as exc:
        logger.error("%s", exc)
        return 1
    finally:
        for signum in signals:
            event_loop.remove_signal_handler(signum)
    return 1 if manager.grace_cut else 0
