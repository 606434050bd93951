"""What ``bench/pipeline.py`` drives: ours, ours with metrics and the floor behind one protocol, the
source that feeds them and the reconcile that signals the bench.

Go counterpart: none (benchmark contenders).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from bench.pipeline_floor import FloorLoop, ReconcileFn
from bench.pipeline_workload import Pod, parent_of
from miles.utils.workers.reconcile.clock import RealClock
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import (
    ObjectKey,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
)

Now = Callable[[], float]


class Pipeline(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def get_by_parent(self, parent: ParentKey) -> list[Any]: ...


PipelineFactory = Callable[[SourceWatchFn, ReconcileFn], Pipeline]


def ours(source: SourceWatchFn, reconcile: ReconcileFn) -> Pipeline:
    return ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=RealClock())


def ours_with_metrics(source: SourceWatchFn, reconcile: ReconcileFn) -> Pipeline:
    from prometheus_client import CollectorRegistry

    return ReconcileLoop(
        source=source,
        reconcile=reconcile,
        key_map=parent_of,
        clock=RealClock(),
        metrics=CollectorRegistry(),
    )


def floor(source: SourceWatchFn, reconcile: ReconcileFn) -> Pipeline:
    return FloorLoop(source=source, reconcile=reconcile, key_map=parent_of)


IMPLEMENTATIONS: dict[str, PipelineFactory] = {
    "ours": ours,
    "floor": floor,
    "metrics": ours_with_metrics,
}
"""``metrics`` is ours with a Prometheus registry: its cost against ``ours`` is the overhead."""


class Feed:
    """The source: a whole-world listing, then every batch the bench emits, in order."""

    def __init__(self, world: Mapping[ObjectKey, Pod], *, streamed: bool, now: Now) -> None:
        self._world = world
        self._streamed = streamed
        self._now = now
        self._batches: asyncio.Queue[Sequence[SourceEvent]] = asyncio.Queue()
        self.emitted_at = 0.0

    def emit(self, batch: Sequence[SourceEvent]) -> None:
        self._batches.put_nowait(batch)

    async def watch(self) -> AsyncIterator[SourceEvent]:
        yield ReplaceEvent(self._world)
        while True:
            batch = await self._batches.get()
            if len(batch) == 1:
                self.emitted_at = self._now()
                yield batch[0]
            elif self._streamed:
                for event in batch:
                    yield event
                    await asyncio.sleep(0)
            else:
                for event in batch:
                    yield event


class Probe:
    """The reconcile both pipelines call: reads a parent's members, signals the bench."""

    def __init__(self, *, now: Now) -> None:
        self.read: Callable[[ParentKey], list[Any]] = lambda parent: []
        self.reconciles = 0
        self.objects_read = 0
        self._now = now
        self._pending: set[ParentKey] = set()
        self._target: ParentKey | None = None
        self._reached: asyncio.Future[float] | None = None

    def expect_all(self, parents: set[ParentKey]) -> asyncio.Future[float]:
        """Resolves, with the time it started, once each of ``parents`` has been reconciled."""
        self._pending = set(parents)
        self._target = None
        return self._arm()

    def expect(self, parent: ParentKey) -> asyncio.Future[float]:
        """Resolves with the time the next reconcile of ``parent`` started."""
        self._pending = set()
        self._target = parent
        return self._arm()

    def _arm(self) -> asyncio.Future[float]:
        self._reached = asyncio.get_running_loop().create_future()
        return self._reached

    async def reconcile(self, parent: ParentKey) -> None:
        started = self._now()
        self.reconciles += 1
        self.objects_read += len(self.read(parent))
        reached = self._reached
        if reached is None:
            return
        if self._pending:
            self._pending.discard(parent)
            if self._pending:
                return
        elif parent != self._target:
            return
        self._reached = None
        reached.set_result(started)
