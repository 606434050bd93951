"""The fields miles reads of pods, events and jobs, validated straight off the wire.
Go: ``k8s.io/api/core/v1`` and ``batch/v1`` types.

Every model is a partial, frozen view with ``extra="ignore"``. Each field accepts both wire
spellings (``kubernetes_asyncio``'s snake_case attribute and the apiserver's camelCase JSON key)
through ``AliasChoices``, and ``None`` for a map, a list or a nested object reads as empty. So one
model validates a ``kubernetes_asyncio`` model object, a snake_case or camelCase dict, and raw JSON
bytes (``Pod.model_validate_json``), which is the path ``k8s_api`` uses.

Only what names an object and decides a pod's parent can reject it: a pod's ``metadata.name`` (the
object key) and ``metadata.labels`` (what ``key_map`` reads). Every other field is ``Lenient``: a
value that does not validate (a timestamp before year 1, a number where a string belongs, a list
item that is not an object) reads as absent, with one DEBUG line naming the field, and the rest of
the object stands.

``PodList`` and ``EventList`` read ``kubectl get … -o json`` documents and LIST bodies: an item
that cannot be read (``null``, another kind, a pod without a name: its name is its key) is left
out and named in ``skipped``, with one WARNING line per document; an event or a job without
``metadata`` reads with an empty one (``ObjectMeta``) and is kept; only a document that is not an
object raises ``ValidationError``.
Bytes of a long document are validated a run of items at a time (``item_runs``), the same object.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import (
    Annotated,
    Any,
    ClassVar,
    Generic,
    Self,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.item_runs import RUN_KEY, kept_whole, validated_in_runs
from miles.utils.workers.reconcile.managed_fields import (
    holds_managed_fields,
    kept_spans,
    validated_without_managed_fields,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class _NoneIsEmpty:
    """Reads ``None`` as an empty value of the annotated type, inside pydantic-core.

    A Python ``mode="before"`` validator would do the same, but it makes JSON validation hand the
    whole subtree to Python first, which doubles the cost of decoding a pod from bytes.
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        empty: Callable[[], Any] = get_origin(source) or source
        return core_schema.no_info_after_validator_function(
            lambda value: empty() if value is None else value,
            core_schema.nullable_schema(handler(source)),
        )


class _Lenient:
    """A value that does not validate reads as absent: ``None``, or the type's empty value.

    The annotated type's own schema is tried first and a Python fallback only after it failed (a
    left-to-right union), so a pod that validates never leaves pydantic-core. ``None`` for a map, a
    list or a model reads as empty without a log line; anything else that fails logs one DEBUG line
    naming the model and field. A list's items are lenient one by one: a bad item reads as an
    empty item, and its neighbours stand.
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        field = handler.field_name or "?"
        if get_origin(source) is list:
            (item,) = get_args(source)
            items = _or_absent(handler.generate_schema(item), _empty_of(item), f"{field}[]")
            return _or_absent(core_schema.list_schema(items), list, field)
        return _or_absent(handler(source), _empty_of(source), field)


def _empty_of(source: Any) -> Callable[[], Any]:
    if get_origin(source) in (Union, types.UnionType) and type(None) in get_args(source):
        return type(None)
    empty: Callable[[], Any] = get_origin(source) or source
    return empty


def _or_absent(schema: CoreSchema, empty: Callable[[], Any], field: str) -> CoreSchema:
    def absent(value: Any, info: core_schema.ValidationInfo) -> Any:
        if value is not None:
            model = (info.config or {}).get("title", "?")
            logger.debug(
                "k8s_types: %s.%s: unreadable value %.80r read as absent", model, field, value
            )
        return empty()

    return core_schema.union_schema(
        [schema, core_schema.with_info_plain_validator_function(absent)], mode="left_to_right"
    )


OrEmpty = Annotated[_T, _NoneIsEmpty()]
Lenient = Annotated[_T, _Lenient()]


def _both(snake: str, camel: str, **kwargs: Any) -> Any:
    if "default_factory" not in kwargs:
        kwargs.setdefault("default", None)
    return Field(validation_alias=AliasChoices(snake, camel), **kwargs)


def _mapping_or_empty(value: Any) -> Any:
    return value if isinstance(value, dict) or hasattr(value, "__dict__") else {}


def _string_or_none(value: Any) -> Any:
    return value if isinstance(value, str) else None


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", from_attributes=True)


class OwnerReference(_View):
    api_version: Lenient[str | None] = _both("api_version", "apiVersion")
    kind: Lenient[str | None] = None
    name: Lenient[str | None] = None
    uid: Lenient[str | None] = None
    controller: Lenient[bool | None] = None


class PodMetadata(_View):
    name: str
    namespace: Lenient[str | None] = None
    uid: Lenient[str | None] = None
    resource_version: Lenient[str | None] = _both("resource_version", "resourceVersion")
    creation_timestamp: Lenient[datetime | None] = _both("creation_timestamp", "creationTimestamp")
    deletion_timestamp: Lenient[datetime | None] = _both("deletion_timestamp", "deletionTimestamp")
    labels: OrEmpty[dict[str, str]] = Field(default_factory=dict)
    annotations: Lenient[dict[str, str]] = Field(default_factory=dict)
    owner_references: Lenient[list[OwnerReference]] = _both(
        "owner_references", "ownerReferences", default_factory=list
    )


class ObjectMeta(PodMetadata):
    """Any object's metadata (metav1 ``ObjectMeta``), as a pod's plus ``generation`` and
    ``finalizers``. Absent (or ``null``) it reads as empty, as Go's zero value does: ``name`` is
    then ``""``. A pod's metadata (``PodMetadata``) requires the name, the key it is stored by."""

    name: OrEmpty[str] = ""
    generation: Lenient[int | None] = None
    finalizers: Lenient[list[str]] = Field(default_factory=list)


class PodSchedulingGate(_View):
    name: Lenient[str | None] = None


class Container(_View):
    name: Lenient[str | None] = None
    restart_policy: Lenient[str | None] = _both("restart_policy", "restartPolicy")


class PodSpec(_View):
    node_name: Lenient[str | None] = _both("node_name", "nodeName")
    subdomain: Lenient[str | None] = None
    containers: Lenient[list[Container]] = Field(default_factory=list)
    init_containers: Lenient[list[Container]] = _both(
        "init_containers", "initContainers", default_factory=list
    )
    node_selector: Lenient[dict[str, str]] = _both(
        "node_selector", "nodeSelector", default_factory=dict
    )
    scheduling_gates: Lenient[list[PodSchedulingGate]] = _both(
        "scheduling_gates", "schedulingGates", default_factory=list
    )


class PodCondition(_View):
    type: Lenient[str | None] = None
    status: Lenient[str | None] = None
    reason: Lenient[str | None] = None
    message: Lenient[str | None] = None
    last_transition_time: Lenient[datetime | None] = _both(
        "last_transition_time", "lastTransitionTime"
    )


class ContainerStateRunning(_View):
    started_at: Lenient[datetime | None] = _both("started_at", "startedAt")


class ContainerStateWaiting(_View):
    reason: Lenient[str | None] = None
    message: Lenient[str | None] = None


class ContainerStateTerminated(_View):
    container_id: Lenient[str | None] = _both("container_id", "containerID")
    exit_code: Lenient[int | None] = _both("exit_code", "exitCode")
    signal: Lenient[int | None] = None
    reason: Lenient[str | None] = None
    message: Lenient[str | None] = None
    started_at: Lenient[datetime | None] = _both("started_at", "startedAt")
    finished_at: Lenient[datetime | None] = _both("finished_at", "finishedAt")


class ContainerState(_View):
    running: Lenient[ContainerStateRunning | None] = None
    waiting: Lenient[ContainerStateWaiting | None] = None
    terminated: Lenient[ContainerStateTerminated | None] = None


class ContainerStatus(_View):
    name: Lenient[str | None] = None
    container_id: Lenient[str | None] = _both("container_id", "containerID")
    ready: Lenient[bool | None] = None
    started: Lenient[bool | None] = None
    restart_count: Lenient[int] = _both("restart_count", "restartCount", default=0)
    state: Lenient[ContainerState] = Field(default_factory=ContainerState)
    last_state: Lenient[ContainerState] = _both(
        "last_state", "lastState", default_factory=ContainerState
    )


class PodIP(_View):
    ip: Lenient[str | None] = None


class PodStatus(_View):
    phase: Lenient[str | None] = None
    reason: Lenient[str | None] = None
    pod_ip: Lenient[str | None] = _both("pod_ip", "podIP")
    pod_ips: Lenient[list[PodIP]] = _both("pod_ips", "podIPs", default_factory=list)
    conditions: Lenient[list[PodCondition]] = Field(default_factory=list)
    container_statuses: Lenient[list[ContainerStatus]] = _both(
        "container_statuses", "containerStatuses", default_factory=list
    )
    init_container_statuses: Lenient[list[ContainerStatus]] = _both(
        "init_container_statuses", "initContainerStatuses", default_factory=list
    )


class Pod(_View):
    metadata: PodMetadata
    spec: Lenient[PodSpec] = Field(default_factory=PodSpec)
    status: Lenient[PodStatus] = Field(default_factory=PodStatus)


class WatchFrameMetadata(_View):
    """What every Kubernetes object and ``Status`` shares: enough to log and to move the cursor."""

    name: str | None = None
    resource_version: str | None = _both("resource_version", "resourceVersion")

    _readable = model_validator(mode="before")(_mapping_or_empty)
    _strings = field_validator("name", "resource_version", mode="before")(_string_or_none)


FrameMetadata = WatchFrameMetadata
"""The name ``WatchFrameMetadata`` had before consumers' name was adopted; the same class."""


class WatchFrame(_View):
    """The envelope of a watch frame's ``object``, readable whatever that object is.

    A pod, a bookmark (a bare ``metadata.resourceVersion``) and an ``ERROR`` frame's ``Status``
    (``code``, ``reason``, ``message``) all validate; so does anything else, a str or ``None``
    included, which reads as an object with no cursor.
    """

    kind: str | None = None
    metadata: WatchFrameMetadata = Field(default_factory=WatchFrameMetadata)
    code: int | None = None
    reason: str | None = None
    message: str | None = None

    _readable = model_validator(mode="before")(_mapping_or_empty)
    _strings = field_validator("kind", "reason", "message", mode="before")(_string_or_none)

    @field_validator("code", mode="before")
    @classmethod
    def _int_or_none(cls, value: Any) -> Any:
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class ObjectReference(_View):
    """What an ``Event`` is about (core/v1 ``ObjectReference``)."""

    kind: Lenient[str | None] = None
    name: Lenient[str | None] = None
    namespace: Lenient[str | None] = None
    uid: Lenient[str | None] = None


class Event(_View):
    """A core/v1 ``Event``, as ``kubectl get events -o json`` prints it. ``event_time`` is the
    ``MicroTime`` newer reporters set instead of the two timestamps. Without ``metadata`` (an event
    the API left half empty) it reads with an empty one."""

    metadata: OrEmpty[ObjectMeta] = Field(default_factory=ObjectMeta)
    involved_object: Lenient[ObjectReference] = _both(
        "involved_object", "involvedObject", default_factory=ObjectReference
    )
    reason: Lenient[str | None] = None
    message: Lenient[str | None] = None
    type: Lenient[str | None] = None
    count: Lenient[int | None] = None
    first_timestamp: Lenient[datetime | None] = _both("first_timestamp", "firstTimestamp")
    last_timestamp: Lenient[datetime | None] = _both("last_timestamp", "lastTimestamp")
    event_time: Lenient[datetime | None] = _both("event_time", "eventTime")


class JobCondition(_View):
    type: Lenient[str | None] = None
    status: Lenient[str | None] = None
    reason: Lenient[str | None] = None
    message: Lenient[str | None] = None


class JobStatus(_View):
    """A batch/v1 ``JobStatus``; an absent count reads as Go's zero."""

    conditions: Lenient[list[JobCondition]] = Field(default_factory=list)
    active: Lenient[int] = 0
    succeeded: Lenient[int] = 0
    failed: Lenient[int] = 0


class Job(_View):
    """A batch/v1 ``Job``: its name and what its conditions and counts say. Without ``metadata``
    (a document read for its ``status`` alone) it reads with an empty one."""

    metadata: OrEmpty[ObjectMeta] = Field(default_factory=ObjectMeta)
    status: Lenient[JobStatus] = Field(default_factory=JobStatus)


class SkippedItem(_View):
    """An item of a list document left out, and why: ``index`` in the document's ``items`` (``None``
    when ``items`` itself is not a list), the item's ``metadata.name`` when readable."""

    index: int | None
    name: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class _Unread:
    """The mark an unreadable item, or an ``items`` that is not a list, reads as."""

    name: str | None
    reason: str
    whole_list: bool = False


class _Listed:
    """A list read item by item: an item that does not validate reads as an ``_Unread`` mark for
    the list's model to leave out; ``None`` reads as an empty list, anything else that is not a
    list as one mark. The item's own schema comes first (a left-to-right union), so a list whose
    items all validate never leaves pydantic-core."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        (item,) = get_args(source)

        def unread_item(value: Any) -> _Unread:
            return _Unread(_name_of(value), _why_unreadable(item, value))

        def unread_list(value: Any) -> list[_Unread]:
            if value is None:
                return []
            return [_Unread(None, f"not a list: {value!r:.80}", whole_list=True)]

        return _first_or(
            core_schema.list_schema(_first_or(handler.generate_schema(item), unread_item)),
            unread_list,
        )


def _first_or(schema: CoreSchema, fallback: Callable[[Any], Any]) -> CoreSchema:
    return core_schema.union_schema(
        [schema, core_schema.no_info_plain_validator_function(fallback)], mode="left_to_right"
    )


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def _name_of(value: Any) -> str | None:
    name = _field(_field(value, "metadata"), "name")
    return name if isinstance(name, str) else None


def _why_unreadable(model: type[BaseModel], value: Any) -> str:
    if value is None:
        return "null item"
    if not isinstance(value, dict) and not hasattr(value, "__dict__"):
        return f"not an object: {value!r:.80}"
    try:
        model.model_validate(value)
    except ValidationError as err:
        return validation_summary(err)
    return "unreadable"


def validation_summary(err: ValidationError, *, skip: int = 0, limit: int = 3) -> str:
    """A ``ValidationError``'s first ``limit`` errors on one line, each location without its first
    ``skip`` parts and without the input (a pod's bytes do not belong in a log line)."""
    parts = [
        ": ".join(filter(None, (".".join(str(p) for p in e["loc"][skip:]), e["msg"])))
        for e in err.errors(include_url=False, include_input=False)[:limit]
    ]
    more = err.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


class _ItemKind(_View):
    kind: Lenient[str | None] = None


_A_PART = object()
"""The context a document's skeleton is validated in when its items are read in runs: what is
left out is sorted once the runs' items are joined."""
_RUN_BYTES = 256 * 2**10  # 64 KiB-1 MiB measured over 10,000 pods (bench/decode.py): 128-256 best


class _ObjectList(_View):
    """A list document: ``kubectl get … -o json`` (``kind: List``, each item with its ``kind``) or
    an apiserver's typed list (items without one). What cannot be read is left out and named in
    ``skipped``, with one WARNING line; only a document that is not an object raises.

    ``item_kinds`` is what each kept item said its kind was (``None`` for an apiserver's list),
    read from the same ``items``: an item of another kind is left out. Validation holds the shared
    pause of the cyclic collector (``gc_pause``), which at 10,000 pods otherwise took about
    two thirds of the decode."""

    item_kind: ClassVar[str]

    items: Annotated[list[Any], _Listed()] = Field(default_factory=list)
    item_kinds: Lenient[list[_ItemKind]] = Field(
        default_factory=list, validation_alias="items", exclude=True, repr=False
    )
    _skipped: tuple[SkippedItem, ...] = PrivateAttr(default=())

    @property
    def skipped(self) -> tuple[SkippedItem, ...]:
        """The items left out, in document order."""
        return self._skipped

    @model_validator(mode="after")
    def _leave_out_unread(self, info: ValidationInfo) -> Self:
        return self if info.context is _A_PART else self._without_unread()

    def _without_unread(self) -> Self:
        kinds = [entry.kind for entry in self.item_kinds]
        if all(kind in (None, self.item_kind) for kind in kinds) and not any(
            isinstance(item, _Unread) for item in self.items
        ):
            return self
        kept, skipped = _sort_out(self.items, kinds, self.item_kind)
        _log_skipped(type(self).__name__, len(self.items), skipped)
        object.__setattr__(self, "items", [item for item, _ in kept])
        object.__setattr__(self, "item_kinds", [_ItemKind(kind=kind) for _, kind in kept])
        self._skipped = tuple(skipped)
        return self

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        with COLLECTOR.held():
            return super().model_validate(obj, **kwargs)

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        """Bytes are validated without their pods' ``managedFields`` (``managed_fields``), as
        the LIST decoder validates a page, and a long document a run of items at a time
        (``item_runs``), which reads as the same object."""
        validate = super().model_validate_json
        with COLLECTOR.held():
            if not isinstance(json_data, bytes):
                return validate(json_data, **kwargs)
            if not kwargs and (in_runs := cls._validated_in_runs(json_data)) is not None:
                return in_runs
            return validated_without_managed_fields(
                lambda data: validate(data, **kwargs), json_data
            )

    @classmethod
    def _validated_in_runs(cls, data: bytes, run_bytes: int = _RUN_BYTES) -> Self | None:
        """The document without its managed fields, validated in runs of items where it is
        ``2 * run_bytes`` long or longer and ``item_runs`` can cut it; else ``None``."""
        run_model = _RUN_MODELS.get(cls)
        if len(data) < 2 * run_bytes or run_model is None:
            return None
        validate = super().model_validate_json
        # A kubectl print (indented, managed fields hidden) never holds the compact form the cut
        # looks for: searching all of it cost 1.5 us a pod of its 32 (bench/decode.py). Cutting
        # is only ever a saving, so the first two runs' bytes decide for the rest.
        cut = holds_managed_fields(data, 0, 2 * run_bytes)
        parts = validated_in_runs(
            lambda skeleton: validate(skeleton, context=_A_PART),
            run_model.model_validate_json,
            data,
            run_bytes=run_bytes,
            kept=kept_spans if cut else kept_whole,
        )
        if parts is None:
            return None
        skeleton, runs = parts
        whole = skeleton.model_copy(
            update={
                "items": [item for run in runs for item in run.items],
                "item_kinds": [kind for run in runs for kind in run.item_kinds],
            }
        )
        return whole._without_unread()


def _sort_out(
    items: list[Any], kinds: list[str | None], item_kind: str
) -> tuple[list[tuple[Any, str | None]], list[SkippedItem]]:
    """The items to keep with their kinds, and what is left out of the rest."""
    kept: list[tuple[Any, str | None]] = []
    skipped: list[SkippedItem] = []
    for index, item in enumerate(items):
        kind = kinds[index] if index < len(kinds) else None
        if isinstance(item, _Unread):
            at = None if item.whole_list else index
            skipped.append(SkippedItem(index=at, name=item.name, reason=item.reason))
        elif kind not in (None, item_kind):
            reason = f"kind {kind!r:.40}, not {item_kind}"
            skipped.append(SkippedItem(index=index, name=item.metadata.name, reason=reason))
        else:
            kept.append((item, kind))
    return kept, skipped


def _log_skipped(model: str, total: int, skipped: list[SkippedItem], *, limit: int = 3) -> None:
    named = "; ".join(
        f"{'items' if s.index is None else f'items[{s.index}]'} {s.name or '(no name)'}: {s.reason}"
        for s in skipped[:limit]
    )
    more = f" (+{len(skipped) - limit} more)" if len(skipped) > limit else ""
    logger.warning(
        "k8s_types: %s: %d of %d items skipped: %s%s", model, len(skipped), total, named, more
    )


class PodList(_ObjectList):
    """``kubectl get pods -o json``, or a LIST page's body."""

    item_kind = "Pod"
    items: Annotated[list[Pod], _Listed()] = Field(default_factory=list)


class EventList(_ObjectList):
    """``kubectl get events -o json``."""

    item_kind = "Event"
    items: Annotated[list[Event], _Listed()] = Field(default_factory=list)


class _Run(_View, Generic[_T]):
    """A run of a list document's items as ``item_runs`` cuts it: ``{RUN_KEY: [...]}``, any other
    key refused."""

    model_config = ConfigDict(extra="forbid")

    items: Annotated[list[_T], _Listed()] = Field(default_factory=list, validation_alias=RUN_KEY)
    item_kinds: Lenient[list[_ItemKind]] = Field(default_factory=list, validation_alias=RUN_KEY)


_RUN_MODELS: dict[type[_ObjectList], type[_Run[Any]]] = {
    PodList: _Run[Pod],
    EventList: _Run[Event],
}
