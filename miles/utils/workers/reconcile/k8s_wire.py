"""A pod API's response bytes decoded: LIST pages and watch lines. Go: apimachinery's
``watch.Decoder`` (``streaming.NewDecoder``) and the JSON serializer's ``Decode``.

Pure: no HTTP client and no event loop; ``k8s_framing`` cuts a body into lines and ``k8s_api``
moves the bytes.

Decoding is two functions, ``decode_pod_list`` and ``decode_watch_line`` (``decode_watch_read``
over the lines of one read). They raise only ``FrameDecodeError`` (a ``ValueError``), whatever the
bytes: see its docstring for what a caller may rely on. Both cut each pod's ``managedFields`` out of
the bytes before validating them (``without_managed_fields``), and validate the bytes whole where
the cut ones do not validate.

``decode_pod_list`` pauses the cyclic garbage collector while it runs (``gc_pause.COLLECTOR``):
validating a page builds hundreds of thousands of acyclic objects, each allocation counts toward a
collection, and every generation-2 pass walks the whole growing heap (about 45% of a 10k-pod LIST's
decode CPU, see ``bench/apiserver.py``). The pause is shared with ``k8s_pager``, which holds it
across a whole paged LIST.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json

from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.item_runs import item_spans
from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError
from miles.utils.workers.reconcile.k8s_objects import DynamicObject, deferred_validator
from miles.utils.workers.reconcile.k8s_types import (
    FrameMetadata,
    Pod,
    WatchFrame,
    validation_summary,
)
from miles.utils.workers.reconcile.k8s_values import (
    POD_EVENT_TYPES,
    ListPage,
    PodListPage,
    PodWatchEvent,
    WatchEvent,
)
from miles.utils.workers.reconcile.managed_fields import (
    validated_without_managed_fields,
    without_managed_fields,
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
            page = validated_without_managed_fields(_PodList.model_validate_json, body)
        except ValidationError:
            return _decode_pod_list_item_by_item(body)
    return _page(page.items, page.metadata), []


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


_METADATA_KEY = b'"metadata":'
_TAIL_BYTES = 16 * 2**10
_BLANK = b" \t\r\n"


def peek_trailing_continue_token(body: bytes) -> str | None:
    """The continue token of a LIST body whose ``metadata`` follows its items, read from its last
    bytes without decoding them; ``None`` when there is none or the body does not end
    ``"metadata":{…}}``. The apiserver writes a custom resource's list so (unstructured, its keys
    sorted: ``{"apiVersion":…,"items":[…],"kind":…,"metadata":{…}}``)."""
    stop = len(body)
    while stop and body[stop - 1] in _BLANK:
        stop -= 1
    start = body.rfind(_METADATA_KEY, max(0, stop - _TAIL_BYTES), stop)
    if start == -1 or body[stop - 1 : stop] != b"}":
        return None
    try:
        meta = _ListMeta.model_validate_json(body[start + len(_METADATA_KEY) : stop - 1])
    except ValidationError:
        return None
    return meta.continue_token or None


def _page(pods: list[Pod], meta: _ListMeta) -> PodListPage:
    return PodListPage(tuple(pods), meta.resource_version, meta.continue_token or None)


def _decode_pod_list_item_by_item(body: bytes) -> tuple[PodListPage, list[FrameDecodeError]]:
    try:
        raw = _RawPodList.model_validate_json(body)
    except ValidationError as err:
        raise FrameDecodeError(f"unreadable pod list: {validation_summary(err)}") from None
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
                    validation_summary(err), name=meta.name, resource_version=meta.resource_version
                )
            )
    return _page(pods, raw.metadata), rejects


def decode_watch_line(line: bytes) -> PodWatchEvent:
    """One watch line (``{"type": ..., "object": ...}``) as an event; raises ``FrameDecodeError``.

    A bare ``Status`` line (no ``type``, a ``code``) reads as an ERROR frame, as
    ``kubernetes_asyncio`` reads it.
    """
    try:
        frame = validated_without_managed_fields(_FRAME.validate_json, line, most=1)
    except ValidationError as err:
        return _decode_rejected_line(line, err)
    if isinstance(frame, _PodFrame):
        return PodWatchEvent(frame.type, frame.object, frame.object.metadata.resource_version)
    if isinstance(frame, _BookmarkFrame):
        return PodWatchEvent.from_frame(event_type="BOOKMARK", obj=frame.object)
    return PodWatchEvent.from_status(frame.object)


def _unreadable(line: bytes, err: ValidationError) -> FrameDecodeError:
    """A line that is not JSON, named by what its readable beginning says: a cut frame still
    names its type, and its pod and resourceVersion when they precede the cut (strings cut
    short are left out)."""
    try:
        head = _AnyFrame.model_validate(from_json(line, allow_partial=True))
    except ValueError:
        head = _AnyFrame()
    meta = head.object.metadata
    return FrameDecodeError(
        f"unreadable watch frame: {validation_summary(err)}",
        name=meta.name,
        resource_version=meta.resource_version,
        event_type=head.type if isinstance(head.type, str) else None,
    )


def _decode_rejected_line(line: bytes, err: ValidationError) -> PodWatchEvent:
    try:
        frame = _AnyFrame.model_validate_json(line)
    except ValidationError as envelope_err:
        raise _unreadable(line, envelope_err) from None
    meta = frame.object.metadata
    if frame.type is None and isinstance(frame.code, int):
        return PodWatchEvent.from_status(WatchFrame.model_validate_json(line))
    if not isinstance(frame.type, str) or frame.type not in POD_EVENT_TYPES:
        raise FrameDecodeError(f"invalid watch event type {str(frame.type)[:40]!r}", name=meta.name)
    raise FrameDecodeError(
        f"{frame.type} pod does not validate: {validation_summary(err, skip=1)}",
        name=meta.name,
        resource_version=meta.resource_version,
        event_type=frame.type,
    )


def decode_status(body: bytes) -> WatchFrame:
    """An error response's body as a Status; an unreadable one reads as an empty Status."""
    try:
        return WatchFrame.model_validate_json(body)
    except ValidationError:
        return WatchFrame()


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


_M = TypeVar("_M", bound=BaseModel)
_OBJECT_TYPES = {b"ADDED": "ADDED", b"MODIFIED": "MODIFIED", b"DELETED": "DELETED"}
_TYPE_OPEN = b'{"type":"'
_OBJECT_KEY = b'","object":'


def _deferred_line(validate: Callable[[bytes], _M], line: bytes) -> WatchEvent[_M] | None:
    """An ADDED, MODIFIED or DELETED line written as the apiserver writes one,
    ``{"type":"T","object":`` + the object + ``}``, its object (managed fields cut) validated alone
    by ``validate`` (a ``deferred_validator``): the object is one JSON value, so the line is the
    frame of those two keys. ``None`` for any other line or an object that does not validate or
    has no name: the caller then decodes the line whole."""
    if not isinstance(line, bytes) or not line.startswith(_TYPE_OPEN):
        return None
    key = line.find(_OBJECT_KEY, len(_TYPE_OPEN), 32)
    event_type = _OBJECT_TYPES.get(line[len(_TYPE_OPEN) : key]) if key != -1 else None
    end = len(line.rstrip())
    if event_type is None or line[end - 1 : end] != b"}":
        return None
    try:
        obj: Any = validate(without_managed_fields(line[key + len(_OBJECT_KEY) : end - 1], most=1))
    except ValidationError:
        return None
    if not obj.metadata.name:
        return None
    return WatchEvent(event_type, obj, obj.metadata.resource_version)


def _deferred_list(
    validate: Callable[[bytes], _M], body: bytes
) -> tuple[list[_M], _ListMeta] | None:
    """The items of a LIST body, managed fields cut, each validated alone by ``validate`` (a
    ``deferred_validator``; ``item_runs.item_spans`` cuts them), and the list's metadata; ``None``
    where the body is not cut so or anything in it does not validate: the caller then decodes it
    whole."""
    cut = without_managed_fields(body)
    split = item_spans(cut)
    if split is None:
        return None
    skeleton, spans = split
    try:
        envelope = _RawPodList.model_validate_json(skeleton)
        items = [validate(cut[start:end]) for start, end in spans]
    except ValidationError:
        return None
    return (items, envelope.metadata) if envelope.items == [] else None


class _NamedMeta(_Envelope):
    name: Any = None
    namespace: Any = None
    resource_version: Any = Field(default=None, alias="resourceVersion")


class ObjectDecoder(Generic[_M]):
    """``decode_pod_list`` and ``decode_watch_line`` for any object model (``k8s_objects``): built
    once per model and ``kind`` (which names an object in an error), it decodes LIST bodies and
    watch lines straight from the bytes, managed fields cut, as the pod ones do. An object
    without ``metadata.name`` does not decode: the name is the key it is stored by."""

    def __init__(self, model: type[_M], *, kind: str) -> None:
        self.model = model
        self.kind = kind

        class _List(_Envelope):
            metadata: _ListMeta = Field(default_factory=_ListMeta)
            items: list[model]  # type: ignore[valid-type]

        class _Frame(_Envelope):
            type: Literal["ADDED", "MODIFIED", "DELETED"]
            object: model  # type: ignore[valid-type]

        self._list = _List
        self._deferred: Callable[[bytes], _M] | None = None
        if issubclass(model, DynamicObject):
            self._deferred = deferred_validator(model)
        self._frame: TypeAdapter[Any] = TypeAdapter(
            Annotated[_Frame | _StatusFrame | _BookmarkFrame, Field(discriminator="type")]
        )
        self._frame_class = _Frame

    def decode_list(self, body: bytes) -> tuple[ListPage[_M], list[FrameDecodeError]]:
        """A LIST body as a page, plus one error per item that does not decode (left out)."""
        with COLLECTOR.held():
            if self._deferred is not None and (items := _deferred_list(self._deferred, body)):
                return self._named(*items)
            try:
                page = validated_without_managed_fields(self._list.model_validate_json, body)
            except ValidationError:
                return self._item_by_item(body)
        return self._named(page.items, page.metadata)

    def _named(
        self, items: list[_M], meta: _ListMeta
    ) -> tuple[ListPage[_M], list[FrameDecodeError]]:
        if all(item.metadata.name for item in items):  # type: ignore[attr-defined]
            return ListPage(tuple(items), meta.resource_version, meta.continue_token or None), []
        kept = [item for item in items if item.metadata.name]  # type: ignore[attr-defined]
        rejects = [self._nameless(item) for item in items if not item.metadata.name]  # type: ignore[attr-defined]
        return ListPage(tuple(kept), meta.resource_version, meta.continue_token or None), rejects

    def _nameless(self, obj: Any, event_type: str | None = None) -> FrameDecodeError:
        meta = obj.metadata
        return FrameDecodeError(
            f"{self.kind} {meta.namespace or ''}/: metadata.name: absent (it is the object's key)",
            name=None,
            resource_version=meta.resource_version,
            event_type=event_type,
        )

    def _item_by_item(self, body: bytes) -> tuple[ListPage[_M], list[FrameDecodeError]]:
        try:
            raw = _RawPodList.model_validate_json(body)
        except ValidationError as err:
            raise FrameDecodeError(
                f"unreadable {self.kind} list: {validation_summary(err)}"
            ) from None
        kept: list[_M] = []
        rejects: list[FrameDecodeError] = []
        for item in raw.items or ():
            try:
                obj = self.model.model_validate(item)
            except ValidationError as err:
                rejects.append(self._invalid(item, err, None))
                continue
            if obj.metadata.name:  # type: ignore[attr-defined]
                kept.append(obj)
            else:
                rejects.append(self._nameless(obj))
        page = ListPage(
            tuple(kept), raw.metadata.resource_version, raw.metadata.continue_token or None
        )
        return page, rejects

    def _invalid(
        self, item: Any, err: ValidationError, event_type: str | None, *, skip: int = 0
    ) -> FrameDecodeError:
        """An object that does not validate, named by kind, namespace/name and the fields."""
        try:
            meta = _NamedMeta.model_validate(item.get("metadata") if isinstance(item, dict) else {})
        except ValidationError:
            meta = _NamedMeta()
        name = meta.name if isinstance(meta.name, str) else None
        namespace = meta.namespace if isinstance(meta.namespace, str) else ""
        rv = meta.resource_version if isinstance(meta.resource_version, str) else None
        return FrameDecodeError(
            f"{self.kind} {namespace}/{name or '?'} does not validate: "
            f"{validation_summary(err, skip=skip)}",
            name=name,
            resource_version=rv,
            event_type=event_type,
        )

    def decode_watch_line(self, line: bytes) -> WatchEvent[_M]:
        """One watch line as an event; raises ``FrameDecodeError`` as ``decode_watch_line``."""
        if self._deferred is not None and (event := _deferred_line(self._deferred, line)):
            return event
        try:
            frame = validated_without_managed_fields(self._frame.validate_json, line, most=1)
        except ValidationError as err:
            return self._rejected_line(line, err)
        if isinstance(frame, self._frame_class):
            obj: Any = frame.object
            if not obj.metadata.name:
                raise self._nameless(obj, frame.type)
            return WatchEvent(frame.type, obj, obj.metadata.resource_version)
        if isinstance(frame, _BookmarkFrame):
            return WatchEvent.of(PodWatchEvent.from_frame(event_type="BOOKMARK", obj=frame.object))
        return WatchEvent.of(PodWatchEvent.from_status(frame.object))

    def _rejected_line(self, line: bytes, err: ValidationError) -> WatchEvent[_M]:
        try:
            frame = _AnyFrame.model_validate_json(line)
        except ValidationError as envelope_err:
            raise _unreadable(line, envelope_err) from None
        if frame.type is None and isinstance(frame.code, int):
            return WatchEvent.of(PodWatchEvent.from_status(WatchFrame.model_validate_json(line)))
        if not isinstance(frame.type, str) or frame.type not in POD_EVENT_TYPES:
            raise FrameDecodeError(
                f"invalid watch event type {str(frame.type)[:40]!r}",
                name=frame.object.metadata.name,
            )
        raw = from_json(line, allow_partial=True)
        item = raw.get("object") if isinstance(raw, dict) else None
        raise self._invalid(item, err, frame.type, skip=2)

    def decode_watch_read(
        self, lines: list[bytes], *, listing: bool = False
    ) -> Iterator[WatchEvent[_M]]:
        """``decode_watch_read`` for this model."""
        decode = self.decode_watch_line
        if listing:
            events: list[WatchEvent[_M]] = []
            failure: FrameDecodeError | None = None
            with COLLECTOR.held():
                for line in lines:
                    try:
                        events.append(decode(line))
                    except FrameDecodeError as err:
                        failure = err
                        break
            yield from events
            if failure is not None:
                raise failure
            return
        for line in lines:
            yield decode(line)
