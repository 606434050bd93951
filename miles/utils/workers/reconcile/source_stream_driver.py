"""Open, sync, reopen the source stream; pump it into the store. Go: informer ``processLoop``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from miles.utils.workers.reconcile.clock import Clock
from miles.utils.workers.reconcile.object_store import ObjectStore
from miles.utils.workers.reconcile.source_event import (
    SOURCE_EVENT_TYPES,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
)

logger = logging.getLogger(__name__)

_REPR_LIMIT = 200


class SourceStreamDriver:
    """Keeps one stream from ``source`` open and applies each event to ``store``, then notifies.

    The store is written before ``on_affected`` hears of the parents, so a reconcile always reads
    the event that woke it. A stream must open with a ``ReplaceEvent``; one that does not, ends,
    raises, or cannot be opened is logged and reopened after ``retry_delay``, forever.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn,
        store: ObjectStore,
        on_affected: Callable[[set[ParentKey]], None],
        retry_delay: float,
        clock: Clock,
    ) -> None:
        self._source = source
        self._store = store
        self._on_affected = on_affected
        self._retry_delay = retry_delay
        self._clock = clock
        self._synced = asyncio.Event()
        self._stream: AsyncIterator[SourceEvent] | None = None

    async def run(self) -> None:
        while True:
            await self._run_one_stream()
            await self._clock.sleep(self._retry_delay)

    async def wait_for_sync(self) -> None:
        await self._synced.wait()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        await _aclose_logging_failure(stream)

    async def _run_one_stream(self) -> None:
        try:
            self._stream = self._source()
        except Exception as exc:
            logger.error("source factory raised, retrying in %ss: %r", self._retry_delay, exc)
            return
        try:
            await self._pump(self._stream)
        except Exception as exc:
            logger.error("source stream failed, reopening in %ss: %r", self._retry_delay, exc)
        finally:
            await self.aclose()

    async def _pump(self, stream: AsyncIterator[SourceEvent]) -> None:
        try:
            first: object = await anext(stream)
        except StopAsyncIteration:
            logger.error("source stream ended before its ReplaceEvent, reopening")
            return
        if not isinstance(first, ReplaceEvent):
            logger.error(
                "source stream opened with %s instead of a ReplaceEvent, reopening: %s",
                type(first).__name__,
                _describe(first),
            )
            return
        if not self._apply(first):
            return
        self._synced.set()
        handle_event, on_affected = self._store.handle_event, self._on_affected
        async for event in stream:
            try:
                affected = handle_event(event)
            except Exception as exc:
                _log_rejected(event, exc)
                continue
            if affected:
                on_affected(affected)
        logger.warning("source stream ended, reopening in %ss", self._retry_delay)

    def _apply(self, event: SourceEvent) -> bool:
        try:
            affected = self._store.handle_event(event)
        except Exception as exc:
            _log_rejected(event, exc)
            return False
        if affected:
            self._on_affected(affected)
        return True


async def _aclose_logging_failure(stream: AsyncIterator[Any] | None) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as exc:
        logger.error("closing the source stream failed: %r", exc)


def _log_rejected(event: object, exc: Exception) -> None:
    if isinstance(event, SOURCE_EVENT_TYPES):
        logger.error("skipping source event the store rejected: %s: %r", _describe(event), exc)
    else:
        logger.error(
            "skipping %s from the source stream, not a source event: %s",
            type(event).__name__,
            _describe(event),
        )


def _describe(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception as exc:
        return f"<unrepresentable {type(obj).__name__}: {exc!r}>"
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "..."
