"""LIST, then WATCH from the list's cursor, as a stream of source events. Go: ``cache.Reflector``.

Each ``watch()`` call opens a stream that starts with a consistent LIST as one ``ReplaceEvent``,
then follows a WATCH from that list's ``resourceVersion``. The LIST is read in pages of
``LIST_PAGE_SIZE`` pods, following continue tokens as client-go's ``ListPager`` does, each page
decoded as it arrives; the server serves every page from the first page's snapshot, so the pages
join into one ``ReplaceEvent``. A continue token that expires mid-LIST (410) restarts the paged
LIST from its first page at once. A watch that ends cleanly is reopened from the cursor; a cursor
the server rejects (410, or 504 for a too-large resourceVersion) costs a relist; any other failure
retries from the same cursor after ``retry_delay``. Nothing a frame contains ends the stream.

A real apiserver never rejects a cursor beyond its history (etcd restored from an older snapshot)
on a plain WATCH: it waits for that revision and closes at the timeout with no frame. So a watch
that closed cleanly without a single frame (no event, no bookmark) is followed by a probe, a LIST
of at most one pod not older than the cursor, which the server does reject; the probe's result
never reaches the store. A healthy watch-cache watch always carries bookmarks, so the probe runs
only where the cursor is suspect or the server sends none (no watch cache, an idle selector).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.k8s_api import (
    FrameDecodeError,
    KubernetesApiError,
    KubernetesPodApi,
    PodListPage,
    PodWatchEvent,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

logger = logging.getLogger(__name__)

VERY_SHORT_WATCH_SECONDS = 1.0
"""Go's ``VeryShortWatchError``: a watch this short that saw no event is a failure, not a close."""

PROBE_LIMIT = 1
"""Items a cursor probe asks for: it checks the cursor, the page itself is dropped."""

LIST_PAGE_SIZE = 500
"""Pods per LIST page, client-go's ``pager.defaultPageSize``."""


class _ContinueExpired(Exception):
    """A continuation page was refused with 410: the LIST's snapshot has been compacted away."""


class _Next(enum.Enum):
    REWATCH = "rewatch"
    RETRY = "retry"
    RELIST = "relist"
    PROBE = "probe"


@dataclass
class _Watch:
    cursor: str
    started: float
    events: int = 0
    next: _Next = _Next.REWATCH


class KubernetesReflector:
    """A ``SourceWatchFn`` over a ``KubernetesPodApi``; object keys are pod names."""

    def __init__(
        self,
        *,
        kube_client: KubernetesPodApi,
        namespace: str,
        label_selector: str,
        watch_timeout_seconds: int = 300,
        retry_delay: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        self._api = kube_client
        self._namespace = namespace
        self._label_selector = label_selector
        self._watch_timeout_seconds = watch_timeout_seconds
        self._retry_delay = retry_delay
        self._clock: Clock = clock or RealClock()

    async def watch(self) -> AsyncIterator[SourceEvent]:
        while True:
            page = await self._list()
            yield ReplaceEvent({pod.metadata.name: pod for pod in page.pods})
            cursor = page.resource_version
            while True:
                session = _Watch(cursor=cursor, started=self._clock.time())
                async with aclosing(self._follow(session)) as events:
                    async for event in events:
                        yield event
                cursor = session.cursor
                next_step = session.next
                if next_step is _Next.PROBE:
                    next_step = await self._probe(cursor)
                if next_step is not _Next.REWATCH:
                    await self._clock.sleep(self._retry_delay)
                if next_step is _Next.RELIST:
                    break

    async def _list(self) -> PodListPage:
        """A consistent LIST (resourceVersion unset), retried each ``retry_delay`` till it works;
        one whose continue token expired is restarted at once."""
        while True:
            try:
                return await self._paged_list()
            except _ContinueExpired as expired:
                logger.warning(
                    "pod LIST continue token expired after %d pods, relisting from the first page: "
                    "namespace=%s selector=%r reason=%s",
                    expired.args[0],
                    self._namespace,
                    self._label_selector,
                    expired.args[1],
                )
                continue
            except Exception as err:
                logger.warning(
                    "pod LIST failed, retrying in %ss: namespace=%s selector=%r reason=%s",
                    self._retry_delay,
                    self._namespace,
                    self._label_selector,
                    _reason(err),
                )
            await self._clock.sleep(self._retry_delay)

    async def _paged_list(self) -> PodListPage:
        """Every page of one consistent LIST as one page, at the last page's resourceVersion
        (the server answers every continuation at the first page's)."""
        pods: list[Pod] = []
        page = await self._list_page(continue_token=None)
        while True:
            pods.extend(page.pods)
            if not page.continue_token:
                return PodListPage(tuple(pods), page.resource_version)
            try:
                page = await self._list_page(continue_token=page.continue_token)
            except KubernetesApiError as err:
                if err.code != 410:
                    raise
                raise _ContinueExpired(len(pods), _reason(err)) from err

    async def _list_page(self, *, continue_token: str | None) -> PodListPage:
        return await self._api.list_pods(
            namespace=self._namespace,
            label_selector=self._label_selector,
            limit=LIST_PAGE_SIZE,
            continue_token=continue_token,
        )

    async def _probe(self, cursor: str) -> _Next:
        """LISTs at most one pod not older than ``cursor``: a rejection means the cursor is beyond
        the server's history (or expired), so relist; success re-watches; else retry."""
        try:
            await self._api.list_pods(
                namespace=self._namespace,
                label_selector=self._label_selector,
                resource_version=cursor,
                limit=PROBE_LIMIT,
            )
        except KubernetesApiError as err:
            if not err.rejects_cursor:
                return self._probe_failed(cursor, err)
            logger.warning(
                "pod watch cursor resourceVersion=%s %s, relisting: the probe LIST after a watch "
                "that closed with no frame got %s",
                cursor,
                "is beyond the server's history" if err.code == 504 else "has expired",
                _reason(err),
            )
            return _Next.RELIST
        except Exception as err:
            return self._probe_failed(cursor, err)
        return _Next.REWATCH

    def _probe_failed(self, cursor: str, err: Exception) -> _Next:
        logger.warning(
            "pod cursor probe LIST at resourceVersion=%s failed, retrying the watch from it: %s",
            cursor,
            _reason(err),
        )
        return _Next.RETRY

    async def _follow(self, session: _Watch) -> AsyncGenerator[SourceEvent, None]:
        stream = self._api.stream_pods(
            namespace=self._namespace,
            label_selector=self._label_selector,
            resource_version=session.cursor,
            timeout_seconds=self._watch_timeout_seconds,
        )
        try:
            async for frame in stream:
                session.events += 1
                if frame.type == "ERROR":
                    self._end_on_error_frame(session, frame)
                    return
                session.cursor = frame.resource_version or session.cursor
                event = _source_event(frame)
                if event is not None:
                    yield event
        except FrameDecodeError as err:
            self._skip_or_relist(session, err)
        except Exception as err:
            self._end_on_failure(session, err)
        else:
            self._end_on_close(session)
        finally:
            await _close(stream)

    def _end_on_close(self, session: _Watch) -> None:
        lasted = self._clock.time() - session.started
        if session.events == 0 and lasted < VERY_SHORT_WATCH_SECONDS:
            logger.warning(
                "very short pod watch: closed after %.3fs with no event, resourceVersion=%s",
                lasted,
                session.cursor,
            )
            session.next = _Next.RETRY
        elif session.events == 0:
            session.next = _Next.PROBE

    def _end_on_error_frame(self, session: _Watch, frame: PodWatchEvent) -> None:
        session.next = _Next.RELIST if frame.rejects_cursor else _Next.RETRY
        logger.warning(
            "pod watch ERROR frame after resourceVersion=%s, %s: %s",
            session.cursor,
            "relisting" if frame.rejects_cursor else "retrying from the cursor",
            frame.reason,
        )

    def _end_on_failure(self, session: _Watch, err: Exception) -> None:
        rejected = isinstance(err, KubernetesApiError) and err.rejects_cursor
        session.next = _Next.RELIST if rejected else _Next.RETRY
        logger.warning(
            "pod watch from resourceVersion=%s failed, %s: %s",
            session.cursor,
            "relisting" if rejected else "retrying from the cursor",
            _reason(err),
        )

    def _skip_or_relist(self, session: _Watch, err: FrameDecodeError) -> None:
        cursor = session.cursor
        if err.resource_version is None:
            session.next = _Next.RELIST
            action = "unreadable, relisting"
        elif err.event_type == "DELETED":
            session.next = _Next.RELIST
            action = "a deletion, relisting so the pod cannot linger"
        else:
            session.cursor = err.resource_version
            action = "skipped, the store keeps its last valid copy"
        logger.error(
            "pod watch frame rejected after resourceVersion=%s (%s): pod=%s resourceVersion=%s "
            "reason=%s",
            cursor,
            action,
            err.name,
            err.resource_version,
            err.reason,
        )


def _source_event(frame: PodWatchEvent) -> SourceEvent | None:
    if frame.pod is None:
        return None
    name = frame.pod.metadata.name
    if frame.type == "DELETED":
        return DeleteEvent(name, frame.pod)
    return UpsertEvent(name, frame.pod)


def _reason(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


async def _close(stream: AsyncIterator[PodWatchEvent]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
