"""Lifecycle, the single worker and resync. Go: controller-runtime's internal ``Controller``."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from miles.utils.workers.reconcile.arguments import (
    delay_range,
    optional_period,
    positive_finite,
)
from miles.utils.workers.reconcile.clock import Clock, RealClock, time_function
from miles.utils.workers.reconcile.log import NamedLogger, describe, one_line
from miles.utils.workers.reconcile.metrics_provider import (
    LoopMetrics,
    MetricsProvider,
    NoMetrics,
    ReconcileResult,
)
from miles.utils.workers.reconcile.object_store import KeyMapFn, ObjectStore
from miles.utils.workers.reconcile.own_writes import DispatchGate
from miles.utils.workers.reconcile.result import Result, TerminalError
from miles.utils.workers.reconcile.retry_scheduler import RetryScheduler
from miles.utils.workers.reconcile.source_event import ParentKey, SourceWatchFn
from miles.utils.workers.reconcile.source_stream_driver import SourceStreamDriver
from miles.utils.workers.reconcile.status import (
    LoopStatus,
    ReconcileInFlight,
    RetryStatus,
    SourceStatus,
    StatusReporter,
    WatchStatus,
)
from miles.utils.workers.reconcile.tasks import finished, first_of
from miles.utils.workers.reconcile.watches import (
    CacheReader,
    SourceSet,
    Watch,
    watch_name,
    watch_status,
)
from miles.utils.workers.reconcile.work_queue import WorkQueue

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)

DEFAULT_RESYNC_PERIOD = 36000.0
DEFAULT_SLOW_RECONCILE_AFTER = 60.0
DEFAULT_NAME = "reconcile"
DEFAULT_SOURCE_RETRY_DELAY = 1.0
DEFAULT_CACHE_SYNC_TIMEOUT = 120.0
"""controller-runtime's ``CacheSyncTimeout`` default (``pkg/controller/controller.go``)."""
ERROR_SUMMARY_LIMIT = 300
"""Characters of an error the loop keeps in ``status()`` and its own messages."""
SAMPLE_PERIOD = 1.0
"""How often the watchdog stamps the time of the last event (so it is at most this late)."""
MINIMUM_RESYNC_PERIOD = 1.0
"""A smaller positive ``resync_period`` is raised to this, with one warning (client-go's
``minimumResyncPeriod``)."""
MINIMUM_WATCHDOG_SLEEP = 0.1
"""The watchdog never sleeps less, whatever ``slow_reconcile_after`` or ``reconcile_timeout``."""
ReconcileFn = Callable[[ParentKey], Awaitable[Result | None]]
"""``async reconcile(parent)``: returns ``None`` or a ``result.Result``, raises to fail."""

_START_TWICE = "start() may be called once per ReconcileLoop, before stop()"
_STOP_INSIDE_RECONCILE = (
    "stop() awaited inside reconcile would cancel the reconcile awaiting it; "
    "schedule it instead with asyncio.create_task(loop.stop())"
)
_FATAL = (KeyboardInterrupt, SystemExit)


class Leadership(Protocol):
    """What the loop asks of leader election (``leader_election.LeaderElector`` is one): whether
    this process may act now, and a wait for when it may. ``wait_until_leading`` returns only once
    ``is_leader()`` is true."""

    def is_leader(self) -> bool: ...

    async def wait_until_leading(self) -> None: ...


class ReconcileLoopError(RuntimeError):
    """The loop stopped on its own because one of its tasks died; ``__cause__`` is why.

    Raised into the body of ``async with loop:`` (which the death cancels, as a failing task
    cancels the body of an ``asyncio.TaskGroup``), and by ``stop()`` and ``wait()``: Go's
    ``Controller.Start`` returns the error.
    """


class ReconcileLoopUsageError(RuntimeError, AssertionError):
    """The loop was used in a way it cannot serve: ``start()`` twice or after ``stop()``,
    ``stop()`` awaited inside a reconcile, a call from another event loop. The message says which
    and what to do instead.

    A ``RuntimeError`` and an ``AssertionError`` both, so code written against the original, which
    raised ``RuntimeError`` for the first and last and ``AssertionError`` for the second, catches
    what it caught (see the record's Lifecycle row).
    """


class LoopPhase(enum.Enum):
    """Where a ``ReconcileLoop`` is in its life; ``ReconcileLoop.phase``.

    NEW → STARTING (``start()``) → RUNNING (synced, workers started) → DRAINING (``drain()``)
    → STOPPING (``stop()``) → STOPPED. DIED: a task of the loop ended on its own; ``stop()`` still
    takes it through STOPPING to STOPPED, and the error it died of stays.
    """

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    DIED = "died"
    STOPPING = "stopping"
    STOPPED = "stopped"


class _Event(enum.Enum):
    START = "start()"
    SYNCED = "synced"
    DRAIN = "drain()"
    DIE = "a task died"
    STOP = "stop()"
    STOPPED = "torn down"


@dataclass(frozen=True, slots=True)
class _Lifecycle:
    """The loop's one state: its phase and, once it died, why (kept to the end), and whether the
    death cancelled the body of ``async with loop:`` (so ``__aexit__`` takes that cancellation
    back)."""

    phase: LoopPhase = LoopPhase.NEW
    error: BaseException | None = None
    cancelled_owner: bool = False


_ENDING = (LoopPhase.STOPPING, LoopPhase.STOPPED)


def _transition(
    state: _Lifecycle,
    event: _Event,
    *,
    error: BaseException | None = None,
    cancelled_owner: bool = False,
) -> _Lifecycle:
    """The loop's one transition function. Invariants:

    1. ``start()`` is accepted once, from NEW only; any other start is a usage error.
    2. Once STOPPING, nothing but the teardown's end moves the loop, and it never runs again.
    3. ``error`` is set by DIE alone, once, and never cleared; a loop dies only while it runs
       (STARTING, RUNNING, DRAINING).
    4. DRAINING is never left for RUNNING: a drained loop takes no more work until it stops.
    """
    phase = state.phase
    if event is _Event.START:
        if phase is not LoopPhase.NEW:
            raise ReconcileLoopUsageError(_START_TWICE)
        return _Lifecycle(LoopPhase.STARTING)
    if event is _Event.SYNCED:
        return (
            dataclasses.replace(state, phase=LoopPhase.RUNNING)
            if phase is LoopPhase.STARTING
            else state
        )
    if event is _Event.DRAIN:
        running = (LoopPhase.NEW, LoopPhase.STARTING, LoopPhase.RUNNING)
        return dataclasses.replace(state, phase=LoopPhase.DRAINING) if phase in running else state
    if event is _Event.DIE:
        assert error is not None, "a death has a cause"
        assert state.error is None, "a loop dies once"
        assert phase not in _ENDING, f"death in {phase}"
        return _Lifecycle(LoopPhase.DIED, error, cancelled_owner)
    if event is _Event.STOP:
        assert phase not in _ENDING, f"stop() in {phase}"
        return dataclasses.replace(state, phase=LoopPhase.STOPPING)
    assert phase is LoopPhase.STOPPING, f"torn down in {phase}"
    return dataclasses.replace(state, phase=LoopPhase.STOPPED)


@dataclass(slots=True)
class _Slot:
    """One worker and the reconcile it runs: its parent (``None`` between reconciles), its start,
    and which reconcile (``seq``) the watchdog has logged as slow and cancelled."""

    task: asyncio.Task[None] | None = None
    parent: ParentKey | None = None
    since: float = 0.0
    seq: int = 0
    slow_logged: int = 0
    timing_out: int = 0


class ReconcileLoop:
    """Calls ``reconcile(parent)`` for every parent whose objects changed; one parent is never
    reconciled twice at once, and by default one parent at a time.

    ``start`` returns once the store holds a whole listing; ``stop`` cancels every task of the loop
    and waits for them. Prefer ``async with loop:``. Construct it inside a running event loop, and
    use it on that one only. Its life is one ``LoopPhase`` (``phase``); misuse raises
    ``ReconcileLoopUsageError``.

    Keywords (all keyword-only):

    - ``source`` (this or ``sources``): the ``SourceWatchFn`` whose events fill the store, e.g.
      ``KubernetesReflector(...).watch``.
    - ``sources`` (this or ``source``): several ``watches.Watch``, each a source with its own
      ``key_map`` and cache (controller-runtime's ``Watches``); ``start()`` returns once every
      one has synced; ``cache(name)`` reads each, ``get_by_parent`` and ``parent_keys`` the
      first; ``status().sources`` shows each. Every key map must name parents alike:
      ``namespace/name`` where the sources span namespaces (see ``watches``).
    - ``reconcile`` (required): ``async reconcile(parent)``; an exception retries the parent with
      backoff, ``result.TerminalError`` does not; returning ``result.Result(requeue_after=s)``
      runs it again ``s`` seconds later with its backoff reset, ``None`` asks for nothing.
    - ``key_map`` (``None``: each object is its own parent): maps an object to its parent key
      (or several), or ``None`` for an object no parent owns; with ``source`` only.
    - ``resync_period`` (``DEFAULT_RESYNC_PERIOD``, 36000 s; ``None`` for never): every parent in
      the store is queued again this often; below ``MINIMUM_RESYNC_PERIOD`` it is raised to it.
    - ``failure_base_delay`` (1.0 s) and ``failure_max_delay`` (60.0 s): a failed parent is
      retried after ``base * 2**(failures-1)``, capped at the maximum.
    - ``source_retry_delay`` (``DEFAULT_SOURCE_RETRY_DELAY``, 1.0 s): the wait before the source
      is called again after it ended or raised.
    - ``clock`` (``None``: a ``RealClock``): every time and sleep of the loop; a ``FakeClock`` in
      tests.
    - ``name`` (``None``: the source's ``.name``, else ``"reconcile"``): prefixes every log line
      and labels the metrics.
    - ``slow_reconcile_after`` (``DEFAULT_SLOW_RECONCILE_AFTER``, 60 s): a reconcile running this
      long is logged once as slow.
    - ``reconcile_timeout`` (``None``: never): a reconcile running this long is cancelled and
      retried as a failure.
    - ``metrics`` (``None``: none): a ``MetricsProvider`` or a ``prometheus_client``
      ``CollectorRegistry``.
    - ``leadership`` (``None``: always reconcile): a ``Leadership`` gating every dispatch.
    - ``max_concurrent_reconciles`` (1, controller-runtime's default): the workers; each parent
      is reconciled by one at a time (client-go's workqueue guarantee), and a parent changed
      during its reconcile runs again after it. ``slow_reconcile_after``, ``reconcile_timeout``,
      the leadership gate and ``drain()`` hold for each worker.
    - ``dispatch_gate`` (``None``: none): a ``DispatchGate`` (``own_writes.OwnWrites`` is one)
      awaited before each parent is dispatched, and around its reconcile.
    - ``cache_sync_timeout`` (``DEFAULT_CACHE_SYNC_TIMEOUT``, 120 s; ``None``: wait forever):
      ``start()`` fails with ``ReconcileLoopError`` naming the source's last error when the store
      has not synced by then (a resource not served, refused by RBAC, a server unreachable), as
      controller-runtime's ``CacheSyncTimeout``.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn | None = None,
        reconcile: ReconcileFn,
        key_map: KeyMapFn | None = None,
        resync_period: float | None = DEFAULT_RESYNC_PERIOD,
        failure_base_delay: float = 1.0,
        failure_max_delay: float = 60.0,
        source_retry_delay: float = DEFAULT_SOURCE_RETRY_DELAY,
        clock: Clock | None = None,
        name: str | None = None,
        slow_reconcile_after: float = DEFAULT_SLOW_RECONCILE_AFTER,
        reconcile_timeout: float | None = None,
        metrics: MetricsProvider | CollectorRegistry | None = None,
        leadership: Leadership | None = None,
        dispatch_gate: DispatchGate | None = None,
        cache_sync_timeout: float | None = DEFAULT_CACHE_SYNC_TIMEOUT,
        max_concurrent_reconciles: int = 1,
        sources: Sequence[Watch] | None = None,
    ) -> None:
        watches = _watches(source, key_map, sources)
        self._cache_sync_timeout = (
            None
            if cache_sync_timeout is None
            else positive_finite("cache_sync_timeout", cache_sync_timeout)
        )
        self._workers_wanted = _worker_count(max_concurrent_reconciles)
        self._resync_period = optional_period("resync_period", resync_period)
        delay_range(
            "failure_base_delay", failure_base_delay, "failure_max_delay", failure_max_delay
        )
        source_retry_delay = positive_finite("source_retry_delay", source_retry_delay)
        self._slow_after = positive_finite("slow_reconcile_after", slow_reconcile_after)
        self._timeout = (
            None
            if reconcile_timeout is None
            else positive_finite("reconcile_timeout", reconcile_timeout)
        )
        self._event_loop = asyncio.get_running_loop()
        self._reporter = _status_reporter(watches[0].source)
        self.name = _loop_name(name, watches[0].source, self._reporter)
        self._log = NamedLogger(logger, self.name)
        if self._resync_period is not None and self._resync_period < MINIMUM_RESYNC_PERIOD:
            self._log.warning(
                "resync_period=%r is below the minimum of %ss; resyncing every %ss",
                resync_period,
                MINIMUM_RESYNC_PERIOD,
                MINIMUM_RESYNC_PERIOD,
            )
            self._resync_period = MINIMUM_RESYNC_PERIOD
        self._reconcile = reconcile
        self._clock: Clock = RealClock() if clock is None else clock
        self._leadership = leadership
        self._gate = dispatch_gate
        self._metrics = self._loop_metrics(_provider(metrics))
        self._queue: WorkQueue[ParentKey] = WorkQueue(
            on_added=None if self._metrics is None else self._metrics.added,
            one_worker_per_key=True,
        )
        self._sources: SourceSet | None = None
        self._driver: SourceStreamDriver | SourceSet
        if sources is None:
            self._source_name = watch_name(watches[0], 0)
            self._store = ObjectStore(key_map=key_map, name=self.name)
            self._driver = SourceStreamDriver(
                source=watches[0].source,
                store=self._store,
                on_affected=self._queue.add_all,
                retry_delay=source_retry_delay,
                clock=self._clock,
                name=self.name,
            )
        else:
            self._driver = self._sources = SourceSet(
                watches=watches,
                on_affected=self._queue.add_all,
                retry_delay=source_retry_delay,
                clock=self._clock,
                name=self.name,
                reporter_of=_status_reporter,
            )
            self._store = self._sources.cache()
        self._retries: RetryScheduler[ParentKey] = RetryScheduler(
            on_retry=self._queue.add,
            failure_base_delay=failure_base_delay,
            failure_max_delay=failure_max_delay,
            clock=self._clock,
            name=self.name,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._worker: asyncio.Task[None] | None = None
        """The first worker (the only one by default)."""
        self._slots = [_Slot() for _ in range(self._workers_wanted)]
        self._owner: asyncio.Task[Any] | None = None
        self._state = _Lifecycle()
        self._ended = asyncio.Event()
        self._torn_down = asyncio.Event()
        self.reconciles = 0
        self.reconcile_failures = 0
        self.reconcile_timeouts = 0
        self.terminal_failures = 0

    async def start(self) -> None:
        self._check_event_loop("start()")
        self._move(_Event.START)
        try:
            driver = self._spawn(self._driver.run(), "reconcile-source-driver")
            await self._wait_for_sync(driver)
            self._move(_Event.SYNCED)
            for number, slot in enumerate(self._slots, 1):
                name = "reconcile-worker" if number == 1 else f"reconcile-worker-{number}"
                slot.task = self._spawn(self._work(slot), name)
            self._worker = self._slots[0].task
            self._spawn(self._watch_reconciles(), "reconcile-watchdog")
            if self._resync_period is not None:
                self._spawn(self._resync(self._resync_period), "reconcile-resync")
        except BaseException:
            await self._shut_down()
            raise
        self._log.debug("started: synced, worker running")

    async def stop(self) -> None:
        """Cancels every task of the loop and waits for them; raises ``ReconcileLoopError`` if
        the loop had already stopped on its own."""
        current = asyncio.current_task()
        if any(slot.task is current for slot in self._slots):
            raise ReconcileLoopUsageError(_STOP_INSIDE_RECONCILE)
        if asyncio.get_running_loop() is not self._event_loop:
            if self._event_loop.is_closed():
                return
            self._check_event_loop("stop()")
        await self._shut_down()
        self._raise_error()

    async def drain(self) -> None:
        """Stops taking work: each worker finishes the reconcile in flight, if any, and takes no
        other; returns once they have. ``stop()`` then ends the rest. The queue is left undone, as a
        level-triggered loop may: the next start lists again. Go: CR ``Controller.Start`` shutting
        its queue down and waiting for its workers when its context ends."""
        self._move(_Event.DRAIN)
        self._queue.shutdown()
        busy = [slot.task for slot in self._slots if slot.parent is not None and slot.task]
        if busy:
            await asyncio.wait(busy)

    async def wait(self) -> None:
        """Waits until the loop stops: returns after ``stop()``, raises ``ReconcileLoopError`` if
        it stopped on its own. Go: ``Controller.Start`` blocking until it returns."""
        await self._ended.wait()
        self._raise_error()

    async def __aenter__(self) -> ReconcileLoop:
        await self.start()
        self._owner = asyncio.current_task()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        owner, cancelled_by_us = self._owner, self._state.cancelled_owner
        self._owner = None
        if cancelled_by_us and owner is not None:
            owner.uncancel()
            if exc_type is None:
                await _absorb_pending_cancellation(owner)
        await self._shut_down()
        ours = cancelled_by_us and exc_type is asyncio.CancelledError
        if exc_type is None or (ours and owner is not None and owner.cancelling() == 0):
            self._raise_error()

    def get_by_parent(self, parent: ParentKey) -> list[Any]:
        """The first source's objects of ``parent``; ``cache(name)`` reads the others."""
        return self._store.get_by_parent(parent)

    def parent_keys(self) -> set[ParentKey]:
        """The parents with a member in the first source's cache."""
        return self._store.parent_keys()

    def cache(self, name: str | None = None) -> CacheReader:
        """The cache of the watch named ``name`` (``None``: the first source's), read-only:
        ``get(key)``, ``get_by_parent(parent)``, ``parent_keys()``; ``KeyError`` naming the
        watches for an unknown name. A one-source loop's one watch is named for its source."""
        if self._sources is not None:
            return self._sources.cache(name)
        if name is not None and name != self._source_name:
            raise KeyError(f"no watch named {name!r}; the watches are {[self._source_name]}")
        return self._store

    def status(self) -> LoopStatus:
        """A frozen snapshot of the loop; costs O(parents waiting for a retry)."""
        now = self._clock.time()
        self._driver.sample(now)
        in_flight = tuple(
            sorted(
                (
                    ReconcileInFlight(slot.parent, slot.since, slot.slow_logged == slot.seq)
                    for slot in self._slots
                    if slot.parent is not None
                ),
                key=lambda running: running.started_at,
            )
        )
        retries = tuple(
            RetryStatus(retry.key, retry.failures, retry.due_at, retry.last_error)
            for retry in self._retries.pending()
        )
        return LoopStatus(
            name=self.name,
            taken_at=now,
            synced=self._driver.synced,
            source=self.source_status(),
            events_applied=self._driver.events_applied,
            reconciles=self.reconciles,
            reconcile_failures=self.reconcile_failures,
            queue_depth=len(self._queue),
            retries=retries,
            in_flight=in_flight[0] if in_flight else None,
            in_flight_all=in_flight,
            max_concurrent_reconciles=self._workers_wanted,
            terminal_failures=self.terminal_failures,
            reconcile_timeouts=self.reconcile_timeouts,
            stopped=self._state.phase is LoopPhase.STOPPED or self._state.error is not None,
            error=None if self._state.error is None else _summary(self._state.error),
            listings_applied=self._driver.listings_applied,
            watch_events_applied=self._driver.watch_events_applied,
            objects_stored=len(self._store),
            sources=self._watch_statuses(),
        )

    def _watch_statuses(self) -> tuple[WatchStatus, ...]:
        if self._sources is not None:
            return self._sources.statuses()
        assert isinstance(self._driver, SourceStreamDriver)
        return (
            watch_status(self._source_name, self._driver, self._store, self._reporter, self._clock),
        )

    def source_status(self) -> SourceStatus:
        """The source's own report if it is a ``StatusReporter``, else what the driver saw."""
        if self._reporter is not None:
            try:
                return self._reporter.source_status()
            except Exception as exc:
                status = self._driver.source_status()
                return _with_error(status, f"source_status() raised {exc!r}", self._clock)
        return self._driver.source_status()

    def in_flight_since(self) -> float | None:
        """When the oldest reconcile in flight started, on the loop's clock; ``None`` when no
        worker runs one."""
        starts = [slot.since for slot in self._slots if slot.parent is not None]
        return min(starts) if starts else None

    @property
    def max_concurrent_reconciles(self) -> int:
        return self._workers_wanted

    @property
    def phase(self) -> LoopPhase:
        """Where the loop is in its life."""
        return self._state.phase

    @property
    def leadership(self) -> Leadership | None:
        """What gates the worker (``leadership=``), ``None`` if it reconciles unconditionally."""
        return self._leadership

    def _check_event_loop(self, what: str) -> None:
        if asyncio.get_running_loop() is not self._event_loop:
            raise ReconcileLoopUsageError(
                f"{what} called on another event loop than the one this ReconcileLoop"
                f" ({self.name!r}) was constructed on; construct it inside the event loop that"
                " runs it (its retry poller already runs on the first one)"
            )

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._on_task_done)
        self._tasks.append(task)
        return task

    def _move(
        self, event: _Event, error: BaseException | None = None, cancelled_owner: bool = False
    ) -> None:
        self._state = _transition(self._state, event, error=error, cancelled_owner=cancelled_owner)
        if self._state.phase in (LoopPhase.DIED, LoopPhase.STOPPED):
            self._ended.set()
        if self._state.phase is LoopPhase.STOPPED:
            self._torn_down.set()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        phase = self._state.phase
        if phase in _ENDING or phase is LoopPhase.DIED:
            return
        drained = phase is LoopPhase.DRAINING and any(slot.task is task for slot in self._slots)
        if drained and not task.cancelled() and task.exception() is None:
            return
        if task.cancelled():
            error: BaseException = asyncio.CancelledError(f"{task.get_name()} was cancelled")
        else:
            error = task.exception() or RuntimeError(f"{task.get_name()} returned")
        owner = self._owner
        cancel_owner = owner is not None and not owner.done()
        self._move(_Event.DIE, error, cancel_owner)
        self._log.error("%s died, so the loop stops: %r", task.get_name(), error, exc_info=error)
        for other in self._tasks:
            other.cancel()
        self._queue.shutdown()
        self._retries.cancel()
        if cancel_owner and owner is not None:
            owner.cancel(f"reconcile loop {self.name!r} stopped: {error!r}")

    def _raise_error(self) -> None:
        error = self._state.error
        if error is not None:
            raise ReconcileLoopError(
                f"reconcile loop {self.name!r} stopped: {_summary(error)}"
            ) from error

    async def _wait_for_sync(self, driver: asyncio.Task[None]) -> None:
        timeout = self._cache_sync_timeout
        if timeout is None:
            synced, _ = await first_of(self._driver.wait_for_sync(), driver)
        else:
            synced, _, timer = await first_of(
                self._driver.wait_for_sync(), driver, self._clock.sleep(timeout)
            )
            if finished(timer) and not finished(synced):
                raise ReconcileLoopError(
                    f"reconcile loop {self.name!r}: timed out after {timeout:g}s waiting for the"
                    f" store to sync (cache_sync_timeout); {self._unsynced_errors()}"
                )
        error = self._state.error
        if synced.cancelled() or self._state.phase in _ENDING:
            if error is not None:
                raise ReconcileLoopError(
                    f"reconcile loop {self.name!r} stopped before the store synced:"
                    f" {_summary(error)}"
                ) from error
            raise RuntimeError("the loop was stopped before the store synced")

    def _unsynced_errors(self) -> str:
        """The last error of each source not synced yet: the one source's, or each by name."""
        if self._sources is None:
            last = self.source_status().last_error or "no error reported"
            return f"the source's last error: {last}"
        return "; ".join(
            f"source {watch.name!r} not synced, its last error:"
            f" {watch.source.last_error or 'no error reported'}"
            for watch in self._sources.statuses()
            if not watch.synced
        )

    async def _shut_down(self) -> None:
        if self._state.phase in _ENDING:
            await self._torn_down.wait()
            return
        self._move(_Event.STOP)
        try:
            for task in self._tasks:
                task.cancel()
            self._queue.shutdown()
            await self._retries.shutdown()
            if self._tasks:
                await asyncio.wait(self._tasks)
            self._log_crashed_tasks()
            await self._driver.aclose()
        finally:
            self._move(_Event.STOPPED)
            self._log.debug("stopped")

    def _log_crashed_tasks(self) -> None:
        for task in self._tasks:
            if task.cancelled() or task.exception() in (None, self._state.error):
                continue
            self._log.error("%s crashed while stopping: %r", task.get_name(), task.exception())

    def _loop_metrics(self, provider: MetricsProvider) -> LoopMetrics | None:
        if self._workers_wanted == 1:
            return provider.loop_metrics(
                self.name, clock=self._clock, source_status=self.source_status
            )
        return provider.loop_metrics(
            self.name,
            clock=self._clock,
            source_status=self.source_status,
            max_concurrent_reconciles=self._workers_wanted,
        )

    async def _work(self, slot: _Slot) -> None:
        queue, reconcile, now = self._queue, self._reconcile, time_function(self._clock)
        metrics, several = self._metrics, self._workers_wanted > 1
        task = asyncio.current_task()
        assert task is not None
        take = queue.get if self._leadership is None else self._take_while_leading
        gate = self._gate
        while (parent := await take()) is not None:
            if gate is not None:
                await gate.wait(parent)
            slot.seq = seq = slot.seq + 1
            slot.parent = parent
            slot.since = started = now()
            if metrics is not None:
                metrics.started(started)
            returned: object = None
            try:
                if gate is None:
                    returned = await reconcile(parent)
                else:
                    with gate.dispatching(parent):
                        returned = await reconcile(parent)
            except BaseException as exc:
                error: BaseException | None = exc
            else:
                error = None
            slot.parent = None
            timed_out = slot.timing_out == seq
            if timed_out:
                task.uncancel()
            if error is None:
                result = self._on_success(parent, returned)
            else:
                result = self._on_failure(parent, error, timed_out, task)
            queue.done(parent)
            if metrics is not None:
                if several:
                    metrics.finished(result, started_at=started)
                else:
                    metrics.finished(result)
            if result == "stopped" and error is not None:
                raise error
            self.reconciles += 1
            if queue:
                await asyncio.sleep(0)

    def _on_success(self, parent: ParentKey, returned: object) -> ReconcileResult:
        """Forgets the parent's failures; a ``Result`` with a delay queues it again after it (CR:
        ``Forget`` then ``AddAfter``)."""
        self._retries.note_success(parent)
        if returned is None:
            return "success"
        if isinstance(returned, Result):
            if returned.requeue_after:
                self._retries.requeue_after(parent, returned.requeue_after)
            return "success"
        self._log.warning(
            "reconcile of parent %r returned %s, neither None nor a Result: read as None",
            parent,
            describe(returned, 80),
        )
        return "success"

    async def _take_while_leading(self) -> ParentKey | None:
        """The next parent, returned only while ``leadership.is_leader()``: the check comes right
        before the dispatch. A parent taken once leadership was gone goes back to the queue and
        waits for the next term."""
        queue, leadership = self._queue, self._leadership
        assert leadership is not None
        while True:
            if not leadership.is_leader():
                await leadership.wait_until_leading()
            parent = await queue.get()
            if parent is None or leadership.is_leader():
                return parent
            queue.put_back(parent)

    def _on_failure(
        self, parent: ParentKey, error: BaseException, timed_out: bool, task: asyncio.Task[None]
    ) -> ReconcileResult:
        if isinstance(error, asyncio.CancelledError) and task.cancelling() > 0:
            return "stopped"
        if isinstance(error, _FATAL):
            self._log.critical(
                "reconcile of parent %r raised %r: the loop stops", parent, error, exc_info=error
            )
            return "stopped"
        self.reconcile_failures += 1
        if isinstance(error, TerminalError) and not timed_out:
            self.terminal_failures += 1
            self._retries.note_success(parent)
            self._log.error(
                "reconcile of parent %r failed terminally, not retried: %s",
                parent,
                _summary(error),
            )
            return "terminal"
        if timed_out:
            self.reconcile_timeouts += 1
            reason = f"timed out after reconcile_timeout={self._timeout}s and was cancelled"
            delay = self._retries.note_failure(parent, reason)
            self._log.error("reconcile of parent %r %s; %s", parent, reason, _retrying(delay))
        else:
            delay = self._retries.note_failure(parent, _summary(error))
            self._log.error(
                "reconcile of parent %r failed, %s: %r",
                parent,
                _retrying(delay),
                error,
                exc_info=error,
            )
        if self._metrics is not None and math.isfinite(delay):
            self._metrics.retried()
        return "timeout" if timed_out else "error"

    async def _watch_reconciles(self) -> None:
        """Logs a reconcile once it has run ``slow_reconcile_after``; cancels it at
        ``reconcile_timeout``; stamps the driver's last event time. Sleeps until the next
        deadline of the reconcile in flight, but never longer than ``SAMPLE_PERIOD`` or half the
        smaller threshold, so a reconcile that starts meanwhile is seen before its own first
        deadline, which is then met exactly; nor shorter than ``MINIMUM_WATCHDOG_SLEEP``, so a
        threshold below twice that is met up to that late instead of the watchdog spinning."""
        idle = min(self._slow_after / 2, (self._timeout or self._slow_after) / 2, SAMPLE_PERIOD)
        idle = max(idle, MINIMUM_WATCHDOG_SLEEP)
        clock, driver = self._clock, self._driver
        while True:
            now = clock.time()
            driver.sample(now)
            deadline = self._check_in_flight(now)
            await clock.sleep(idle if deadline is None else min(idle, deadline - now))

    def _check_in_flight(self, now: float) -> float | None:
        """Acts on every reconcile in flight; returns when one next needs looking at, if ever."""
        deadlines = [
            deadline
            for slot in self._slots
            if (deadline := self._check_slot(slot, now)) is not None
        ]
        return min(deadlines) if deadlines else None

    def _check_slot(self, slot: _Slot, now: float) -> float | None:
        """Acts on one worker's reconcile in flight; returns when it next needs looking at."""
        parent, seq = slot.parent, slot.seq
        if parent is None:
            return None
        age = now - slot.since
        if slot.slow_logged != seq and age >= self._slow_after:
            slot.slow_logged = seq
            self._log.warning(
                "reconcile of parent %r has run for %.3gs (slow_reconcile_after=%ss)%s",
                parent,
                age,
                self._slow_after,
                "" if self._timeout is None else f"; it is cancelled at {self._timeout}s",
            )
        if self._timeout is not None and slot.timing_out != seq and age >= self._timeout:
            slot.timing_out = seq
            if slot.task is not None:
                slot.task.cancel()
        deadlines = []
        if slot.slow_logged != seq:
            deadlines.append(slot.since + self._slow_after)
        if self._timeout is not None and slot.timing_out != seq:
            deadlines.append(slot.since + self._timeout)
        return min(deadlines) if deadlines else None

    async def _resync(self, period: float) -> None:
        while True:
            await self._clock.sleep(period)
            self._queue.add_all(self._all_parent_keys())

    def _all_parent_keys(self) -> set[ParentKey]:
        """Every parent with a member in any of the loop's caches (a resync re-delivers every
        cached object of every source, as controller-runtime's informers do)."""
        if self._sources is None:
            return self._store.parent_keys()
        keys: set[ParentKey] = set()
        for store in self._sources.stores():
            keys |= store.parent_keys()
        return keys


def _watches(
    source: SourceWatchFn | None, key_map: KeyMapFn | None, sources: Sequence[Watch] | None
) -> list[Watch]:
    """The loop's watches: ``source`` (with ``key_map``) as one, or ``sources``; a clear
    ``TypeError`` for neither, both, an empty list or a ``key_map`` beside ``sources``."""
    if sources is None:
        if source is None:
            raise TypeError("ReconcileLoop takes source= or sources=")
        return [Watch(source=source, key_map=key_map)]
    if source is not None:
        raise TypeError("ReconcileLoop takes source= or sources=, not both")
    if key_map is not None:
        raise TypeError("with sources=, each Watch carries its own key_map")
    watches = list(sources)
    if not watches:
        raise TypeError("sources= needs at least one Watch")
    for watch in watches:
        if not isinstance(watch, Watch):
            raise TypeError(f"sources= takes Watch values, got {type(watch).__name__}")
    return watches


def _provider(metrics: MetricsProvider | CollectorRegistry | None) -> MetricsProvider:
    if metrics is None:
        return NoMetrics()
    if isinstance(metrics, MetricsProvider):
        return metrics
    from miles.utils.workers.reconcile.metrics import ReconcileMetrics

    return ReconcileMetrics(metrics)


def _worker_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_concurrent_reconciles must be an int of at least 1, got {value!r}")
    return value


def _status_reporter(source: object) -> StatusReporter | None:
    for candidate in (source, getattr(source, "__self__", None)):
        if candidate is not None and isinstance(candidate, StatusReporter):
            return candidate
    return None


def _loop_name(name: str | None, source: object, reporter: object | None) -> str:
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        return name
    for candidate in (reporter, source, getattr(source, "__self__", None)):
        found = getattr(candidate, "name", None)
        if isinstance(found, str) and found:
            return found
    return DEFAULT_NAME


async def _absorb_pending_cancellation(owner: asyncio.Task[Any]) -> None:
    """Takes delivery of the cancellation the loop's death requested of a body that finished
    before it arrived; one from anyone else still propagates."""
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        if owner.cancelling() > 0:
            raise


def _retrying(delay: float) -> str:
    return f"retrying in {delay:.3g}s" if math.isfinite(delay) else "not retried: the loop stopped"


def _with_error(status: SourceStatus, error: str, clock: Clock) -> SourceStatus:
    return dataclasses.replace(status, last_error=error, last_error_at=clock.time())


def _summary(error: BaseException) -> str:
    return one_line(error, ERROR_SUMMARY_LIMIT)
