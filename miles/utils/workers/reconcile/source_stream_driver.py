"""Open, sync, reopen the source stream; pump it into the store. Go: informer ``processLoop``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.backoff import Backoff
from miles.utils.workers.reconcile.clock import Clock
from miles.utils.workers.reconcile.log import NamedLogger, describe
from miles.utils.workers.reconcile.object_store import Affected
from miles.utils.workers.reconcile.source_event import (
    SOURCE_EVENT_TYPES,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
)
from miles.utils.workers.reconcile.status import SourcePhase, SourceStatus

logger = logging.getLogger(__name__)

_REPR_LIMIT = 200
RELIST_ON_REOPEN = "stream reopened"
RELIST_IN_STREAM = "replace in stream"


class EventSink(Protocol):
    """What the driver writes events into: an ``ObjectStore``, or a shared informer's store."""

    replaces: int
    """Whole-world replaces applied so far."""

    def handle_event(self, event: SourceEvent) -> Affected: ...

    def __len__(self) -> int: ...


class SourceStreamDriver:
    """Keeps one stream from ``source`` open and applies each event to ``store``, then notifies.

    The store is written before ``on_affected`` hears of the parents, so a reconcile always reads
    the event that woke it. A stream must open with a ``ReplaceEvent``; one that does not, ends,
    raises, or cannot be opened is logged and reopened after a backoff step, forever: the steps
    start at ``retry_delay`` (finite and positive, else ``ValueError``) and double with jitter up
    to 30 s, starting over after two minutes without one, as client-go's informer backs off.

    ``backoff`` replaces those steps (a test passes one without jitter).

    It is a ``StatusReporter`` of what it sees itself (``source_status()``), for a source that
    reports nothing.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn,
        store: EventSink,
        on_affected: Callable[[AbstractSet[ParentKey]], None],
        retry_delay: float,
        clock: Clock,
        name: str = "reconcile",
        backoff: Backoff | None = None,
    ) -> None:
        self._source = source
        self._store = store
        self._on_affected = on_affected
        self._retry_delay = positive_finite("retry_delay", retry_delay)
        self._clock = clock
        self._log = NamedLogger(logger, name)
        self._backoff = (
            Backoff(clock=clock, initial=self._retry_delay) if backoff is None else backoff
        )
        self._synced = asyncio.Event()
        self._stream: AsyncIterator[SourceEvent] | None = None
        self._events = 0
        self._rejected = 0
        self._listings_rejected = 0
        self._opening_lists = 0
        self._last_event_at: float | None = None
        self._stamped_events = 0
        self._phase = SourcePhase.STARTING
        self._phase_since: float | None = None
        self._backoff_until: float | None = None
        self._opened = 0
        self._last_error: str | None = None
        self._last_error_at: float | None = None

    async def run(self) -> None:
        try:
            while True:
                await self._run_one_stream()
                delay = self._backoff.next_delay()
                self._backoff_until = self._clock.time() + delay
                self._enter(SourcePhase.BACKING_OFF)
                await self._clock.sleep(delay)
                self._backoff_until = None
        finally:
            self._enter(SourcePhase.STOPPED)

    async def wait_for_sync(self) -> None:
        await self._synced.wait()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    @property
    def events_applied(self) -> int:
        """Events the store applied, listings included: ``listings_applied`` plus
        ``watch_events_applied``."""
        return self._events - self._rejected

    @property
    def listings_applied(self) -> int:
        """``ReplaceEvent``s the store applied, each counting one."""
        return self._store.replaces

    @property
    def watch_events_applied(self) -> int:
        """Events other than listings the store applied."""
        return self.events_applied - self._store.replaces

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        await self._aclose_logging_failure(stream)

    def source_status(self) -> SourceStatus:
        applied = self._store.replaces
        lists = applied + self._listings_rejected
        relists = {
            reason: count
            for reason, count in (
                (RELIST_ON_REOPEN, self._opening_lists - 1),
                (RELIST_IN_STREAM, applied - self._opening_lists),
            )
            if count > 0
        }
        return SourceStatus(
            phase=self._phase,
            phase_since=self._phase_since,
            backoff_until=self._backoff_until,
            last_event_at=self._last_event_at,
            events=self._events - lists,
            lists=lists,
            watches=self._opened,
            watch_restarts=max(0, self._opened - 1),
            relists=relists,
            last_error=self._last_error,
            last_error_at=self._last_error_at,
        )

    def _enter(self, phase: SourcePhase) -> None:
        if phase is not self._phase:
            self._log.debug("source %s -> %s", self._phase, phase)
            self._phase = phase
            self._phase_since = self._clock.time()

    def _fail(self, message: str, exc: BaseException | None = None) -> None:
        text = message if exc is None else f"{message}: {exc!r}"
        self._last_error, self._last_error_at = text, self._clock.time()
        self._log.error("%s; reopening after a backoff step", text)

    async def _run_one_stream(self) -> None:
        self._enter(SourcePhase.LISTING)
        try:
            self._stream = self._source()
        except Exception as exc:
            self._fail("source factory raised", exc)
            return
        self._opened += 1
        try:
            await self._pump(self._stream)
        except Exception as exc:
            self._fail("source stream failed", exc)
        finally:
            await self.aclose()

    async def _pump(self, stream: AsyncIterator[SourceEvent]) -> None:
        if not await self._open(stream):
            return
        if not self._synced.is_set():
            self._log.debug(
                "synced: the store holds the opening listing, %d objects", len(self._store)
            )
            self._synced.set()
        self._enter(SourcePhase.WATCHING)
        handle_event, on_affected = self._store.handle_event, self._on_affected
        events = self._events
        async for event in stream:
            events += 1
            self._events = events
            try:
                affected = handle_event(event)
            except Exception as exc:
                self._reject(event, exc)
                continue
            if affected:
                on_affected(affected)
        self._fail("source stream ended")

    async def _open(self, stream: AsyncIterator[SourceEvent]) -> bool:
        """Applies the stream's opening ReplaceEvent. Its own frame, so that the event is let go
        once applied: held by `_pump` it lived as long as the stream, a stale copy of the pool."""
        try:
            first: object = await anext(stream)
        except StopAsyncIteration:
            self._fail("source stream ended before its ReplaceEvent")
            return False
        self._note_event()
        if not isinstance(first, ReplaceEvent):
            self._rejected += 1
            self._fail(
                f"source stream opened with {type(first).__name__} instead of a ReplaceEvent"
                f" ({describe(first, _REPR_LIMIT)})"
            )
            return False
        if not self._apply(first):
            self._fail("source stream's opening ReplaceEvent was rejected by the store")
            return False
        return True

    def _note_event(self) -> None:
        self._events += 1
        self._stamp(self._clock.time())

    def sample(self, now: float) -> None:
        """Stamps ``now`` as the last event's time if events arrived since the last sample: the
        hot path counts events and never reads the clock, so ``last_event_at`` is as late as the
        sampling period (the loop samples every second)."""
        if self._events != self._stamped_events:
            self._stamp(now)

    def _stamp(self, now: float) -> None:
        self._stamped_events = self._events
        self._last_event_at = now

    def _apply(self, event: ReplaceEvent) -> bool:
        try:
            affected = self._store.handle_event(event)
        except Exception as exc:
            self._reject(event, exc)
            return False
        self._opening_lists += 1
        if affected:
            self._on_affected(affected)
        return True

    def _reject(self, event: object, exc: Exception) -> None:
        self._rejected += 1
        self._listings_rejected += isinstance(event, ReplaceEvent)
        self._log_rejected(event, exc)

    def _log_rejected(self, event: object, exc: Exception) -> None:
        if isinstance(event, SOURCE_EVENT_TYPES):
            self._log.error(
                "skipping source event the store rejected: %s: %r",
                describe(event, _REPR_LIMIT),
                exc,
            )
        else:
            self._log.error(
                "skipping %s from the source stream, not a source event: %s",
                type(event).__name__,
                describe(event, _REPR_LIMIT),
            )

    async def _aclose_logging_failure(self, stream: AsyncIterator[Any] | None) -> None:
        aclose = getattr(stream, "aclose", None)
        if aclose is None:
            return
        try:
            await aclose()
        except Exception as exc:
            self._log.error("closing the source stream failed: %r", exc)
