"""``FloorLoop``: the work of ``ReconcileLoop`` by the simplest correct hand-written code, the floor
``bench/pipeline.py`` measures ours against.

Go counterpart: none (a benchmark baseline: a dict store with a parent index, an insertion-ordered
dedup queue and one consumer).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ObjectKey,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
    UpsertEvent,
)

logger = logging.getLogger(__name__)

ReconcileFn = Callable[[ParentKey], Awaitable[None]]
KeyMapFn = Callable[[Any], ParentKey | None]


class FloorLoop:
    """The same work as ``ReconcileLoop`` by the simplest correct hand-written code.

    Same semantics: the store is written before the parent is queued; a queued parent keeps its
    place; a move queues both parents; a delete of an unknown key queues ``key_map(last_obj)``; a
    replace queues every parent with members afterwards plus every parent left empty; a stream
    that does not open with a replace is reopened; a failed reconcile is retried.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn,
        reconcile: ReconcileFn,
        key_map: KeyMapFn,
        retry_delay: float = 1.0,
    ) -> None:
        self._source = source
        self._reconcile = reconcile
        self._key_map = key_map
        self._retry_delay = retry_delay
        self._parent_of: dict[ObjectKey, ParentKey] = {}
        self._members: dict[ParentKey, dict[ObjectKey, Any]] = {}
        self._queue: deque[ParentKey] = deque()
        self._queued: set[ParentKey] = set()
        self._wakeup = asyncio.Event()
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def get_by_parent(self, parent: ParentKey) -> list[Any]:
        members = self._members.get(parent)
        if not members:
            return []
        return [members[key] for key in sorted(members)]

    def parent_keys(self) -> set[ParentKey]:
        return set(self._members)

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._work())]
        await self._synced.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _pump(self) -> None:
        while True:
            stream = self._source()
            try:
                first = await anext(stream)
                if isinstance(first, ReplaceEvent):
                    self._replace(first.objects)
                    async for event in stream:
                        self._apply(event)
            except Exception:
                logger.exception("floor: source stream failed")
            finally:
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()
            await asyncio.sleep(self._retry_delay)

    async def _work(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            parent = self._queue.popleft()
            self._queued.discard(parent)
            try:
                await self._reconcile(parent)
            except Exception:
                logger.exception("floor: reconcile of %r failed", parent)
                asyncio.get_running_loop().call_later(self._retry_delay, self._enqueue, parent)

    def _enqueue(self, parent: ParentKey) -> None:
        if parent in self._queued:
            return
        self._queued.add(parent)
        self._queue.append(parent)
        self._wakeup.set()

    def _apply(self, event: SourceEvent) -> None:
        if isinstance(event, UpsertEvent):
            self._upsert(event.key, event.obj)
        elif isinstance(event, DeleteEvent):
            self._delete(event.key, event.last_obj)
        else:
            self._replace(event.objects)

    def _upsert(self, key: ObjectKey, obj: Any) -> None:
        parent = self._parent_for(key, obj)
        previous = self._parent_of.get(key)
        if previous is not None and previous != parent:
            self._unlink(key, previous)
            self._enqueue(previous)
        if parent is None:
            self._parent_of.pop(key, None)
            return
        self._parent_of[key] = parent
        members = self._members.get(parent)
        if members is None:
            self._members[parent] = {key: obj}
        else:
            members[key] = obj
        self._enqueue(parent)

    def _delete(self, key: ObjectKey, last_obj: Any) -> None:
        parent = self._parent_of.pop(key, None)
        if parent is None:
            parent = self._parent_for(key, last_obj)
        else:
            self._unlink(key, parent)
        if parent is not None:
            self._enqueue(parent)

    def _replace(self, objects: Mapping[ObjectKey, Any]) -> None:
        before = self._members
        self._parent_of = {}
        self._members = {}
        for key, obj in objects.items():
            parent = self._parent_for(key, obj)
            if parent is None:
                continue
            self._parent_of[key] = parent
            members = self._members.get(parent)
            if members is None:
                self._members[parent] = {key: obj}
            else:
                members[key] = obj
        for parent in self._members.keys() | before.keys():
            self._enqueue(parent)
        self._synced.set()

    def _parent_for(self, key: ObjectKey, obj: Any) -> ParentKey | None:
        try:
            return self._key_map(obj)
        except Exception as exc:
            logger.error("floor: key_map raised for %r: %r", key, exc)
            return None

    def _unlink(self, key: ObjectKey, parent: ParentKey) -> None:
        members = self._members[parent]
        del members[key]
        if not members:
            del self._members[parent]
