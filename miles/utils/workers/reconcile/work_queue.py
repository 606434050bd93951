"""Insertion-ordered dedup queue with a wakeup.
Go: ``k8s.io/client-go/util/workqueue`` ``Typed``."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys waiting for a worker, each at most once, in the order they were first added.

    A key added while queued keeps its place. ``get`` waits for a key and returns ``None`` once
    the queue is shut down, even if keys are left. Every operation is O(1): a deque holds the
    order and a set the membership, since taking the first key of a plain dict scans past every
    slot deleted before it.

    With ``one_worker_per_key=True``, Go's guarantee for several workers (``Typed``'s dirty and
    processing sets): a key ``get`` handed out is *processing* until ``done(key)``, and no other
    ``get`` returns it meanwhile. A key added while it is processing is queued (dirty) as usual,
    but a ``get`` that reaches it
    first sets it aside, and ``done`` queues it again at the back; so a key changed during its
    reconcile runs again after it, never beside it. With one worker, which calls ``done`` before
    its next ``get``, nothing is ever set aside and the order is the order of first adds.
    Without it (the default, the original's queue, which has no ``done``), a key taken can be
    handed out again as soon as it is added again.

    ``adds`` counts keys that entered the queue (a key already queued does not count, as in Go's
    ``workqueue_adds_total``). Given ``on_added``, the queue tells it how many keys entered after
    each ``add_all`` that queued one (Go: ``queueMetrics.add``); without it, adding calls nothing.
    """

    def __init__(
        self,
        *,
        on_added: Callable[[int], None] | None = None,
        one_worker_per_key: bool = False,
    ) -> None:
        self._one_worker_per_key = one_worker_per_key
        self._order: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._set_aside: set[K] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self._shut_down = False
        self._on_added = on_added
        self._taken = 0

    def add(self, key: K) -> None:
        self.add_all((key,))

    def add_all(self, keys: Iterable[K]) -> None:
        """Queues each key not yet queued, in iteration order; wakes the waiters at most once."""
        if self._shut_down:
            return
        queued, order, on_added = self._queued, self._order, self._on_added
        before = len(queued)
        for key in keys:
            if key not in queued:
                queued.add(key)
                order.append(key)
        if on_added is not None and len(queued) > before:
            on_added(len(queued) - before)
        if order and self._waiters:
            self._wake()

    @property
    def adds(self) -> int:
        return self._taken + len(self._queued)

    async def get(self) -> K | None:
        """The oldest queued key no worker is processing, now processing until ``done(key)``."""
        while not self._shut_down:
            key = self._take()
            if key is not None:
                return key
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    self._waiters.remove(waiter)
                elif self._order:
                    self._wake()
        return None

    def done(self, key: K) -> None:
        """The worker has finished with ``key``: another ``get`` may hand it out again, and if it
        was added meanwhile it goes to the back of the queue. Go: ``Typed.Done``."""
        self._processing.discard(key)
        if key in self._set_aside:
            self._set_aside.discard(key)
            self._order.append(key)
            if self._waiters:
                self._wake()

    def put_back(self, key: K) -> None:
        """Returns a key ``get`` handed out but nobody worked on to the front, as if it had not
        been taken: it keeps its place and is not counted or reported as added again. Go: none;
        the loop's leadership gate, which takes a key and then finds itself no longer leading."""
        self._processing.discard(key)
        if key in self._set_aside:
            self._set_aside.discard(key)
            self._order.appendleft(key)
        if self._shut_down or key in self._queued:
            return
        self._queued.add(key)
        self._order.appendleft(key)
        self._taken -= 1
        if self._waiters:
            self._wake()

    def shutdown(self) -> None:
        self._shut_down = True
        if self._waiters:
            self._wake()

    def processing(self) -> frozenset[K]:
        """The keys handed out and not yet ``done``."""
        return frozenset(self._processing)

    def __len__(self) -> int:
        return len(self._queued)

    def _take(self) -> K | None:
        order, processing = self._order, self._processing
        while order:
            key = order.popleft()
            if self._one_worker_per_key:
                if key in processing:
                    self._set_aside.add(key)
                    continue
                processing.add(key)
            self._queued.discard(key)
            self._taken += 1
            return key
        return None

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
