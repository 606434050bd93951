"""Lifecycle, the single worker and resync. Go: controller-runtime's internal ``Controller``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any

from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.object_store import KeyMapFn, ObjectStore
from miles.utils.workers.reconcile.retry_scheduler import RetryScheduler
from miles.utils.workers.reconcile.source_event import ParentKey, SourceWatchFn
from miles.utils.workers.reconcile.source_stream_driver import SourceStreamDriver
from miles.utils.workers.reconcile.work_queue import WorkQueue

logger = logging.getLogger(__name__)

DEFAULT_RESYNC_PERIOD = 36000.0
ReconcileFn = Callable[[ParentKey], Awaitable[None]]

_STOP_INSIDE_RECONCILE = (
    "stop() awaited inside reconcile would cancel the reconcile awaiting it; "
    "schedule it instead with asyncio.create_task(loop.stop())"
)


class ReconcileLoop:
    """Calls ``reconcile(parent)`` for every parent whose objects changed, one parent at a time.

    ``start`` returns once the store holds a whole listing; ``stop`` cancels every task of the loop
    and waits for them. Prefer ``async with loop:``. Construct it inside a running event loop.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn,
        reconcile: ReconcileFn,
        key_map: KeyMapFn | None = None,
        resync_period: float = DEFAULT_RESYNC_PERIOD,
        failure_base_delay: float = 1.0,
        failure_max_delay: float = 60.0,
        source_retry_delay: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        self._reconcile = reconcile
        self._resync_period = resync_period
        self._clock: Clock = RealClock() if clock is None else clock
        self._store = ObjectStore(key_map=key_map)
        self._queue: WorkQueue[ParentKey] = WorkQueue()
        self._retries: RetryScheduler[ParentKey] = RetryScheduler(
            on_retry=self._queue.add,
            failure_base_delay=failure_base_delay,
            failure_max_delay=failure_max_delay,
            clock=self._clock,
        )
        self._driver = SourceStreamDriver(
            source=source,
            store=self._store,
            on_affected=self._queue.add_all,
            retry_delay=source_retry_delay,
            clock=self._clock,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._worker: asyncio.Task[None] | None = None
        self._started = False
        self._stopping = False
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        if self._started or self._stopping:
            raise RuntimeError("start() may be called once per ReconcileLoop, before stop()")
        self._started = True
        try:
            driver = self._spawn(self._driver.run(), "reconcile-source-driver")
            await self._wait_for_sync(driver)
            self._worker = self._spawn(self._work(), "reconcile-worker")
            if self._resync_period > 0:
                self._spawn(self._resync(), "reconcile-resync")
        except BaseException:
            await self._shut_down()
            raise

    async def stop(self) -> None:
        if self._worker is not None and asyncio.current_task() is self._worker:
            raise AssertionError(_STOP_INSIDE_RECONCILE)
        await self._shut_down()

    async def __aenter__(self) -> ReconcileLoop:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def get_by_parent(self, parent: ParentKey) -> list[Any]:
        return self._store.get_by_parent(parent)

    def parent_keys(self) -> set[ParentKey]:
        return self._store.parent_keys()

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._tasks.append(task)
        return task

    async def _wait_for_sync(self, driver: asyncio.Task[None]) -> None:
        synced = asyncio.create_task(self._driver.wait_for_sync())
        try:
            await asyncio.wait([synced, driver], return_when=asyncio.FIRST_COMPLETED)
        finally:
            synced.cancel()
            await asyncio.wait([synced])
        if synced.cancelled() or self._stopping:
            raise RuntimeError("the loop was stopped before the store synced")

    async def _shut_down(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
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
            self._stopped.set()

    def _log_crashed_tasks(self) -> None:
        for task in self._tasks:
            if not task.cancelled() and task.exception() is not None:
                logger.error("%s crashed: %r", task.get_name(), task.exception())

    async def _work(self) -> None:
        queue, reconcile, retries = self._queue, self._reconcile, self._retries
        while (parent := await queue.get()) is not None:
            try:
                await reconcile(parent)
            except asyncio.CancelledError as exc:
                if _being_cancelled():
                    raise
                self._note_failure(parent, exc)
            except Exception as exc:
                self._note_failure(parent, exc)
            else:
                retries.note_success(parent)
            await asyncio.sleep(0)

    def _note_failure(self, parent: ParentKey, exc: BaseException) -> None:
        logger.error("reconcile of parent %r failed, backing off: %r", parent, exc, exc_info=exc)
        self._retries.note_failure(parent)

    async def _resync(self) -> None:
        while True:
            await self._clock.sleep(self._resync_period)
            self._queue.add_all(self._store.parent_keys())


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
