"""A recording `KubernetesPodApi` delegate, shared by the e2e harnesses. Go counterpart: none
(test-side).

`RecordingPodApi` logs every consistent LIST (its pages joined, as the reflector joins them) and
watch frame in the order the runtime received them, every WATCH it opened (its cursor, frames,
timing, failure), every consistent LIST it attempted, and, apart, every cursor probe (a LIST
carrying a resourceVersion, which never feeds the store).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
from miles.utils.workers.reconcile.k8s_interfaces import KubernetesPodApi, PagedPodApi
from miles.utils.workers.reconcile.k8s_values import ListOptions, PodListPage, PodWatchEvent

T = TypeVar("T")
LogEntry = PodListPage | PodWatchEvent


class PagedKubernetesPodApi(KubernetesPodApi, PagedPodApi, Protocol):
    """What the recorder wraps: the contract plus pages and probes (a streaming list is forwarded
    when the inner API has one)."""


async def aclose(stream: AsyncIterator[Any]) -> None:
    """Closes an async generator typed as a plain `AsyncIterator` (as `stream_pods` is)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


@asynccontextmanager
async def closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    try:
        yield stream
    finally:
        await aclose(stream)


@dataclass
class WatchCall:
    """One `stream_pods` call: the cursor it opened from, what it yielded, and how it ended."""

    resource_version: str
    opened_at: float
    frames: list[PodWatchEvent] = field(default_factory=list)
    ended_at: float | None = None
    failure: BaseException | None = None

    @property
    def last_cursor(self) -> str:
        """The cursor a re-watch after this one should open from."""
        seen = [f.resource_version for f in self.frames if f.resource_version]
        return seen[-1] if seen else self.resource_version


@dataclass
class ProbeCall:
    """One cursor probe: a LIST from `resource_version`, and its page or its failure."""

    resource_version: str
    limit: int | None
    opened_at: float
    page: PodListPage | None = None
    failure: BaseException | None = None


class RecordingPodApi:
    """A `KubernetesPodApi` delegate. `lists` holds the consistent LISTs that succeeded (the initial
    sync, then one per relist), each its pages joined at the last page's resourceVersion, and `log`
    those LISTs and every frame, in arrival order; `pages` holds every page received;
    `list_attempts` counts the consistent LISTs started (first pages sent), failed ones included;
    `probes` holds the LISTs that carried a resourceVersion (cursor probes), which are neither
    relists nor logged."""

    def __init__(self, inner: PagedKubernetesPodApi) -> None:
        self._inner = inner
        self.lists: list[PodListPage] = []
        self.pages: list[PodListPage] = []
        self._pending: list[PodListPage] = []
        self.list_attempts = 0
        self.probes: list[ProbeCall] = []
        self.watches: list[WatchCall] = []
        self.log: list[LogEntry] = []

    @classmethod
    def over(cls, core_v1_api: Any) -> RecordingPodApi:
        return cls(KubernetesAsyncioPodApi(core_v1_api=core_v1_api))

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        return await self.list_pod_page(ListOptions(namespace, label_selector))

    async def list_pod_page(self, options: ListOptions) -> PodListPage:
        if options.resource_version is not None:
            return await self._probe(options, options.resource_version)
        if options.continue_token is None:
            self.list_attempts += 1
            self._pending = []
        page = await self._inner.list_pod_page(options)
        self.pages.append(page)
        self._pending.append(page)
        if page.continue_token is None:
            joined = PodListPage(
                tuple(pod for part in self._pending for pod in part.pods), page.resource_version
            )
            self._pending = []
            self.lists.append(joined)
            self.log.append(joined)
        return page

    async def _probe(self, options: ListOptions, resource_version: str) -> PodListPage:
        call = ProbeCall(resource_version, options.limit, opened_at=time.monotonic())
        self.probes.append(call)
        try:
            call.page = await self._inner.list_pod_page(options)
        except BaseException as err:
            call.failure = err
            raise
        return call.page

    def stream_pods(
        self, *, namespace: str, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        stream = self._inner.stream_pods(
            namespace=namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )
        return self._recorded(WatchCall(resource_version, opened_at=time.monotonic()), stream)

    def stream_pod_list(
        self, *, namespace: str, label_selector: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        """A streaming list, recorded as a watch from `""` whose pods up to the initial-events-end
        bookmark are logged as one listing (a `PodListPage` at the bookmark's resourceVersion)."""
        self.list_attempts += 1
        stream = self._inner.stream_pod_list(  # type: ignore[attr-defined]
            namespace=namespace, label_selector=label_selector, timeout_seconds=timeout_seconds
        )
        return self._recorded(WatchCall("", opened_at=time.monotonic()), stream, listing=True)

    async def _recorded(
        self, call: WatchCall, stream: AsyncIterator[PodWatchEvent], *, listing: bool = False
    ) -> AsyncIterator[PodWatchEvent]:
        self.watches.append(call)
        initial: dict[str, Any] = {}
        try:
            async with closing(stream) as frames:
                async for frame in frames:
                    call.frames.append(frame)
                    if listing and frame.initial_events_end:
                        listing = False
                        joined = PodListPage(tuple(initial.values()), frame.resource_version or "")
                        self.lists.append(joined)
                        self.log.append(joined)
                    elif listing and frame.pod is not None:
                        if frame.type == "DELETED":
                            initial.pop(frame.pod.metadata.name, None)
                        else:
                            initial[frame.pod.metadata.name] = frame.pod
                    else:
                        self.log.append(frame)
                    yield frame
        except BaseException as err:
            call.failure = err
            raise
        finally:
            call.ended_at = time.monotonic()

    def pod_frames(self, name: str) -> list[PodWatchEvent]:
        return [
            frame
            for call in self.watches
            for frame in call.frames
            if frame.pod is not None and frame.pod.metadata.name == name
        ]

    def cursor_rejections(self) -> list[PodWatchEvent]:
        return [f for call in self.watches for f in call.frames if f.rejects_cursor]

    def describe(self) -> str:
        watches = [
            f"(rv={w.resource_version} frames={[f.type for f in w.frames]} failure={w.failure!r})"
            for w in self.watches
        ]
        probes = [f"(rv={p.resource_version} failure={p.failure!r})" for p in self.probes]
        return f"LISTs={len(self.lists)} probes={probes} WATCHes={watches}"
