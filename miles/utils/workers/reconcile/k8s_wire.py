"""What a pod API speaks: pages, watch events and errors, decoded straight from the response bytes.
Go: apimachinery's ``watch.Event`` and ``StreamWatcher`` decoding, and ``apierrors``.

Pure: no HTTP client is imported here; ``k8s_api`` moves the bytes and translates its transport's
exceptions into ``KubernetesApiError`` and ``KubernetesConnectionError`` at that boundary.

Decoding is two functions, ``decode_pod_list`` and ``decode_watch_line`` (``decode_watch_read``
over the lines of one read), plus ``iter_lines`` to frame a byte stream. They raise only
``FrameDecodeError`` (a ``ValueError``), whatever the bytes: see its docstring for what a caller may
rely on. Both cut each pod's ``managedFields`` out of the bytes before validating them
(``without_managed_fields``), and validate the bytes whole where the cut ones do not validate.

``decode_pod_list`` pauses the cyclic garbage collector while it runs (``gc_pause.COLLECTOR``):
validating a page builds hundreds of thousands of acyclic objects, each allocation counts toward a
collection, and every generation-2 pass walks the whole growing heap (about 45% of a 10k-pod LIST's
decode CPU, see ``bench/apiserver.py``). The pause is shared with ``k8s_pager``, which holds it
across a whole paged LIST.

Two rules classify a failed LIST or WATCH for the reflector, whoever raised it:
``exception_rejects_cursor`` (only a relist recovers; Go's ``isExpiredError`` and
``isTooLargeResourceVersionError``) and ``exception_keeps_cursor`` (the server is throttling or
unreachable: retry from the same cursor; Go's ``isWatchErrorRetriable``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.k8s_types import FrameMetadata, Pod, WatchFrame

logger = logging.getLogger(__name__)

POD_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})
CURSOR_REJECTED_CODES = frozenset({410, 504})
"""410 Expired/Gone, and 504 (reason Timeout, cause ResourceVersionTooLarge): a resourceVersion
beyond the server's history, answered on a LIST that carries it and on a ``sendInitialEvents``
watch (a plain watch from it waits silently instead)."""
CURSOR_REJECTED_REASONS = frozenset({"Expired", "Gone"})
"""Status reasons of a dead cursor, as apimachinery's ``IsResourceExpired`` / ``IsGone`` read them:
they key on the reason, whatever the code."""
TOO_MANY_REQUESTS = 429
INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
"""Set to ``"true"`` on the bookmark that ends a streaming list's initial events
(metav1 ``InitialEventsAnnotationKey``)."""
MAX_LINE_BYTES = 64 * 2**20
"""Far above etcd's 1.5 MiB object limit; a longer line is read as an undecodable frame."""


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
    ``rejects_cursor`` (its Status code is 410 or 504, or its reason Expired or Gone: only a relist
    recovers), its Status ``code``, and, in ``reason``, the Status's code, reason and message for
    the log line. A BOOKMARK that ends a streaming list's initial events has
    ``initial_events_end``."""

    type: str
    pod: Pod | None
    resource_version: str | None
    rejects_cursor: bool = False
    reason: str = ""
    initial_events_end: bool = False
    code: int | None = None

    @classmethod
    def from_frame(cls, *, event_type: str, obj: Any) -> PodWatchEvent:
        """An event from a ``kubernetes_asyncio`` ``Watch`` frame (``frame["type"]``,
        ``frame["object"]``): the object may be a model, a snake_case or camelCase dict.

        Raises ``FrameDecodeError`` as ``decode_watch_line`` does: with ``resource_version`` set
        for a readable pod frame whose pod does not validate, without it for an unknown type or a
        pod frame with no readable metadata.
        """
        if event_type in POD_EVENT_TYPES:
            try:
                pod = Pod.model_validate(obj)
            except ValidationError as err:
                meta = WatchFrame.model_validate(obj).metadata
                if meta.resource_version is None:
                    raise FrameDecodeError(
                        f"unreadable {event_type} frame: {_summary(err)}", name=meta.name
                    ) from None
                raise FrameDecodeError(
                    f"{event_type} pod does not validate: {_summary(err)}",
                    name=meta.name,
                    resource_version=meta.resource_version,
                    event_type=event_type,
                ) from None
            return cls(event_type, pod, pod.metadata.resource_version)
        status = WatchFrame.model_validate(obj)
        if event_type == "BOOKMARK":
            return cls(
                "BOOKMARK",
                None,
                status.metadata.resource_version,
                initial_events_end=_marks_initial_events_end(obj),
            )
        if event_type == "ERROR":
            return _error_event(status)
        raise FrameDecodeError(
            f"invalid watch event type {str(event_type)[:40]!r}", name=status.metadata.name
        )


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
    """A LIST or WATCH answered with a non-2xx HTTP status (the body's Status when readable).

    ``retry_after`` is the response's ``Retry-After`` in seconds, when it gave one in that form.
    """

    def __init__(
        self, code: int, reason: str, message: str = "", *, retry_after: float | None = None
    ) -> None:
        super().__init__(f"HTTP {code} {reason}: {message}" if message else f"HTTP {code} {reason}")
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def rejects_cursor(self) -> bool:
        return status_rejects_cursor(self.code, self.reason)


class KubernetesConnectionError(ConnectionError):
    """A LIST or WATCH that failed below HTTP: the connection was refused (``refused``), could not
    be made, broke, was cut mid-body, or went silent past its read deadline (``idle``)."""

    def __init__(self, message: str, *, refused: bool = False, idle: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.idle = idle


def status_rejects_cursor(code: int | None, reason: str | None) -> bool:
    """Whether a Status with this code and reason means the cursor is dead."""
    return code in CURSOR_REJECTED_CODES or reason in CURSOR_REJECTED_REASONS


def exception_rejects_cursor(exc: BaseException) -> bool:
    """Whether a LIST or WATCH failure means the cursor is dead and only a relist recovers.

    True for our ``KubernetesApiError`` with code 410 or 504; for any exception carrying an int
    ``status`` or ``code`` of 410 or 504 (``kubernetes_asyncio``'s and the official client's
    ``ApiException``); and for a Status reason ``Expired`` or ``Gone``, read from ``reason`` (also
    in ``kubernetes_asyncio``'s ``"Expired: message"`` form) or from a JSON Status ``body``, as
    apimachinery's ``IsResourceExpired`` and ``IsGone`` key on the reason.
    """
    if isinstance(exc, KubernetesApiError):
        return exc.rejects_cursor
    if any(code in CURSOR_REJECTED_CODES for code in _int_attributes(exc, "status", "code")):
        return True
    return _status_reason(exc) in CURSOR_REJECTED_REASONS


def exception_keeps_cursor(exc: BaseException) -> bool:
    """Whether a WATCH failure is one to retry from the same cursor after a backoff step: HTTP 429,
    or a connection refused anywhere in the exception's chain. Go: ``isWatchErrorRetriable``
    (``utilnet.IsConnectionRefused`` or ``apierrors.IsTooManyRequests``)."""
    if TOO_MANY_REQUESTS in _int_attributes(exc, "status", "code"):
        return True
    if _status_reason(exc) == "TooManyRequests":
        return True
    return exception_is_refused(exc)


def exception_is_refused(exc: BaseException) -> bool:
    """Whether the server refused the connection (nothing listening), anywhere in the chain."""
    return any(_is_refused(link) for link in _chain(exc))


def exception_retry_after(exc: BaseException) -> float | None:
    """The seconds a failure asked the client to wait (``Retry-After``), if it said so."""
    if isinstance(exc, KubernetesApiError):
        return exc.retry_after
    headers = getattr(exc, "headers", None)
    getter = getattr(headers, "get", None)
    return parse_retry_after(getter("Retry-After") if callable(getter) else None)


def parse_retry_after(value: object) -> float | None:
    """A ``Retry-After`` header's delay in seconds; ``None`` for an absent, negative or HTTP-date
    value (the apiserver sends whole seconds)."""
    if not isinstance(value, str):
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


def exception_summary(err: BaseException) -> str:
    """The exception's type and text on one line (``ApiException``'s text spans several)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _int_attributes(exc: BaseException, *names: str) -> list[int]:
    values = (getattr(exc, name, None) for name in names)
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _status_reason(exc: BaseException) -> str | None:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.split(":", 1)[0].strip()
    body = getattr(exc, "body", None)
    if isinstance(body, str | bytes) and body:
        try:
            return WatchFrame.model_validate_json(body).reason
        except ValidationError:
            return None
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _is_refused(exc: BaseException) -> bool:
    if isinstance(exc, KubernetesConnectionError):
        return exc.refused
    return isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    )


def _marks_initial_events_end(obj: Any) -> bool:
    metadata = obj.get("metadata") if isinstance(obj, dict) else getattr(obj, "metadata", None)
    if isinstance(metadata, dict):
        annotations = metadata.get("annotations")
    else:
        annotations = getattr(metadata, "annotations", None)
    return (
        isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true"
    )


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _ListMeta(_Envelope):
    resource_version: str = Field(default="", alias="resourceVersion")
    continue_token: str | None = Field(default=None, alias="continue")


class _ListHead(_Envelope):
    metadata: _ListMeta = Field(default_factory=_ListMeta)


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
    type: Literal["ERROR"]
    object: WatchFrame = Field(default_factory=WatchFrame)


class _BookmarkFrame(_Envelope):
    type: Literal["BOOKMARK"]
    object: Any = None


class _AnyFrame(_Envelope):
    type: Any = None
    object: WatchFrame = Field(default_factory=WatchFrame)
    code: Any = None


_FRAME: TypeAdapter[_PodFrame | _StatusFrame | _BookmarkFrame] = TypeAdapter(
    Annotated[_PodFrame | _StatusFrame | _BookmarkFrame, Field(discriminator="type")]
)


def decode_pod_list(body: bytes) -> tuple[PodListPage, list[FrameDecodeError]]:
    """A LIST body as a page, plus one error per item that is not a valid pod (left out)."""
    with COLLECTOR.held():
        try:
            page = _validated(_PodList.model_validate_json, body)
        except ValidationError:
            return _decode_pod_list_item_by_item(body)
    return _page(page.items, page.metadata), []


_MANAGED_FIELDS = b',"managedFields":['
_Validated = TypeVar("_Validated")


def _validated(
    validate: Callable[[bytes], _Validated], data: bytes, *, most: int | None = None
) -> _Validated:
    """``validate`` over ``data`` without its managed fields, or, when that fails, as it came."""
    cut = without_managed_fields(data, most=most)
    if cut is not data:
        try:
            return validate(cut)
        except ValidationError:
            pass
    return validate(data)


def without_managed_fields(data: bytes, *, most: int | None = None) -> bytes:
    """A pod's, a watch frame's or a LIST body's JSON without each pod's ``metadata.managedFields``,
    which no model reads; data without them is returned as it is. They are 44-45% of a pod's bytes
    as an apiserver writes them, and pydantic-core would parse them in full only to drop them
    (controller-runtime drops them after decoding, ``TransformStripManagedFields``).

    Each array runs from ``,"managedFields":[`` to the first ``]`` after it. The opening cannot
    match inside a JSON string (a quote there is always escaped), and a managed-fields entry holds
    only strings and the ``fieldsV1`` trie of objects, never an array, so the first ``]`` outside a
    string closes the array. One inside a string (a trie key may quote a value) cuts the data in
    the middle of that string, which leaves JSON that does not parse: a caller whose cut data does
    not validate decodes the data it was given instead. ``most`` stops the search after that many
    arrays (1 for a watch line: the search for a second one cost a third of the cut)."""
    if not isinstance(data, bytes):  # a str line, as the decoders also accept
        return data
    parts: list[bytes] = []
    taken = 0
    while (start := data.find(_MANAGED_FIELDS, taken)) != -1:
        end = data.find(b"]", start + len(_MANAGED_FIELDS))
        if end == -1:
            break
        parts.append(data[taken:start])
        taken = end + 1
        if len(parts) == most:
            break
    if not parts:
        return data
    parts.append(data[taken:])
    return b"".join(parts)


_ITEMS_KEY = b',"items":'
_HEAD_BYTES = 64 * 2**10


def list_head_complete(head: bytes) -> bool:
    """Whether the first bytes of a LIST body suffice for ``peek_continue_token``: they reach the
    items, or as far as it looks."""
    return len(head) >= _HEAD_BYTES or head.find(_ITEMS_KEY) != -1


def peek_continue_token(body: bytes) -> str | None:
    """The continue token of a LIST body read from what precedes its items, without decoding them;
    ``None`` when there is none or the body does not begin ``{"kind":…,"metadata":{…},"items":``
    as the apiserver writes it. ``decode_pod_list`` reads the authoritative one."""
    end = body.find(_ITEMS_KEY, 0, _HEAD_BYTES)
    if end == -1:
        return None
    try:
        head = _ListHead.model_validate_json(body[:end] + b"}")
    except ValidationError:
        return None
    return head.metadata.continue_token or None


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
        frame = _validated(_FRAME.validate_json, line, most=1)
    except ValidationError as err:
        return _decode_rejected_line(line, err)
    if isinstance(frame, _PodFrame):
        return PodWatchEvent(frame.type, frame.object, frame.object.metadata.resource_version)
    if isinstance(frame, _BookmarkFrame):
        return PodWatchEvent.from_frame(event_type="BOOKMARK", obj=frame.object)
    return _error_event(frame.object)


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
        "ERROR",
        None,
        None,
        rejects_cursor=status_rejects_cursor(status.code, status.reason),
        reason=reason,
        code=status.code,
    )


def decode_status(body: bytes) -> WatchFrame:
    """An error response's body as a Status; an unreadable one reads as an empty Status."""
    try:
        return WatchFrame.model_validate_json(body)
    except ValidationError:
        return WatchFrame()


def _summary(err: ValidationError, *, skip: int = 0, limit: int = 3) -> str:
    parts = [
        ": ".join(filter(None, (".".join(str(p) for p in e["loc"][skip:]), e["msg"])))
        for e in err.errors(include_url=False, include_input=False)[:limit]
    ]
    more = err.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


class ByteStream(Protocol):
    async def readany(self) -> bytes: ...


async def iter_lines(
    content: ByteStream,
    max_line_bytes: int = MAX_LINE_BYTES,
    *,
    idle_timeout: float | None = None,
) -> AsyncIterator[bytes]:
    """Non-blank lines of a byte stream, however long; see ``iter_line_batches``."""
    async for batch in iter_line_batches(content, max_line_bytes, idle_timeout=idle_timeout):
        for line in batch:
            yield line


async def iter_line_batches(
    content: ByteStream,
    max_line_bytes: int = MAX_LINE_BYTES,
    *,
    idle_timeout: float | None = None,
) -> AsyncGenerator[list[bytes], None]:
    """The non-blank lines each read of a byte stream completes, one list per read.

    A stream that ends inside a line raises ``KubernetesConnectionError`` after the complete lines
    before it; so does one that delivers nothing for ``idle_timeout`` seconds (``idle=True``).
    """
    buffer = bytearray()
    guarded = (
        nullcontext(content) if idle_timeout is None else ReadIdleDeadline(content, idle_timeout)
    )
    with guarded as stream:
        while chunk := await stream.readany():
            scan_from = len(buffer)
            buffer += chunk
            start = 0
            lines: list[bytes] = []
            while (end := buffer.find(b"\n", max(start, scan_from))) != -1:
                line = bytes(buffer[start:end])
                start = end + 1
                if line.strip():
                    lines.append(line)
            del buffer[:start]
            if lines:
                yield lines
            if len(buffer) > max_line_bytes:
                raise FrameDecodeError(f"watch line longer than {max_line_bytes} bytes")
    if buffer.strip():
        raise KubernetesConnectionError(f"stream ended inside a frame ({len(buffer)} bytes)")


def decode_watch_lines(lines: list[bytes]) -> tuple[list[PodWatchEvent], FrameDecodeError | None]:
    """``decode_watch_line`` over ``lines`` in order, with the cyclic collector paused as
    ``decode_pod_list`` pauses it, up to the first line that does not decode, whose error is
    returned beside the events before it. A streaming list's initial events arrive many to a read,
    and decoded one by one with the collector on they cost about four times as much CPU."""
    events: list[PodWatchEvent] = []
    with COLLECTOR.held():
        for line in lines:
            try:
                events.append(decode_watch_line(line))
            except FrameDecodeError as err:
                return events, err
    return events, None


def decode_watch_read(lines: list[bytes], *, listing: bool) -> Iterator[PodWatchEvent]:
    """The events of one read's ``lines``, in order; raises ``FrameDecodeError`` at the first line
    that does not decode, after the events before it.

    ``listing`` (a streaming list's initial events, many ADDED to a read, each kept): the read is
    decoded whole with the collector paused (``decode_watch_lines``). Otherwise each line is decoded
    only once the caller has taken the event before it, so that a MODIFIED pod's old copy is freed
    before the next pod is built and the collector's count does not climb a read ahead (row "What
    the collector costs per WATCH event" in docs/reconcile-loop.md)."""
    if listing:
        events, failure = decode_watch_lines(lines)
        yield from events
        if failure is not None:
            raise failure
        return
    for line in lines:
        yield decode_watch_line(line)


class ReadIdleDeadline:
    """``content`` read through a deadline: a read that has waited ``idle`` seconds for bytes ends,
    with one timer for the whole stream.

    A read notes when it started and waits inside an ``asyncio.timeout`` with no deadline of its
    own; the one timer, armed for the ``with`` block, when it fires, expires the read that has
    waited too long, or else re-arms for the read waiting now. A deadline per read
    (``asyncio.timeout(idle)``) scheduled and cancelled one timer per read, and its cancelled
    handles stayed in the event loop's heap until the loop purged them, about a hundred reads
    later. The deadline never spans the caller's ``yield``: a broken chunked body never ends
    aiohttp's reader, and a peer gone without a FIN never sends another byte, but the time the
    caller takes between reads is not silence.
    """

    def __init__(self, content: ByteStream, idle: float) -> None:
        self._content = content
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._read_started = 0.0
        self._reading: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> ReadIdleDeadline:
        self._timer = self._loop.call_at(self._loop.time() + self._idle, self._check)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def readany(self) -> bytes:
        self._read_started = self._loop.time()
        reading = self._reading = asyncio.timeout(None)
        try:
            async with reading:
                return await self._content.readany()
        except TimeoutError:
            if not reading.expired():
                raise
            raise KubernetesConnectionError(
                f"nothing read for {self._idle:g}s (read-idle deadline)", idle=True
            ) from None
        finally:
            self._reading = None

    def _check(self) -> None:
        now = self._loop.time()
        if self._reading is None:
            self._timer = self._loop.call_at(now + self._idle, self._check)
        elif now - self._read_started >= self._idle:
            self._reading.reschedule(now)
        else:
            self._timer = self._loop.call_at(self._read_started + self._idle, self._check)
