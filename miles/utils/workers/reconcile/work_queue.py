"""Insertion-ordered dedup queue with a wakeup. Go: ``k8s.io/client-go/util/workqueue`` ``Type``."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from miles.utils.workers.reconcile.clock import Clock, time_function

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys waiting for the worker, each at most once, in the order they were first added.

    A key added while queued keeps its place. ``get`` waits for a key and returns ``None`` once
    the queue is shut down, even if keys are left. Every operation is O(1): a deque holds the
    order and a set the membership, since taking the first key of a plain dict scans past every
    slot deleted before it.

    ``adds`` counts keys that entered the queue (a key already queued does not count, as in Go's
    ``workqueue_adds_total``). Given a ``clock`` (construct it on the event loop that uses it), the
    queue also notes when each key entered: ``added_at`` is that time for the key ``get`` last
    returned (for Go's ``workqueue_queue_duration_seconds``); without one it stays 0 and costs
    nothing.
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._order: deque[K] = deque()
        self._queued: set[K] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._shut_down = False
        self._now = None if clock is None else time_function(clock)
        self._added_at: deque[float] = deque()
        self._taken = 0
        self.added_at = 0.0

    def add(self, key: K) -> None:
        self.add_all((key,))

    def add_all(self, keys: Iterable[K]) -> None:
        """Queues each key not yet queued, in iteration order; wakes the waiter at most once."""
        if self._shut_down:
            return
        queued, order, now = self._queued, self._order, self._now
        before = len(order)
        for key in keys:
            if key not in queued:
                queued.add(key)
                order.append(key)
        if now is not None and len(order) > before:
            self._added_at.extend((now(),) * (len(order) - before))
        if order and self._waiter is not None:
            self._wake()

    @property
    def adds(self) -> int:
        return self._taken + len(self._order)

    async def get(self) -> K | None:
        while not self._shut_down:
            if self._order:
                key = self._order.popleft()
                self._queued.discard(key)
                self._taken += 1
                if self._now is not None:
                    self.added_at = self._added_at.popleft()
                return key
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return None

    def shutdown(self) -> None:
        self._shut_down = True
        if self._waiter is not None:
            self._wake()

    def __len__(self) -> int:
        return len(self._order)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
