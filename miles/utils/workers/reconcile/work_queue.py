"""Insertion-ordered dedup queue with a wakeup. Go: ``k8s.io/client-go/util/workqueue`` ``Type``."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys waiting for the worker, each at most once, in the order they were first added.

    A key added while queued keeps its place. ``get`` waits for a key and returns ``None`` once
    the queue is shut down, even if keys are left. Every operation is O(1): a deque holds the
    order and a set the membership, since taking the first key of a plain dict scans past every
    slot deleted before it.

    ``adds`` counts keys that entered the queue (a key already queued does not count, as in Go's
    ``workqueue_adds_total``). Given ``on_added``, the queue tells it how many keys entered after
    each ``add_all`` that queued one (Go: ``queueMetrics.add``); without it, adding calls nothing.
    """

    def __init__(self, *, on_added: Callable[[int], None] | None = None) -> None:
        self._order: deque[K] = deque()
        self._queued: set[K] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._shut_down = False
        self._on_added = on_added
        self._taken = 0

    def add(self, key: K) -> None:
        self.add_all((key,))

    def add_all(self, keys: Iterable[K]) -> None:
        """Queues each key not yet queued, in iteration order; wakes the waiter at most once."""
        if self._shut_down:
            return
        queued, order, on_added = self._queued, self._order, self._on_added
        before = len(order)
        for key in keys:
            if key not in queued:
                queued.add(key)
                order.append(key)
        if on_added is not None and len(order) > before:
            on_added(len(order) - before)
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
                return key
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return None

    def put_back(self, key: K) -> None:
        """Returns a key ``get`` handed out but nobody worked on to the front, as if it had not
        been taken: it keeps its place and is not counted or reported as added again. Go: none;
        the loop's leadership gate, which takes a key and then finds itself no longer leading."""
        if self._shut_down or key in self._queued:
            return
        self._queued.add(key)
        self._order.appendleft(key)
        self._taken -= 1
        if self._waiter is not None:
            self._wake()

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
