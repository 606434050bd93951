"""What the reflector and the pager ask of a pod API: the contract's two methods and three optional
capabilities, as protocols. Go: client-go ``tools/cache.ListerWatcher`` (and controller-runtime's
``pkg/client/interfaces.go``).

``KubernetesPodApi`` is the contract's protocol: ``list_pods`` and ``stream_pods``, nothing else,
and the reflector works over any object offering those two. Optional capabilities, found with
``isinstance``, let it do more: ``PagedPodApi`` (one page of a LIST, with a limit, a continue token
or a resourceVersion: pagination and the cursor probe), ``PrefetchPagedPodApi`` (a page read now
and decoded later, so the next one can be requested meanwhile) and ``StreamingListPodApi`` (a watch
that first streams the current pods, ending at the ``k8s.io/initial-events-end`` bookmark).
``k8s_api.KubernetesAsyncioPodApi`` offers all three. Importing this module imports no transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from miles.utils.workers.reconcile.k8s_values import (
    ListOptions,
    ListPage,
    PodListPage,
    PodWatchEvent,
    WatchEvent,
)


class KubernetesPodApi(Protocol):
    """The contract: a complete pod API is these two methods, with exactly these parameters."""

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        """A consistent LIST (resourceVersion unset) of every pod the selector matches."""
        ...

    def stream_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[PodWatchEvent]:
        """Watch from ``resource_version``; always asks for bookmarks and sends the timeout."""
        ...


@runtime_checkable
class PagedPodApi(Protocol):
    """Optional capability: one page of a LIST, as ``options`` asks (see ``ListOptions``): pages
    and the cursor probe. Go: ``PodInterface.List(ctx, opts)``."""

    async def list_pod_page(self, options: ListOptions) -> PodListPage: ...


class UndecodedPodPage(Protocol):
    """A LIST page read but not yet decoded. ``continue_hint`` is its continue token when it could
    be read without decoding the items (from the bytes before them, where the apiserver writes a
    pod list's ``metadata``, or after them, where it writes a custom resource's), else ``None``;
    ``decode()`` gives the page, whose ``continue_token`` is the authoritative one."""

    @property
    def continue_hint(self) -> str | None: ...

    def decode(self) -> Any:
        """A ``PodListPage`` from a pod API, a ``ListPage`` from a ``ResourceApi``."""
        ...


@runtime_checkable
class PrefetchPagedPodApi(Protocol):
    """Optional capability beside ``PagedPodApi``: read a page's bytes now, decode them later, so
    a pager can request the next page while this one decodes."""

    async def read_pod_page(
        self, options: ListOptions, *, on_head: Callable[[str | None], object] | None = None
    ) -> UndecodedPodPage:
        """As ``list_pod_page``, but the body is not decoded yet.
        ``on_head`` is called once the first bytes of the body are in, before the rest is read,
        with the continue token read from them (``None`` when they do not give one); not at all
        when the read fails before that. An implementation may also take ``on_sent``, called with
        no argument once the request is written (``k8s_pager`` then decodes the previous page while
        the server builds this one; it looks for the parameter in the signature)."""
        ...


@runtime_checkable
class StreamingListPodApi(Protocol):
    """Optional capability: a streaming list. Go: a watch with ``SendInitialEvents=true``,
    ``ResourceVersionMatch=NotOlderThan``, ``AllowWatchBookmarks=true`` (client-go's
    ``Reflector.watchList``)."""

    def stream_pod_list(
        self, *, namespace: str, label_selector: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        """An ADDED event per pod of a consistent snapshot, then a BOOKMARK with
        ``initial_events_end``, then the watch goes on from there as ``stream_pods`` does."""
        ...


@runtime_checkable
class ResourceApi(Protocol):
    """What the reflector asks of an API over any resource (``k8s_api.KubernetesAsyncioResourceApi``
    is one): a page of a LIST (the whole LIST, pages and the probe), a page read now and decoded
    later, a watch and a streaming list, each for one namespace (``""``: all) and selectors."""

    async def list_page(self, options: ListOptions) -> ListPage[Any]: ...

    async def read_page(
        self, options: ListOptions, *, on_head: Callable[[str | None], object] | None = None
    ) -> UndecodedPodPage: ...

    def stream(
        self,
        *,
        namespace: str,
        label_selector: str,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[WatchEvent[Any]]: ...

    def stream_list(
        self, *, namespace: str, label_selector: str, field_selector: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent[Any]]: ...
