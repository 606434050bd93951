"""Test doubles for the runtime core: a scripted source stream, a recording reconcile and a
switchable leadership."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)


@dataclass(frozen=True)
class Pod:
    """A minimal object: a name and the parent label ``key_map`` reads."""

    name: str
    parent: str | None = None
    version: int = 0


def parent_of(pod: Pod) -> ParentKey | None:
    return pod.parent


def fake_loop(source: Any, reconcile: Any, clock: FakeClock, **kwargs: Any) -> ReconcileLoop:
    """A ``ReconcileLoop`` over test doubles, keyed by ``parent_of``; keywords pass through."""
    return ReconcileLoop(
        source=source, reconcile=reconcile, key_map=parent_of, clock=clock, **kwargs
    )


def upsert(pod: Pod) -> UpsertEvent:
    return UpsertEvent(key=pod.name, obj=pod)


def delete(pod: Pod) -> DeleteEvent:
    return DeleteEvent(key=pod.name, last_obj=pod)


def replace(*pods: Pod) -> ReplaceEvent:
    return ReplaceEvent(objects={pod.name: pod for pod in pods})


class _End:
    """Ends the open stream cleanly."""


@dataclass
class FakeSource:
    """A ``SourceWatchFn`` whose streams read one shared script of events.

    Each call opens a new stream; whatever is pushed goes to the stream open at that moment (or
    the next one). ``end()`` ends the open stream, ``fail(exc)`` makes it raise, and anything else
    pushed is yielded as is, garbage included. ``failing_opens`` makes the next calls raise.
    """

    failing_opens: int = 0
    opened: int = 0
    closed: int = 0
    _script: asyncio.Queue[object] = field(default_factory=asyncio.Queue)

    def __call__(self) -> AsyncIterator[SourceEvent]:
        if self.failing_opens:
            self.failing_opens -= 1
            raise ConnectionError("source factory refused")
        self.opened += 1
        return self._stream()

    def push(self, *items: object) -> None:
        for item in items:
            self._script.put_nowait(item)

    def end(self) -> None:
        self._script.put_nowait(_End())

    def fail(self, exc: BaseException) -> None:
        self._script.put_nowait(exc)

    async def _stream(self) -> AsyncIterator[SourceEvent]:
        try:
            while True:
                item = await self._script.get()
                if isinstance(item, _End):
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            self.closed += 1


@dataclass
class Recorder:
    """A reconcile that records each parent it is called for, and can be told to fail."""

    calls: list[ParentKey] = field(default_factory=list)
    failing: dict[ParentKey, BaseException] = field(default_factory=dict)

    async def __call__(self, parent: ParentKey) -> None:
        self.calls.append(parent)
        exc = self.failing.get(parent)
        if exc is not None:
            raise exc


class Switch:
    """A leadership a test turns on and off."""

    def __init__(self, leading: bool = False) -> None:
        self.leading = leading
        self._changed = asyncio.Event()

    def is_leader(self) -> bool:
        return self.leading

    async def wait_until_leading(self) -> None:
        while not self.leading:
            await self._changed.wait()

    def set(self, leading: bool) -> None:
        self.leading = leading
        self._changed.set()
        self._changed = asyncio.Event()


async def run_until(condition: Callable[[], bool], *, rounds: int = 100_000) -> None:
    """Yields to the event loop until ``condition()`` holds; fails instead of hanging."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"condition still false after {rounds} event-loop rounds")
