"""Read your own writes: a parent is not reconciled again until the cache holds what its last
reconcile wrote. Go: kubernetes ``pkg/controller/util/consistency.ConsistencyStore`` (KEP-5647).

The loop awaits ``wait(parent)`` before it dispatches a parent and runs the reconcile inside
``dispatching(parent)``; a write client calls ``wrote(resource_version)`` with the version each
write returned, which is recorded for the parent being reconciled. ``watching(source)`` wraps the
loop's source so that every event the store applies moves the store's version forward (client-go's
``LastStoreSyncResourceVersion``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.log import NamedLogger
from miles.utils.workers.reconcile.resource import Resource
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
    UpsertEvent,
)
from miles.utils.workers.reconcile.tasks import first_of

logger = logging.getLogger(__name__)

DEFAULT_BOUND = 300.0
"""How long a parent waits for the cache at most. KEP-5647's store has no bound (a parent waits,
requeued with backoff, until the informer catches up); this is ``ControllerExpectations``'
``ExpectationsTimeout`` (5 min), the older mechanism's bound, so that a stuck watch delays a
parent, never stops it."""

VersionOf = Callable[[Any], str | None]


class DispatchGate(Protocol):
    """What the loop asks before and around each reconcile of a parent."""

    async def wait(self, parent: ParentKey) -> None: ...

    def dispatching(self, parent: ParentKey) -> contextlib.AbstractContextManager[None]: ...


def resource_version_of(obj: Any) -> str | None:
    """``metadata.resourceVersion`` of a model (``metadata.resource_version``) or a JSON dict."""
    if isinstance(obj, Mapping):
        metadata = obj.get("metadata")
        value = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
    else:
        value = getattr(getattr(obj, "metadata", None), "resource_version", None)
    return value if isinstance(value, str) and value else None


def _as_int(version: str) -> int | None:
    # apimachinery's CompareResourceVersion: decimal digits without a leading zero, else no order
    if version.isdigit() and (version == "0" or not version.startswith("0")):
        return int(version)
    return None


@dataclass(frozen=True, slots=True)
class _Written:
    version: str
    number: int | None
    at: float


class OwnWrites:
    """Per parent, the newest version its reconciles wrote; the store's newest applied version;
    and the wait between them.

    Versions compare as integers where both parse (apimachinery's ``CompareResourceVersion``);
    a written version that does not parse is caught up once the store applies an object carrying
    it. A parent waits at most ``bound`` seconds after the write, then is dispatched with one
    warning line. A record is dropped once its parent is dispatched.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        bound: float = DEFAULT_BOUND,
        version_of: VersionOf = resource_version_of,
        name: str = "reconcile",
    ) -> None:
        self._bound = positive_finite("bound", bound)
        self._clock: Clock = RealClock() if clock is None else clock
        self._version_of = version_of
        self._log = NamedLogger(logger, name)
        self._written: dict[ParentKey, _Written] = {}
        self._current: ContextVar[ParentKey | None] = ContextVar("own_writes_parent", default=None)
        self._read: int | None = None
        self._read_strings: set[str] = set()
        self._progress: asyncio.Event | None = None
        self.waits = 0
        self.bound_passed = 0

    @property
    def store_version(self) -> int | None:
        """The newest integer version the store applied (``LastStoreSyncResourceVersion``)."""
        return self._read

    def wrote(self, resource_version: str | None, *, parent: ParentKey | None = None) -> None:
        """Records a write that returned ``resource_version``, for ``parent`` or else the parent
        being reconciled; a write outside any reconcile, or without a version, records nothing."""
        parent = self._current.get() if parent is None else parent
        if parent is None or not resource_version:
            return
        number = _as_int(resource_version)
        previous = self._written.get(parent)
        if previous is not None and _newer_or_same(previous, number):
            return
        at = self._clock.time()
        self._written[parent] = _Written(resource_version, number, at)

    def observer(self, *resources: Resource) -> Callable[[Resource, str], None]:
        """What a write client calls with each write's resource and resourceVersion
        (``client.Client(on_write=...)``): a write of one of ``resources`` (any, if none is
        given; the kinds the loop's cache holds, since the store's version moves only with them)
        is recorded for the parent being reconciled."""
        tracked = frozenset(resources)

        def wrote(resource: Resource, resource_version: str) -> None:
            if not tracked or resource in tracked:
                self.wrote(resource_version)

        return wrote

    def pending(self, parent: ParentKey) -> str | None:
        """The version ``parent`` still waits for, if any."""
        written = self._written.get(parent)
        return None if written is None or self._caught_up(written) else written.version

    @contextlib.contextmanager
    def dispatching(self, parent: ParentKey) -> Iterator[None]:
        token = self._current.set(parent)
        try:
            yield
        finally:
            self._current.reset(token)

    async def wait(self, parent: ParentKey) -> None:
        """Returns once the store holds ``parent``'s last write, or ``bound`` after the write."""
        written = self._written.get(parent)
        if written is None:
            return
        if not self._caught_up(written):
            self.waits += 1
            await self._wait_for(parent, written)
        if self._written.get(parent) is written:
            del self._written[parent]

    def observe(self, event: SourceEvent) -> None:
        """The store applied ``event``: its objects' versions move the store's version forward."""
        version_of = self._version_of
        if isinstance(event, UpsertEvent):
            self._applied(version_of(event.obj))
        elif isinstance(event, DeleteEvent):
            self._applied(version_of(event.last_obj))
        elif isinstance(event, ReplaceEvent):
            for obj in event.objects.values():
                self._applied(version_of(obj))

    def watching(self, source: SourceWatchFn) -> SourceWatchFn:
        """``source`` with every event observed as it is handed to the store: the loop's driver
        applies an event before it asks for the next, with no await between. The loop still
        finds the source's name and status (``ObservedSource.__self__``)."""
        return ObservedSource(self, source)

    async def _observed(self, events: AsyncIterator[SourceEvent]) -> AsyncIterator[SourceEvent]:
        try:
            async for event in events:
                self.observe(event)
                yield event
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    def _applied(self, version: str | None) -> None:
        if version is None:
            return
        number = _as_int(version)
        if number is None:
            if any(w.number is None and w.version == version for w in self._written.values()):
                self._read_strings.add(version)
                self._wake()
            return
        if self._read is None or number > self._read:
            self._read = number
            self._wake()

    def _caught_up(self, written: _Written) -> bool:
        if written.number is None:
            return written.version in self._read_strings
        return self._read is not None and self._read >= written.number

    def _wake(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    async def _wait_for(self, parent: ParentKey, written: _Written) -> None:
        deadline = written.at + self._bound
        while not self._caught_up(written):
            remaining = deadline - self._clock.time()
            if remaining <= 0:
                self.bound_passed += 1
                self._log.warning(
                    "%s: the cache still lacks this controller's write at resourceVersion %s "
                    "(store at %s) after %ss; reconciling it anyway",
                    parent,
                    written.version,
                    self._read,
                    self._bound,
                )
                return
            await self._progress_or_sleep(remaining)
        self._read_strings.discard(written.version)

    async def _progress_or_sleep(self, seconds: float) -> None:
        if self._progress is None:
            self._progress = asyncio.Event()
        await first_of(self._progress.wait(), self._clock.sleep(seconds))


class ObservedSource:
    """A source whose events an ``OwnWrites`` observes. ``__self__`` is what the wrapped source
    is bound to (or the source itself), where ``ReconcileLoop`` looks for a source's ``name`` and
    ``source_status`` (a reflector's ``watch`` is a bound method)."""

    def __init__(self, tracker: OwnWrites, source: SourceWatchFn) -> None:
        self._tracker = tracker
        self._source = source
        self.__self__ = getattr(source, "__self__", source)

    def __call__(self) -> AsyncIterator[SourceEvent]:
        return self._tracker._observed(self._source())


def _newer_or_same(previous: _Written, number: int | None) -> bool:
    return previous.number is not None and number is not None and previous.number >= number
