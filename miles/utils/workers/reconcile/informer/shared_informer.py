"""One watch and one store shared by every loop that reads them.
Go: client-go ``tools/cache.SharedIndexInformer`` (its listeners and ``AddEventHandler``).

A ``SharedInformer`` keeps one source stream open (one LIST and one WATCH at a time, however many
subscribe) and holds its objects once. ``subscribe()`` hands each loop a ``SourceWatchFn`` of its
own, so the loop does not change: ``ReconcileLoop(source=informer.subscribe(), key_map=...)``.
Each opened subscription stream begins with a ``ReplaceEvent`` of the shared store as it is once
the informer has synced, then carries every event the informer applies after it; a loop added
after the sync therefore sees the cache as adds (client-go replays ``indexer.List()`` as adds with
``isInInitialList``), and each loop's own ``ObjectStore`` is only its parent index over the shared
objects (the same Python objects, never copies). A relist reaches every subscriber as the
informer's ``ReplaceEvent``.

A subscriber's buffer grows without bound, as client-go's listener buffer does: a slow loop never
stalls the watch or the other loops (kube-rs' shared stream applies backpressure instead).
The informer's stream runs from the first subscription opened until ``aclose()``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from typing import Any

from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.log import NamedLogger
from miles.utils.workers.reconcile.object_store import Affected
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ObjectKey,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
    UpsertEvent,
)
from miles.utils.workers.reconcile.source_stream_driver import SourceStreamDriver
from miles.utils.workers.reconcile.status import SourceStatus

logger = logging.getLogger(__name__)

_NONE: Affected = frozenset()


class _Listener:
    """One open subscription stream: the events applied since it opened, not yet read."""

    def __init__(self) -> None:
        self.events: collections.deque[SourceEvent] = collections.deque()
        self.wake = asyncio.Event()

    def push(self, event: SourceEvent) -> None:
        self.events.append(event)
        self.wake.set()


class _SharedStore:
    """The informer's one store: objects by key, each event passed on to every listener."""

    def __init__(self) -> None:
        self.objects: dict[ObjectKey, Any] = {}
        self.listeners: list[_Listener] = []
        self.replaces = 0

    def handle_event(self, event: SourceEvent) -> Affected:
        if isinstance(event, UpsertEvent):
            self.objects[event.key] = event.obj
        elif isinstance(event, DeleteEvent):
            self.objects.pop(event.key, None)
        elif isinstance(event, ReplaceEvent):
            self.objects = dict(event.objects)
            self.replaces += 1
        else:
            raise TypeError(f"not a source event: {type(event).__name__}")
        for listener in self.listeners:
            listener.push(event)
        return _NONE

    def __len__(self) -> int:
        return len(self.objects)


class Subscription:
    """A ``SourceWatchFn`` over a ``SharedInformer``, one per loop; a ``StatusReporter`` of the
    informer's source (the shared watch's phase, cursor, errors)."""

    def __init__(self, informer: SharedInformer, name: str) -> None:
        self._informer = informer
        self.name = name

    def __call__(self) -> AsyncIterator[SourceEvent]:
        return self._informer._open()

    def source_status(self) -> SourceStatus:
        return self._informer.source_status()


class SharedInformer:
    """One ``source`` (e.g. ``KubernetesReflector(...).watch``) shared by every subscriber.

    ``name`` prefixes its log lines; ``retry_delay`` and ``clock`` are its driver's (the source is
    reopened after a failure as a loop reopens its own). ``get(key)``, ``len()`` and ``keys()`` read
    the shared store; ``synced`` says whether it holds a listing yet.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn,
        name: str,
        clock: Clock | None = None,
        retry_delay: float = 1.0,
    ) -> None:
        self.name = name
        self._store = _SharedStore()
        self._driver = SourceStreamDriver(
            source=source,
            store=self._store,
            on_affected=_ignore,
            retry_delay=retry_delay,
            clock=clock or RealClock(),
            name=name,
        )
        self._log = NamedLogger(logger, name)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.subscriptions = 0
        self.streams_opened = 0

    def subscribe(self, name: str | None = None) -> Subscription:
        """A source for one more loop; ``name`` (default the informer's) names that loop."""
        if self._closed:
            raise RuntimeError(f"shared informer {self.name!r} is closed: nothing can subscribe")
        self.subscriptions += 1
        return Subscription(self, name or self.name)

    @property
    def synced(self) -> bool:
        return self._driver.synced

    def get(self, key: ObjectKey) -> Any | None:
        return self._store.objects.get(key)

    def keys(self) -> AbstractSet[ObjectKey]:
        return self._store.objects.keys()

    def __len__(self) -> int:
        return len(self._store)

    def source_status(self) -> SourceStatus:
        return self._driver.source_status()

    async def aclose(self) -> None:
        """Stops the shared stream; subscription streams opened later fail."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        await self._driver.aclose()

    async def _open(self) -> AsyncIterator[SourceEvent]:
        if self._closed:
            raise RuntimeError(
                f"shared informer {self.name!r} is closed: the subscription cannot open"
            )
        self._start()
        self.streams_opened += 1
        await self._driver.wait_for_sync()
        listener = _Listener()
        listeners = self._store.listeners
        listeners.append(listener)
        try:
            yield ReplaceEvent(objects=dict(self._store.objects))
            while True:
                while listener.events:
                    yield listener.events.popleft()
                listener.wake.clear()
                await listener.wake.wait()
        finally:
            listeners.remove(listener)

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._driver.run(), name=f"informer-{self.name}")
            self._task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._log.error("the shared stream died: %r", task.exception())


def _ignore(parents: AbstractSet[ParentKey]) -> None:
    """The informer wakes no parents itself: each subscriber's loop maps its own."""
