"""Pod LIST and WATCH over ``kubernetes_asyncio``'s transport. Go: typed ``PodInterface``.

``KubernetesAsyncioPodApi`` is the contract's ``KubernetesPodApi`` (``k8s_interfaces``) with all
three optional capabilities, over a ``CoreV1Api``; ``KubernetesAsyncioLeaseApi`` is
``lease_lock.LeaseApi`` over a ``CoordinationV1Api``.

The only module that touches ``kubernetes_asyncio``, and only through the ``CoreV1Api`` object it is
given: every call passes ``_preload_content=False``, so the client's own model deserializer (tens of
times slower than a partial pydantic model validated from bytes, see ``bench/decode.py``, and run
after a second ``json`` round trip per frame by its ``Watch``) never runs; the body is cut into
lines by ``k8s_framing`` and decoded by ``k8s_wire``. ``aiohttp``'s exceptions are translated here,
where they arise, into ``KubernetesConnectionError`` (and non-2xx answers into
``KubernetesApiError``), so no module above this one knows the HTTP client. ``aiohttp`` is imported
lazily, so the loop stays importable without the ``k8s`` extra.

The contract's names stay importable from here (``PodListPage``, ``PodWatchEvent``,
``KubernetesPodApi``, ``exception_rejects_cursor``); each lives in its own module.

Where the apiserver and the credentials come from is ``k8s_config``'s (kubeconfig, service
account, token refresh); here that resolved configuration becomes the client's ``Configuration``
(``client_configuration``, ``in_cluster_configuration``) and an open session (``kube_session``).
``ServiceAccountToken`` and the service-account constants stay importable from here.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from miles.utils.workers.reconcile.arguments import optional_period, positive_finite
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.k8s_config import (
    SERVICE_ACCOUNT,
    SERVICE_HOST,
    SERVICE_PORT,
    TOKEN_CACHE_SECONDS,
    ClientConfig,
    InClusterConfig,
    KubeconfigError,
    KubeTarget,
    ServiceAccountToken,
    in_cluster_config,
    in_cluster_possible,
    resolve_config,
    tls_failure_reason,
    with_data_in_files,
)
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    FrameDecodeError,
    KubernetesApiError,
    KubernetesConfigError,
    KubernetesConnectionError,
    exception_rejects_cursor,
    parse_retry_after,
)
from miles.utils.workers.reconcile.k8s_framing import ByteStream, iter_line_batches
from miles.utils.workers.reconcile.k8s_http import BearerCredentials
from miles.utils.workers.reconcile.k8s_interfaces import KubernetesPodApi, UndecodedPodPage
from miles.utils.workers.reconcile.k8s_transport import RawResponse, Request, Transport
from miles.utils.workers.reconcile.k8s_values import (
    ListOptions,
    ListPage,
    PodListPage,
    PodWatchEvent,
    WatchEvent,
)
from miles.utils.workers.reconcile.k8s_watch_health import WatchHealthCheck
from miles.utils.workers.reconcile.k8s_wire import (
    ObjectDecoder,
    decode_pod_list,
    decode_status,
    decode_watch_read,
    list_head_complete,
    peek_continue_token,
    peek_trailing_continue_token,
)
from miles.utils.workers.reconcile.resource import Resource

_M = TypeVar("_M", bound=BaseModel)

__all__ = [
    "SERVICE_ACCOUNT",
    "SERVICE_HOST",
    "SERVICE_PORT",
    "TOKEN_CACHE_SECONDS",
    "WATCH_IDLE_TIMEOUT",
    "WATCH_PROBE_AFTER",
    "KubernetesAsyncioLeaseApi",
    "KubernetesAsyncioPodApi",
    "KubernetesAsyncioResourceApi",
    "KubernetesAsyncioTransport",
    "KubernetesPodApi",
    "PodListPage",
    "PodWatchEvent",
    "ServiceAccountToken",
    "exception_rejects_cursor",
    "in_cluster_possible",
    "write_transport",
]

logger = logging.getLogger(__name__)

WATCH_IDLE_TIMEOUT = 90.0
"""Seconds a watch that cannot be probed may deliver no byte before it is ended as dead: 1.5 times
the watch cache's bookmark interval (``defaultBookmarkFrequency`` = 1 min, apiserver
``storage/cacher``), so a healthy watch on a cached apiserver never reaches it. It holds where
``watch_probe_after`` is off, during a streaming list's initial events (no cursor yet), and for a
read whose probe the apiserver answered without telling (410 Expired, 429, 5xx)."""
WATCH_PROBE_AFTER = 30.0
"""Seconds of silence after which a watch is probed on another connection (client-go's HTTP/2
``ReadIdleTimeout``); ``k8s_watch_health`` has the rest of the rule."""
PROBE_TIMEOUT_SECONDS = 1
"""The probe watch's ``timeoutSeconds``: events from before it began come at once, so it needs only
to be answered."""
PROBE_DEADLINE = 15.0
"""The probe's client deadline, connecting included: client-go's HTTP/2 ``PingTimeout``, so a
watch whose apiserver cannot be reached ends 45 s after its last byte, as client-go's does."""
_ERROR_BODY_BYTES = 64 * 2**10


class _ListWatchApi:
    """LIST, paged LIST, WATCH, streaming list and the watch probe of one collection, over
    ``kubernetes_asyncio``'s transport: the pod API and the resource API differ only in how a
    request is made (``_get``) and how its bytes decode (``_decode_list``, ``_decode_read``),
    both bound once at construction."""

    _noun: str
    _auth: Any

    _noun = "pod"

    def _configure(
        self,
        *,
        connect_timeout: float,
        list_read_timeout: float,
        watch_read_margin: float,
        watch_idle_timeout: float | None,
        watch_probe_after: float | None,
        clock: Clock | None,
    ) -> None:
        self._connect_timeout = positive_finite("connect_timeout", connect_timeout)
        self._list_read_timeout = positive_finite("list_read_timeout", list_read_timeout)
        self._watch_read_margin = positive_finite("watch_read_margin", watch_read_margin)
        self._watch_idle_timeout = (
            None
            if watch_idle_timeout is None
            else positive_finite("watch_idle_timeout", watch_idle_timeout)
        )
        self._watch_probe_after = optional_period("watch_probe_after", watch_probe_after)
        self._clock = clock or RealClock()
        self._read_idle_deadline = self._watch_idle_timeout or (
            WATCH_IDLE_TIMEOUT if self._watch_probe_after is None else None
        )

    def _get(self, namespace: str, **options: Any) -> Any:
        raise NotImplementedError

    def _decode_list(self, body: bytes) -> tuple[Any, list[FrameDecodeError]]:
        return decode_pod_list(body)

    def _decode_read(self, lines: list[bytes], *, listing: bool = False) -> Iterator[Any]:
        return decode_watch_read(lines, listing=listing)

    async def _read_list(
        self,
        options: ListOptions,
        on_head: Callable[[str | None], object] | None = None,
        on_sent: Callable[[], object] | None = None,
    ) -> bytes:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
            sock_read=self._list_read_timeout,
        )
        if on_sent is not None:
            _announcing_written(getattr(self._auth, "api_client", None))
        with _translated(f"{self._noun} LIST"):
            announced = _REQUEST_WRITTEN.set(on_sent)
            try:
                resp = await self._get(
                    options.namespace,
                    label_selector=options.label_selector,
                    _preload_content=False,
                    _request_timeout=timeout,
                    **_list_query(options),
                )
            finally:
                _REQUEST_WRITTEN.reset(announced)
            try:
                await _raise_for_status(resp, self._auth)
                with _failing_when_cut_off(resp):
                    if on_head is None:
                        body: bytes = await resp.read()
                    else:
                        body = await _read_announcing_head(resp.content, on_head)
            finally:
                resp.release()
        return body

    async def _watch(
        self, namespace: str, *, timeout_seconds: int, **options: Any
    ) -> AsyncIterator[Any]:
        with _translated(f"{self._noun} watch"):
            resp = await self._open_watch(
                namespace, timeout_seconds, timeout_seconds + self._watch_read_margin, **options
            )
            try:
                await _raise_for_status(resp, self._auth)
                listing = bool(options.get("send_initial_events"))
                cursor = None if listing else options.get("resource_version")
                async with self._checked(resp, namespace, options, cursor) as (content, health):
                    lines = iter_line_batches(content, idle_timeout=self._read_idle_deadline)
                    decode = self._decode_read
                    with _failing_when_cut_off(resp):
                        async with aclosing(lines):
                            async for batch in lines:
                                for event in decode(batch, listing=listing):
                                    listing = listing and not event.initial_events_end
                                    if health and not listing and event.resource_version:
                                        health.cursor = event.resource_version
                                    yield event
            finally:
                resp.close()

    async def _open_watch(
        self, namespace: str, timeout_seconds: int, deadline: float, **options: Any
    ) -> Any:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=deadline, connect=self._connect_timeout, sock_connect=self._connect_timeout
        )
        return await self._get(
            namespace,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=timeout,
            **options,
        )

    @asynccontextmanager
    async def _checked(
        self, resp: Any, namespace: str, options: Mapping[str, Any], cursor: str | None
    ) -> AsyncIterator[tuple[ByteStream, WatchHealthCheck | None]]:
        """The watch's body under a health check, or as it is when probing is off."""
        if self._watch_probe_after is None:
            yield resp.content, None
            return
        selectors = {
            key: options[key] for key in ("label_selector", "field_selector") if key in options
        }

        async def probe(from_cursor: str) -> str | None:
            return await self._probe(namespace, from_cursor, **selectors)

        health = WatchHealthCheck(
            resp.content,
            probe=probe,
            probe_after=self._watch_probe_after,
            backstop=WATCH_IDLE_TIMEOUT,
            cursor=cursor,
            server=_server_of(resp),
            clock=self._clock,
        )
        async with health:
            yield health, health

    async def _probe(self, namespace: str, cursor: str, **selectors: str) -> str | None:
        """The resourceVersion of the first event after ``cursor``, from a short watch on
        another connection, or ``None`` if there was none (``k8s_watch_health.Probe``)."""
        with _translated(f"{self._noun} watch probe"):
            resp = await self._open_watch(
                namespace,
                PROBE_TIMEOUT_SECONDS,
                PROBE_DEADLINE,
                resource_version=cursor,
                **selectors,
            )
            try:
                await _raise_for_status(resp, self._auth)
                with _failing_when_cut_off(resp):
                    async with aclosing(iter_line_batches(resp.content)) as lines:
                        async for batch in lines:
                            if (missed := _first_event(self._decode_read(batch))) is not None:
                                return missed
            finally:
                resp.close()
        return None


class KubernetesAsyncioPodApi(_ListWatchApi):
    """``KubernetesPodApi`` and its three capabilities over a ``kubernetes_asyncio``
    ``CoreV1Api``: the pod case of ``KubernetesAsyncioResourceApi`` (the same transport, through
    the typed ``list_namespaced_pod``), under the contract's method names.

    Every request carries a client-side deadline, because ``kubernetes_asyncio`` sends none by
    default and a half-open HTTP/1.1 socket then hangs forever: every watch ends at most
    ``watch_read_margin`` seconds after its ``timeout_seconds``; a LIST that goes silent for
    ``list_read_timeout`` seconds fails, and connecting is bounded by ``connect_timeout``.

    A watch silent for ``watch_probe_after`` seconds (30 s) is probed on another connection
    (``k8s_watch_health``): one the apiserver had an event for ends within seconds
    (``KubernetesConnectionError``, ``stalled``), an idle one is kept, probed again every 15 s of
    silence. Where it cannot be probed, or with ``watch_probe_after=None``, a watch that delivers
    no byte for ``WATCH_IDLE_TIMEOUT`` (90 s) ends (``idle``). ``watch_idle_timeout``, when given,
    is a read-idle deadline on every watch, probed or not, as before the probe existed. ``clock``
    times the probes (a ``FakeClock`` in tests).
    """

    def __init__(
        self,
        *,
        core_v1_api: Any,
        connect_timeout: float = 10.0,
        list_read_timeout: float = 75.0,
        watch_read_margin: float = 10.0,
        watch_idle_timeout: float | None = None,
        watch_probe_after: float | None = WATCH_PROBE_AFTER,
        clock: Clock | None = None,
    ) -> None:
        self._core = self._auth = core_v1_api
        self._configure(
            connect_timeout=connect_timeout,
            list_read_timeout=list_read_timeout,
            watch_read_margin=watch_read_margin,
            watch_idle_timeout=watch_idle_timeout,
            watch_probe_after=watch_probe_after,
            clock=clock,
        )

    def _get(self, namespace: str, **options: Any) -> Any:
        return self._core.list_namespaced_pod(namespace, **options)

    async def list_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> PodListPage:
        """A consistent LIST by default; the other arguments are ``ListOptions``'s."""
        return await self.list_pod_page(
            ListOptions(namespace, label_selector, limit, continue_token, resource_version)
        )

    async def list_pod_page(self, options: ListOptions) -> PodListPage:
        page: PodListPage = _UndecodedPage(await self._read_list(options), self).decode()
        return page

    async def read_pod_page(
        self,
        options: ListOptions,
        *,
        on_head: Callable[[str | None], object] | None = None,
        on_sent: Callable[[], object] | None = None,
    ) -> UndecodedPodPage:
        """``PrefetchPagedPodApi.read_pod_page``; ``on_sent()`` is called once the request is
        written to its connection."""
        return _UndecodedPage(await self._read_list(options, on_head, on_sent), self)

    def stream_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[PodWatchEvent]:
        return self._watch(
            namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )

    def stream_pod_list(
        self, *, namespace: str, label_selector: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        return self._watch(
            namespace,
            label_selector=label_selector,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
            timeout_seconds=timeout_seconds,
        )


METADATA_WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""What client-go's metadata client accepts for a WATCH (``metadata/metadata.go``, its JSON half):
each event's object is a ``PartialObjectMetadata``."""
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""The same for a LIST: the body is a ``PartialObjectMetadataList``."""


class KubernetesAsyncioResourceApi(_ListWatchApi, Generic[_M]):
    """LIST, paged LIST, WATCH, streaming list and the cursor probe of any ``resource`` at the path
    the apiserver serves it (``/api/v1/...``, ``/apis/GROUP/VERSION/...``), its objects decoded
    into ``model`` (``k8s_objects``: the user's model, ``DynamicObject``,
    ``PartialObjectMetadata``) straight from the bytes. Go: ``dynamic.ResourceInterface``
    (kube-rs ``Api<K>``).

    A namespace of ``""`` lists and watches every namespace; a cluster-scoped resource takes
    ``""`` only. Selectors are ``ListOptions``'s (label and field). Deadlines, the watch probe and
    every error are ``KubernetesAsyncioPodApi``'s, whose timeouts it takes; ``api_client`` is a
    ``kubernetes_asyncio`` ``ApiClient`` (a ``CoreV1Api``'s ``api_client``, say).

    ``metadata_only=True`` asks the apiserver for the objects' metadata alone (client-go's
    metadata client, controller-runtime's ``WatchesMetadata``): every request accepts
    ``PartialObjectMetadata`` (a LIST ``PartialObjectMetadataList``), so spec and status never
    cross the wire; decode into ``k8s_objects.PartialObjectMetadata`` (or a model of metadata).
    """

    def __init__(
        self,
        *,
        api_client: Any,
        resource: Resource,
        model: type[_M],
        connect_timeout: float = 10.0,
        list_read_timeout: float = 75.0,
        watch_read_margin: float = 10.0,
        watch_idle_timeout: float | None = None,
        watch_probe_after: float | None = WATCH_PROBE_AFTER,
        clock: Clock | None = None,
        metadata_only: bool = False,
    ) -> None:
        self.api_client = api_client
        self._auth = self
        self.resource = resource
        self.model = model
        self.metadata_only = metadata_only
        self._noun = resource.kind
        self._decoder = ObjectDecoder(model, kind=resource.kind)
        self._decode_list = self._decoder.decode_list  # type: ignore[method-assign]
        self._decode_read = self._decoder.decode_watch_read  # type: ignore[method-assign]
        self._configure(
            connect_timeout=connect_timeout,
            list_read_timeout=list_read_timeout,
            watch_read_margin=watch_read_margin,
            watch_idle_timeout=watch_idle_timeout,
            watch_probe_after=watch_probe_after,
            clock=clock,
        )

    @classmethod
    def beside(
        cls, core_v1_api: Any, *, resource: Resource, model: type[_M], **timeouts: Any
    ) -> KubernetesAsyncioResourceApi[_M]:
        """On the same ``ApiClient`` (connection pool and credentials) as ``core_v1_api``."""
        return cls(api_client=core_v1_api.api_client, resource=resource, model=model, **timeouts)

    def _get(self, namespace: str, **options: Any) -> Any:
        if namespace and not self.resource.namespaced:
            raise KubernetesApiError(
                400, "BadRequest", f"{self.resource.group_resource} is cluster-scoped: no namespace"
            )
        request = {k: options.pop(k) for k in ("_preload_content", "_request_timeout")}
        accept = "application/json"
        if self.metadata_only:
            accept = METADATA_WATCH_ACCEPT if options.get("watch") else METADATA_LIST_ACCEPT
        return self.api_client.call_api(
            self.resource.path(namespace=namespace or None),
            "GET",
            query_params=_query_params(options),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
            **request,
        )

    async def list_objects(
        self, *, namespace: str = "", label_selector: str = "", field_selector: str = ""
    ) -> ListPage[_M]:
        """A consistent LIST (resourceVersion unset) of every object the selectors match."""
        return await self.list_page(
            ListOptions(namespace, label_selector, field_selector=field_selector)
        )

    async def list_page(self, options: ListOptions) -> ListPage[_M]:
        """One page of a LIST, as ``options`` asks (pages and the cursor probe)."""
        page: ListPage[_M] = _UndecodedPage(await self._read_list(options), self).decode()
        return page

    async def read_page(
        self,
        options: ListOptions,
        *,
        on_head: Callable[[str | None], object] | None = None,
        on_sent: Callable[[], object] | None = None,
    ) -> UndecodedPodPage:
        """As ``list_page``, but the body is decoded by the returned page's ``decode()``;
        ``on_head`` and ``on_sent`` as ``read_pod_page``'s."""
        return _UndecodedPage(await self._read_list(options, on_head, on_sent), self)

    def stream(
        self,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[WatchEvent[_M]]:
        """Watch from ``resource_version``; always asks for bookmarks and sends the timeout."""
        return self._watch(
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )

    def stream_list(
        self,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int,
    ) -> AsyncIterator[WatchEvent[_M]]:
        """A streaming list: an ADDED event per object, the initial-events-end BOOKMARK, then the
        watch goes on."""
        return self._watch(
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
            timeout_seconds=timeout_seconds,
        )


_QUERY_NAMES = {
    "label_selector": "labelSelector",
    "field_selector": "fieldSelector",
    "resource_version": "resourceVersion",
    "resource_version_match": "resourceVersionMatch",
    "_continue": "continue",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "send_initial_events": "sendInitialEvents",
    "timeout_seconds": "timeoutSeconds",
}


def _query_params(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A LIST's or a watch's keyword arguments (``list_namespaced_pod``'s names) as the query the
    apiserver reads; empty selectors are left out."""
    query: list[tuple[str, str]] = []
    for key, value in options.items():
        if value is None or value == "":
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        query.append((_QUERY_NAMES.get(key, key), text))
    return query


def _first_event(events: Iterator[Any]) -> str | None:
    """The resourceVersion of the first object event of a probe's decoded batch; an unreadable
    frame is an event too. Raises ``KubernetesApiError`` for an ERROR frame (410 Expired:
    undecided)."""
    try:
        for event in events:
            if event.type == "ERROR":
                raise KubernetesApiError(event.code or 500, "ERROR frame", event.reason)
            if event.object is not None:
                return event.resource_version or "?"
    except FrameDecodeError as err:
        return err.resource_version or "?"
    return None


def _server_of(resp: Any) -> str | None:
    url = getattr(resp, "url", None)
    return None if url is None or url.host is None else f"{url.host}:{url.port}"


def _list_query(options: ListOptions) -> dict[str, Any]:
    """``list_namespaced_pod``'s keyword arguments for what ``options`` sets."""
    query: dict[str, Any] = {}
    if options.resource_version is not None:
        query.update(
            resource_version=options.resource_version, resource_version_match="NotOlderThan"
        )
    if options.limit is not None:
        query.update(limit=options.limit)
    if options.continue_token is not None:
        query.update(_continue=options.continue_token)
    if options.field_selector:
        query.update(field_selector=options.field_selector)
    return query


_REQUEST_WRITTEN: ContextVar[Callable[[], object] | None] = ContextVar(
    "request_written", default=None
)
"""What the LIST request of the running task calls once it is written: a context variable, as
``kubernetes_asyncio`` passes nothing of ours down to the aiohttp request it makes."""


def _announcing_written(api_client: Any) -> None:
    """Makes ``api_client``'s aiohttp session call ``_REQUEST_WRITTEN`` as it writes a request
    (once per session; nothing where there is no aiohttp session, as with a fake client)."""
    session = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    configs = getattr(session, "trace_configs", None)
    if not isinstance(configs, list) or any(
        _request_written in config.on_request_headers_sent for config in configs
    ):
        return
    import aiohttp

    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(_request_written)
    config.freeze()
    configs.append(config)


async def _request_written(_session: Any, _context: Any, params: Any) -> None:
    # aiohttp sends this signal as it hands the headers to its writer, which writes them (a LIST
    # has no body) before the request's task next waits (aiohttp 3.14 ClientRequest.send).
    announce = _REQUEST_WRITTEN.get()
    if announce is not None and params.method != "CONNECT":
        announce()


async def _read_announcing_head(content: Any, on_head: Callable[[str | None], object]) -> bytes:
    chunks: list[bytes] = []
    announced = False
    while chunk := await content.readany():
        chunks.append(chunk)
        if not announced:
            head = b"".join(chunks)
            if list_head_complete(head):
                announced = True
                on_head(peek_continue_token(head))
    body = b"".join(chunks)
    if not announced:
        on_head(peek_continue_token(body))
    return body


class _UndecodedPage:
    def __init__(self, body: bytes, api: _ListWatchApi) -> None:
        self._body = body
        self._api = api

    @property
    def continue_hint(self) -> str | None:
        # Read on demand: the pager takes a leading token from `on_head`, and asks here only when
        # there was none.
        return peek_continue_token(self._body) or peek_trailing_continue_token(self._body)

    def decode(self) -> Any:
        noun = self._api._noun
        page, rejects = self._api._decode_list(self._body)
        for reject in rejects:
            logger.error(
                "%s left out of LIST: %s=%s resourceVersion=%s reason=%s",
                noun,
                noun,
                reject.name,
                reject.resource_version,
                reject.reason,
            )
        return page


@contextmanager
def _failing_when_cut_off(resp: Any) -> Iterator[None]:
    """Fails the body of ``resp`` (``ClientPayloadError``) once its connection closes before the
    body ended, unless aiohttp already failed it.

    aiohttp's C parser (llhttp), on a chunked body whose framing breaks (a chunk-size line that is
    not hex, chunk data not followed by CRLF), drops the body without handing its reader the error
    and closes the connection (``_http_parser.pyx``, ``feed_data``); the sock_read deadline goes
    with it, so the reader waits for bytes that never come. Its pure-Python parser fails the body
    itself. The close is at once over plain TCP and after the TLS close_notify exchange over TLS:
    at once from an apiserver, else when asyncio's ``ssl_shutdown_timeout`` (30 s) gives up. A read
    that starts after the close and before this hook ran meets aiohttp's ``RuntimeError``
    ("Connection closed."), read the same way.
    """
    from aiohttp import ClientPayloadError

    content = resp.content
    connection = resp.connection
    protocol = None if connection is None else connection.protocol
    closed = None if protocol is None else protocol.closed

    def cut_off() -> ClientPayloadError:
        broken = None if protocol is None else protocol.exception()
        if broken is None:
            return ClientPayloadError("the connection closed before the body ended")
        return ClientPayloadError(f"{_malformed(broken)}: the HTTP client closed the connection")

    def fail_unfinished(_: object = None) -> None:
        if not content.is_eof() and content.exception() is None:
            content.set_exception(cut_off())

    if closed is None:
        fail_unfinished()
    else:
        # Reading ``closed`` makes aiohttp create the future; a connection lost with an error
        # (a TLS close_notify after data) sets it, and unretrieved it logged "Future exception was
        # never retrieved" from the collector, in the middle of whatever ran then.
        closed.add_done_callback(_retrieved)
        closed.add_done_callback(fail_unfinished)
    try:
        yield
    except RuntimeError as err:
        if protocol is None or protocol.is_connected() or content.is_eof():
            raise
        raise cut_off() from err
    finally:
        if closed is not None:
            closed.remove_done_callback(fail_unfinished)


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """The client's, aiohttp's and asyncio's exceptions as our own (``_translation``)."""
    try:
        yield
    except Exception as err:
        ours = _translation(what, err)
        if ours is None:
            raise
        raise ours from err


def as_kubernetes_error(exc: BaseException) -> Exception | None:
    """Our own error for an exception of ``kubernetes_asyncio`` or aiohttp raised outside this
    module (a request made on a ``CoreV1Api`` directly, say), so that a caller describes only
    ours; ``None`` for any other exception, or when the client is not installed."""
    if isinstance(exc, TimeoutError) or not isinstance(exc, Exception):
        return None
    try:
        return _translation("request", exc)
    except ImportError:
        return None


def _translation(what: str, err: Exception) -> Exception | None:
    """``err`` as ``KubernetesConnectionError`` (aiohttp's transport errors and asyncio's
    deadline), ``KubernetesApiError`` (``ApiException``) or ``KubernetesConfigError``
    (``ConfigException``); ``None`` if it is none of those."""
    import aiohttp
    from aiohttp.http_exceptions import HttpProcessingError
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config.config_exception import ConfigException

    if isinstance(err, aiohttp.ClientConnectorError):
        kind, reason = _connector_failure(err)
        refused = kind is ConnectionFailure.REFUSED
        return KubernetesConnectionError(
            f"{what}: connection {'refused' if refused else 'failed'}: {err}",
            kind=kind,
            server=f"{err.host}:{err.port}",
            reason=reason,
        )
    if isinstance(err, aiohttp.ClientPayloadError):
        return KubernetesConnectionError(f"{what} cut short: {err}", reason=_text(err))
    if isinstance(err, HttpProcessingError):  # the pure-Python parser's, on a malformed body
        return KubernetesConnectionError(f"{what} cut short: {_malformed(err)}")
    if isinstance(err, TimeoutError):
        return KubernetesConnectionError(
            f"{what} ended by its client deadline: {err}", kind=ConnectionFailure.TIMEOUT
        )
    if isinstance(err, aiohttp.ClientError):
        if isinstance(err.__cause__, HttpProcessingError):  # broken before the head was handed on
            message = f"{what} failed: {_malformed(err.__cause__)}"
        else:
            message = f"{what} failed: {type(err).__name__}: {err}"
        return KubernetesConnectionError(message, reason=_text(err))
    if isinstance(err, ApiException):
        return KubernetesApiError(err.status, err.reason or "", _status_message(err.body) or "")
    if isinstance(err, ConfigException):
        return KubernetesConfigError(str(err))
    return None


def _connector_failure(err: Any) -> tuple[ConnectionFailure, str]:
    import aiohttp

    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return ConnectionFailure.TLS_VERIFICATION, tls_failure_reason(err.certificate_error)
    if isinstance(err, aiohttp.ClientConnectorSSLError):
        return ConnectionFailure.TLS_HANDSHAKE, tls_failure_reason(err.os_error)
    os_error = err.os_error
    reason = os_error.strerror or str(os_error) or type(os_error).__name__
    if os_error.errno == errno.ECONNREFUSED:
        return ConnectionFailure.REFUSED, reason
    return ConnectionFailure.UNREACHABLE, reason


def _text(err: BaseException) -> str:
    return str(err) or type(err).__name__


def _status_message(body: Any) -> str | None:
    """The ``message`` of an ``ApiException``'s Status body, or the body's first line."""
    if isinstance(body, bytes | bytearray):
        body = body.decode(errors="replace")
    if not isinstance(body, str) or not body:
        return None
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip().splitlines()[0]
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else None


def _malformed(err: Any) -> str:
    """The parser's reason without the offending bytes it quotes on the lines after it."""
    reason = str(getattr(err, "message", "") or "").split("\n", 1)[0].strip().rstrip(":")
    return f"the HTTP response is malformed ({reason or type(err).__name__})"


async def _raise_for_status(resp: Any, api: Any) -> None:
    """``KubernetesApiError`` for a non-2xx answer; after a 401, the ``ServiceAccountToken`` of
    ``api``'s client, if it has one, reads its file again before the next request."""
    if 200 <= resp.status <= 299:
        return
    if resp.status == 401:
        _forget_token(api)
    status = decode_status(await resp.content.read(_ERROR_BODY_BYTES))
    raise KubernetesApiError(
        resp.status,
        status.reason or str(resp.reason),
        status.message or "",
        retry_after=parse_retry_after(resp.headers.get("Retry-After")),
    )


def _forget_token(api: Any) -> None:
    """``api`` is an ``XxxApi`` or an ``ApiClient``."""
    configuration = getattr(getattr(api, "api_client", api), "configuration", None)
    hook = getattr(configuration, "refresh_api_key_hook", None)
    if isinstance(hook, ServiceAccountToken):
        hook.forget()


class KubernetesAsyncioLeaseApi:
    """``lease_lock.LeaseApi`` over a ``kubernetes_asyncio`` ``CoordinationV1Api``. Go: the typed
    ``LeaseInterface`` (``Get``, ``Create``, ``Update``).

    A 404 raises ``LeaseNotFoundError``, a 409 ``LeaseConflictError``, any other non-2xx answer
    ``KubernetesApiError`` and a transport failure ``KubernetesConnectionError``. Every request
    ends after ``request_timeout`` seconds: client-go's ``NewFromKubeconfig`` gives the leader
    election client ``max(1 s, RenewDeadline / 2)``, 5 s by default, so one hung request cannot
    use up a renew deadline.
    """

    def __init__(self, *, coordination_v1_api: Any, request_timeout: float = 5.0) -> None:
        self._coordination = coordination_v1_api
        self._timeout = positive_finite("request_timeout", request_timeout)

    @classmethod
    def beside(cls, core_v1_api: Any, *, request_timeout: float = 5.0) -> KubernetesAsyncioLeaseApi:
        """On the same ``ApiClient`` (connection pool and credentials) as ``core_v1_api``."""
        from kubernetes_asyncio import client

        coordination = client.CoordinationV1Api(core_v1_api.api_client)
        return cls(coordination_v1_api=coordination, request_timeout=request_timeout)

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any]:
        read = self._coordination.read_namespaced_lease
        return await self._call("Lease GET", read, name, namespace)

    async def create_lease(self, *, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        create = self._coordination.create_namespaced_lease
        return await self._call("Lease create", create, namespace, lease)

    async def replace_lease(
        self, *, namespace: str, name: str, lease: dict[str, Any]
    ) -> dict[str, Any]:
        replace = self._coordination.replace_namespaced_lease
        return await self._call("Lease update", replace, name, namespace, lease)

    async def _call(self, what: str, method: Any, *args: Any) -> dict[str, Any]:
        import aiohttp

        from miles.utils.workers.reconcile.leaderelection.lease_lock import (
            LeaseConflictError,
            LeaseNotFoundError,
        )

        timeout = aiohttp.ClientTimeout(total=self._timeout)
        with _translated(what):
            resp = await method(*args, _preload_content=False, _request_timeout=timeout)
            try:
                try:
                    await _raise_for_status(resp, self._coordination)
                except KubernetesApiError as error:
                    if error.code == 404:
                        raise LeaseNotFoundError(f"{what}: {error}") from error
                    if error.code == 409:
                        raise LeaseConflictError(f"{what}: {error}") from error
                    raise
                body = await resp.read()
            finally:
                resp.release()
        try:
            lease = json.loads(body)
        except ValueError as error:
            raise KubernetesApiError(resp.status, "undecodable", f"{what}: {error}") from error
        if not isinstance(lease, dict):
            raise KubernetesApiError(resp.status, "undecodable", f"{what}: not a JSON object")
        return lease


_URLS_HELD = 4096


class KubernetesAsyncioTransport:
    """The write client's ``Transport`` over a ``kubernetes_asyncio`` ``ApiClient``: its aiohttp
    session (connection pool, TLS, proxy) and its credentials (``auth_settings``, so a
    ``ServiceAccountToken`` is read as for every other request), the body sent as the bytes given.
    Go: the ``http.Client`` a ``rest.Config`` builds.

    A transport failure raises ``KubernetesConnectionError``; every HTTP answer is returned, its
    body read whole. After a 401, a ``ServiceAccountToken`` reads its file before the next request.

    Requests go through a session of its own on the ``ApiClient``'s connector (so its connections,
    TLS and limit), without ``trust_env``: ``kubernetes_asyncio``'s session has it on, and aiohttp
    then looks up ``~/.netrc`` and the proxy variables on a worker thread for every request (two
    thread round trips per write). The proxy the environment names for the server is looked up
    once, as client-go's ``ProxyFromEnvironment`` caches it; ``.netrc`` is not read (client-go
    never reads it). The session closes with the connector, when the ``ApiClient`` closes.
    """

    def __init__(self, *, api_client: Any, connect_timeout: float = 10.0) -> None:
        self._api_client = api_client
        self._connect_timeout = positive_finite("connect_timeout", connect_timeout)
        self._session: Any = None
        self._env_proxy: Any = None
        self._credentials = BearerCredentials(api_client=api_client)
        self._urls: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._timeouts: dict[float | None, Any] = {}

    def _session_on(self, pool: Any) -> Any:
        if self._session is None or self._session.connector is not pool.connector:
            import aiohttp
            from aiohttp.helpers import get_env_proxy_for_url
            from yarl import URL

            # No cookie jar, as client-go's http.Client has none: aiohttp's filtered the jar
            # for every request and stored each answer's cookies.
            self._session = aiohttp.ClientSession(
                connector=pool.connector,
                connector_owner=False,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            try:
                host = URL(self._api_client.configuration.host)
                self._env_proxy = get_env_proxy_for_url(host)
            except LookupError:
                self._env_proxy = None
        return self._session

    @classmethod
    def beside(cls, core_v1_api: Any) -> KubernetesAsyncioTransport:
        """On the same ``ApiClient`` (connection pool and credentials) as ``core_v1_api``."""
        return cls(api_client=core_v1_api.api_client)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        content_type: str | None = None,
        deadline: float | None = None,
    ) -> RawResponse:
        """``send`` in the shape this transport had before ``Request`` (kept for its callers)."""
        given: dict[str, Any] = {
            "query": query,
            "body": body,
            "content_type": content_type,
            "deadline": deadline,
        }
        return await self.send(Request(method=method, path=path, **given))

    async def send(self, request: Request) -> RawResponse:
        method, path, content_type = request.method, request.path, request.content_type
        api_client = self._api_client
        headers = await self._credentials.headers(content_type)
        rest = api_client.rest_client
        session = self._session_on(rest.pool_manager)
        options: dict[str, Any] = {}
        if rest.proxy:
            options.update(proxy=rest.proxy, proxy_headers=rest.proxy_headers)
        elif self._env_proxy is not None:
            proxy, proxy_auth = self._env_proxy
            options.update(proxy=proxy, proxy_auth=proxy_auth)
        if rest.server_hostname:
            options.update(server_hostname=rest.server_hostname)
        what = f"{method} {path}"
        try:
            async with session.request(
                method,
                self._url(path, request.query),
                data=request.body,
                headers=headers,
                timeout=self._timeout(request.deadline),
                **options,
            ) as resp:
                with _failing_when_cut_off(resp):
                    data = await resp.read()
        except Exception as err:
            ours = _translation(what, err)
            if ours is None:
                raise
            raise ours from err
        if resp.status == 401:
            self._credentials.forget()
        # The headers as aiohttp read them: their names look up in any case, "retry-after" too;
        # a dict of them cost 10 % of the client's CPU per write (bench.writes, merge patch).
        return RawResponse(status=resp.status, body=data, headers=resp.headers)

    def _url(self, path: str, query: Sequence[tuple[str, str]]) -> Any:
        """The request's URL, parsed and encoded once per path and query (a write client writes
        the same few objects again and again); at most ``_URLS_HELD`` are held."""
        key = (path, tuple(query))
        url = self._urls.get(key)
        if url is None:
            from yarl import URL

            if len(self._urls) >= _URLS_HELD:
                self._urls.clear()
            host = self._api_client.configuration.host
            url = URL(host + path).with_query(key[1]) if query else URL(host + path)
            self._urls[key] = url
        return url

    def _timeout(self, deadline: float | None) -> Any:
        timeout = self._timeouts.get(deadline)
        if timeout is None:
            import aiohttp

            connect = self._connect_timeout
            timeout = aiohttp.ClientTimeout(total=deadline, connect=connect, sock_connect=connect)
            self._timeouts = {deadline: timeout}
        return timeout


def require_client() -> None:
    """Raises ``ImportError`` naming ``kubernetes_asyncio`` where the ``[k8s]`` extra is missing, so
    a command says what to install before it looks for a configuration it could not use."""
    import kubernetes_asyncio  # noqa: F401


def in_cluster_configuration(
    environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> Any:
    """A ``kubernetes_asyncio`` ``Configuration`` from the service account
    (``k8s_config.in_cluster_config``), its token through a ``ServiceAccountToken``, so a projected
    token rotated under a running process is picked up within 50 s, and at once after a 401.
    Go: ``rest.InClusterConfig``. Raises ``InClusterConfigError``."""
    return _in_cluster_client_configuration(in_cluster_config(environ, service_account))


def _in_cluster_client_configuration(found: InClusterConfig) -> Any:
    from kubernetes_asyncio import client

    configuration = client.Configuration(host=found.server)
    configuration.ssl_ca_cert = str(found.ca_file)
    found.token(configuration)
    configuration.refresh_api_key_hook = found.token
    return configuration


async def kubeconfig_configuration(kubeconfig: Mapping[str, Any], temp_dir: str) -> Any:
    """A ``kubernetes_asyncio`` ``Configuration`` for a kubeconfig already resolved to one context;
    certificate data it carries inline is written to files in ``temp_dir``.
    Go: ``clientcmd.ClientConfig``. Raises ``KubernetesConfigError``."""
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        await config.load_kube_config_from_dict(
            kubeconfig, client_configuration=configuration, temp_file_path=temp_dir
        )
    except ConfigException as err:
        raise KubernetesConfigError(str(err)) from None
    return configuration


async def client_configuration(config: ClientConfig, temp_dir: str) -> Any:
    """The ``kubernetes_asyncio`` ``Configuration`` for a resolved ``ClientConfig``; certificate
    data is written to files in ``temp_dir`` (``k8s_config.with_data_in_files``).
    Go: ``rest.Config``. Raises ``KubeconfigError`` naming the file and context when the client's
    loader refuses the context."""
    found = config.credentials
    if isinstance(found, InClusterConfig):
        return _in_cluster_client_configuration(found)
    try:
        return await kubeconfig_configuration(with_data_in_files(found, Path(temp_dir)), temp_dir)
    except KubernetesConfigError as err:
        raise KubeconfigError(
            f"kubeconfig {found.source.shown}: context {found.context!r}: {err}"
        ) from None


@asynccontextmanager
async def api_client_session(config: ClientConfig) -> AsyncIterator[Any]:
    """An ``ApiClient`` (connection pool, credentials) for ``config``, closed on exit; the
    certificate data the client writes to files lives in a temporary folder removed on exit."""
    require_client()
    from kubernetes_asyncio import client

    with tempfile.TemporaryDirectory(prefix="miles-reconcile-") as temp_dir:
        configuration = await client_configuration(config, temp_dir)
        async with client.ApiClient(configuration=configuration) as api_client:
            yield api_client


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeSession:
    """An open ``CoreV1Api``, the namespace to use, the server it talks to and the kubeconfig
    context (``None`` in cluster), for error lines; ``write_transport`` is the write client's
    transport on the same configuration (``write_transport``)."""

    core_v1_api: Any
    namespace: str
    server: str
    context: str | None
    write_transport: Transport | None = None


@asynccontextmanager
async def kube_session(
    target: KubeTarget, environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> AsyncIterator[KubeSession]:
    """A ``CoreV1Api`` on its own client session for what ``target`` asks
    (``k8s_config.resolve_config``), closed on exit. A missing ``[k8s]`` extra is named before
    any configuration is looked for. ``service_account`` is where a pod's service account is
    mounted."""
    require_client()
    from kubernetes_asyncio import client

    config = resolve_config(target, environ, service_account)
    async with api_client_session(config) as api_client, write_transport(api_client) as writes:
        yield KubeSession(
            core_v1_api=client.CoreV1Api(api_client),
            namespace=config.namespace,
            server=config.server,
            context=config.context,
            write_transport=writes,
        )


@asynccontextmanager
async def write_transport(
    api_client: Any, *, connect_timeout: float = 10.0
) -> AsyncIterator[Transport]:
    """The write client's transport to the server of ``api_client`` (a ``kubernetes_asyncio``
    ``ApiClient``), its connections closed on exit: ``k8s_http2.Http2Transport`` (HTTP/2 where
    ALPN agrees, else ``k8s_http.HttpTransport``; record row "``client/``: HTTP/2 to the
    apiserver"), or ``KubernetesAsyncioTransport`` where a proxy applies (the configuration's, or
    the environment's for that server), which neither speaks; one INFO line says so."""
    proxy = _proxy_for(api_client)
    if proxy is not None:
        logger.info(
            "writes to %s go through aiohttp's transport: %s applies to it, and the HTTP/2 and "
            "HTTP/1.1 transports speak to no proxy",
            api_client.configuration.host,
            proxy,
        )
        yield KubernetesAsyncioTransport(api_client=api_client, connect_timeout=connect_timeout)
        return
    from miles.utils.workers.reconcile.k8s_http2 import Http2Transport

    fast = Http2Transport.for_api_client(api_client, connect_timeout=connect_timeout)
    async with fast:
        yield fast


def _proxy_for(api_client: Any) -> str | None:
    """Which proxy applies to ``api_client``'s server, if any (named, never its address, which
    may carry credentials)."""
    configuration = api_client.configuration
    if configuration.proxy:
        return "the configuration's proxy"
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        get_env_proxy_for_url(URL(configuration.host))
    except LookupError:
        return None
    return "the environment's proxy (HTTPS_PROXY / HTTP_PROXY, not excluded by NO_PROXY)"
