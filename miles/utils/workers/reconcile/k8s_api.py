"""Pod LIST and WATCH, decoded straight from the bytes. Go: typed ``PodInterface.List``/``Watch``.

The only module that touches ``kubernetes_asyncio``, and only through the ``CoreV1Api`` object it is
given: every call passes ``_preload_content=False``, so the client's own model deserializer (tens of
times slower than a partial pydantic model validated from bytes, see ``bench/decode.py``, and run
after a second ``json`` round trip per frame by its ``Watch``) never runs. ``aiohttp`` is imported
lazily, so the loop stays importable without the ``k8s`` extra.

Decoding is two pure functions, ``decode_pod_list`` and ``decode_watch_line``. They raise only
``FrameDecodeError`` (a ``ValueError``), whatever the bytes: see its docstring for what a caller may
rely on. ``stream_pods`` ends by raising it at the first frame it cannot decode, as apimachinery's
``StreamWatcher`` ends at one; what happens next is the reflector's decision.

``decode_pod_list`` pauses the cyclic garbage collector while it runs: validating a page builds
hundreds of thousands of acyclic objects, each allocation counts toward a collection, and every
generation-2 pass walks the whole growing heap (about 45% of a 10k-pod LIST's decode CPU, see
``bench/apiserver.py``). The switch is process-global, but the decode is synchronous: no other
coroutine runs while it is off, and it is restored before the function returns.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from miles.utils.workers.reconcile.k8s_types import FrameMetadata, Pod, WatchFrame

logger = logging.getLogger(__name__)

POD_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})
CURSOR_REJECTED_CODES = frozenset({410, 504})
"""410 Expired/Gone, and 504 (reason Timeout, cause ResourceVersionTooLarge): a resourceVersion
beyond the server's history, answered on a LIST that carries it and on a ``sendInitialEvents``
watch (a plain watch from it waits silently instead)."""
MAX_LINE_BYTES = 64 * 2**20
"""Far above etcd's 1.5 MiB object limit; a longer line is read as an undecodable frame."""
_ERROR_BODY_BYTES = 64 * 2**10


@dataclass(frozen=True, slots=True)
class PodListPage:
    """One LIST response. ``continue_token`` (``metadata.continue``) is set when more pages follow
    at the same ``resource_version``."""

    pods: tuple[Pod, ...]
    resource_version: str
    continue_token: str | None = None


@dataclass(frozen=True, slots=True)
class PodWatchEvent:
    """One watch frame. ``pod`` is set for ADDED/MODIFIED/DELETED. An ERROR frame carries
    ``rejects_cursor`` (its Status code is 410 or 504: only a relist recovers) and, in ``reason``,
    the Status's code, reason and message for the log line."""

    type: str
    pod: Pod | None
    resource_version: str | None
    rejects_cursor: bool = False
    reason: str = ""


class FrameDecodeError(ValueError):
    """A LIST body, list item or watch line that cannot be read as what it claims to be.

    ``reason`` says why, without the offending bytes. ``name``, ``resource_version`` and
    ``event_type`` are read from the frame when its envelope allows. A watch frame whose
    ``resource_version`` is set was a well-formed pod frame (type ADDED/MODIFIED/DELETED, in
    ``event_type``, and a readable ``metadata.resourceVersion``) whose pod does not validate, so a
    watcher can move its cursor past it; a frame without one is unreadable.
    """

    def __init__(
        self,
        reason: str,
        *,
        name: str | None = None,
        resource_version: str | None = None,
        event_type: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.name = name
        self.resource_version = resource_version
        self.event_type = event_type


class KubernetesApiError(Exception):
    """A LIST or WATCH answered with a non-2xx HTTP status (the body's Status when readable)."""

    def __init__(self, code: int, reason: str, message: str = "") -> None:
        super().__init__(f"HTTP {code} {reason}: {message}" if message else f"HTTP {code} {reason}")
        self.code = code
        self.reason = reason
        self.message = message

    @property
    def rejects_cursor(self) -> bool:
        return self.code in CURSOR_REJECTED_CODES


class KubernetesPodApi(Protocol):
    async def list_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> PodListPage:
        """A consistent LIST by default (resourceVersion unset). With ``resource_version``, a LIST
        not older than it (``resourceVersionMatch=NotOlderThan``), which a server rejects when the
        version is beyond its history; ``limit`` caps the items (Go's ``ListOptions.Limit``) and
        ``continue_token`` asks for the page after the one that returned it (Go's
        ``ListOptions.Continue``: 410 once expired, never combined with ``resource_version``)."""
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


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _ListMeta(_Envelope):
    resource_version: str = Field(default="", alias="resourceVersion")
    continue_token: str | None = Field(default=None, alias="continue")


class _PodList(_Envelope):
    metadata: _ListMeta = Field(default_factory=_ListMeta)
    items: list[Pod]


class _RawPodList(_Envelope):
    metadata: _ListMeta = Field(default_factory=_ListMeta)
    items: list[Any] | None = None


class _PodFrame(_Envelope):
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: Pod


class _StatusFrame(_Envelope):
    type: Literal["BOOKMARK", "ERROR"]
    object: WatchFrame = Field(default_factory=WatchFrame)


class _AnyFrame(_Envelope):
    type: Any = None
    object: WatchFrame = Field(default_factory=WatchFrame)
    code: Any = None


_FRAME: TypeAdapter[_PodFrame | _StatusFrame] = TypeAdapter(
    Annotated[_PodFrame | _StatusFrame, Field(discriminator="type")]
)


def decode_pod_list(body: bytes) -> tuple[PodListPage, list[FrameDecodeError]]:
    """A LIST body as a page, plus one error per item that is not a valid pod (left out)."""
    with _collector_paused():
        try:
            page = _PodList.model_validate_json(body)
        except ValidationError:
            return _decode_pod_list_item_by_item(body)
    return _page(page.items, page.metadata), []


@contextmanager
def _collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _page(pods: list[Pod], meta: _ListMeta) -> PodListPage:
    return PodListPage(tuple(pods), meta.resource_version, meta.continue_token or None)


def _decode_pod_list_item_by_item(body: bytes) -> tuple[PodListPage, list[FrameDecodeError]]:
    try:
        raw = _RawPodList.model_validate_json(body)
    except ValidationError as err:
        raise FrameDecodeError(f"unreadable pod list: {_summary(err)}") from None
    pods: list[Pod] = []
    rejects: list[FrameDecodeError] = []
    for item in raw.items or ():
        try:
            pods.append(Pod.model_validate(item))
        except ValidationError as err:
            meta = FrameMetadata.model_validate(
                item.get("metadata") if isinstance(item, dict) else {}
            )
            rejects.append(
                FrameDecodeError(
                    _summary(err), name=meta.name, resource_version=meta.resource_version
                )
            )
    return _page(pods, raw.metadata), rejects


def decode_watch_line(line: bytes) -> PodWatchEvent:
    """One watch line (``{"type": ..., "object": ...}``) as an event; raises ``FrameDecodeError``.

    A bare ``Status`` line (no ``type``, a ``code``) reads as an ERROR frame, as
    ``kubernetes_asyncio`` reads it.
    """
    try:
        frame = _FRAME.validate_json(line)
    except ValidationError as err:
        return _decode_rejected_line(line, err)
    if isinstance(frame, _PodFrame):
        return PodWatchEvent(frame.type, frame.object, frame.object.metadata.resource_version)
    status = frame.object
    if frame.type == "BOOKMARK":
        return PodWatchEvent("BOOKMARK", None, status.metadata.resource_version)
    return _error_event(status)


def _decode_rejected_line(line: bytes, err: ValidationError) -> PodWatchEvent:
    try:
        frame = _AnyFrame.model_validate_json(line)
    except ValidationError as envelope_err:
        raise FrameDecodeError(f"unreadable watch frame: {_summary(envelope_err)}") from None
    meta = frame.object.metadata
    if frame.type is None and isinstance(frame.code, int):
        return _error_event(WatchFrame.model_validate_json(line))
    if not isinstance(frame.type, str) or frame.type not in POD_EVENT_TYPES:
        raise FrameDecodeError(f"invalid watch event type {str(frame.type)[:40]!r}", name=meta.name)
    raise FrameDecodeError(
        f"{frame.type} pod does not validate: {_summary(err, skip=1)}",
        name=meta.name,
        resource_version=meta.resource_version,
        event_type=frame.type,
    )


def _error_event(status: WatchFrame) -> PodWatchEvent:
    reason = f"{status.code} {status.reason or ''}: {status.message or ''}"[:500]
    return PodWatchEvent(
        "ERROR", None, None, rejects_cursor=status.code in CURSOR_REJECTED_CODES, reason=reason
    )


def _summary(err: ValidationError, *, skip: int = 0, limit: int = 3) -> str:
    parts = [
        ": ".join(filter(None, (".".join(str(p) for p in e["loc"][skip:]), e["msg"])))
        for e in err.errors(include_url=False, include_input=False)[:limit]
    ]
    more = err.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


class _ByteStream(Protocol):
    async def readany(self) -> bytes: ...


async def iter_lines(
    content: _ByteStream, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[bytes]:
    """Non-blank lines of a byte stream, however long; a partial last line is dropped."""
    buffer = bytearray()
    while chunk := await content.readany():
        scan_from = len(buffer)
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", max(start, scan_from))) != -1:
            line = bytes(buffer[start:end])
            start = end + 1
            if line.strip():
                yield line
        del buffer[:start]
        if len(buffer) > max_line_bytes:
            raise FrameDecodeError(f"watch line longer than {max_line_bytes} bytes")
    if buffer.strip():
        logger.warning("pod watch stream ended inside a frame; dropped %d bytes", len(buffer))


class KubernetesAsyncioPodApi:
    """``KubernetesPodApi`` over a ``kubernetes_asyncio`` ``CoreV1Api``.

    Every request carries a client-side timeout, because ``kubernetes_asyncio`` sends none by
    default and a half-open HTTP/1.1 socket then hangs forever: a watch ends at most
    ``watch_read_margin`` seconds after its ``timeout_seconds``, a LIST that goes silent for
    ``list_read_timeout`` seconds fails, and connecting is bounded by ``connect_timeout``.
    """

    def __init__(
        self,
        *,
        core_v1_api: Any,
        connect_timeout: float = 10.0,
        list_read_timeout: float = 75.0,
        watch_read_margin: float = 10.0,
    ) -> None:
        self._core = core_v1_api
        self._connect_timeout = connect_timeout
        self._list_read_timeout = list_read_timeout
        self._watch_read_margin = watch_read_margin

    async def list_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> PodListPage:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
            sock_read=self._list_read_timeout,
        )
        options: dict[str, Any] = {}
        if resource_version is not None:
            options.update(resource_version=resource_version, resource_version_match="NotOlderThan")
        if limit is not None:
            options.update(limit=limit)
        if continue_token is not None:
            options.update(_continue=continue_token)
        resp = await self._core.list_namespaced_pod(
            namespace,
            label_selector=label_selector,
            _preload_content=False,
            _request_timeout=timeout,
            **options,
        )
        try:
            await _raise_for_status(resp)
            body = await resp.read()
        finally:
            resp.release()
        page, rejects = decode_pod_list(body)
        for reject in rejects:
            logger.error(
                "pod left out of LIST: pod=%s resourceVersion=%s reason=%s",
                reject.name,
                reject.resource_version,
                reject.reason,
            )
        return page

    async def stream_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[PodWatchEvent]:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=timeout_seconds + self._watch_read_margin,
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
        )
        resp = await self._core.list_namespaced_pod(
            namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=timeout,
        )
        cursor = resource_version
        try:
            await _raise_for_status(resp)
            async for line in iter_lines(resp.content):
                event = decode_watch_line(line)
                cursor = event.resource_version or cursor
                yield event
        except aiohttp.ClientPayloadError as err:
            logger.warning("pod watch cut short after resourceVersion=%s: %s", cursor, err)
        except TimeoutError:
            logger.warning(
                "pod watch ended by its %.1fs client read timeout after resourceVersion=%s",
                timeout.total,
                cursor,
            )
        finally:
            resp.close()


async def _raise_for_status(resp: Any) -> None:
    if 200 <= resp.status <= 299:
        return
    body = await resp.content.read(_ERROR_BODY_BYTES)
    try:
        status = WatchFrame.model_validate_json(body)
    except ValidationError:
        status = WatchFrame()
    raise KubernetesApiError(resp.status, status.reason or str(resp.reason), status.message or "")
