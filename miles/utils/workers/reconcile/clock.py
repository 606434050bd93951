"""Time as a dependency. Go: ``k8s.io/utils/clock`` and its ``testing.FakeClock``."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The running event loop's monotonic time."""

    def time(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def time_function(clock: Clock) -> Callable[[], float]:
    """``clock.time`` to call in a hot loop on the running event loop: for a ``RealClock``, that
    loop's own ``time`` method, the same reading without looking the loop up on every call, or
    ``time.monotonic`` itself where the loop's ``time`` is asyncio's own, which returns just that.
    """
    if type(clock) is not RealClock:
        return clock.time
    loop = asyncio.get_running_loop()
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class FakeClock:
    """Time that moves only when a test calls :meth:`advance`.

    ``sleep`` parks on a future until ``advance`` moves time to or past its deadline; ``advance``
    releases due sleepers one at a time, in deadline order, and lets each run until the event loop
    is idle before releasing the next, so everything that became due has run when it returns.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wakeup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), wakeup))
        await wakeup

    async def advance(self, seconds: float) -> None:
        target = self._now + seconds
        await settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, wakeup = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not wakeup.done():
                wakeup.set_result(None)
                await settle()
        self._now = target
        await settle()

    @property
    def sleepers(self) -> int:
        """Sleepers still parked, cancelled ones excluded."""
        return sum(1 for _, _, wakeup in self._sleepers if not wakeup.done())


async def settle(rounds: int = 50) -> None:
    """Let every ready callback run: yield to the event loop until it has nothing left to do."""
    loop = asyncio.get_running_loop()
    for _ in range(rounds):
        await asyncio.sleep(0)
        if not _has_ready_callbacks(loop):
            return


def _has_ready_callbacks(loop: asyncio.AbstractEventLoop) -> bool:
    ready = getattr(loop, "_ready", None)
    return bool(ready)
