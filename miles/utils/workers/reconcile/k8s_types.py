"""The pod fields miles reads, validated straight off the wire. Go: ``k8s.io/api/core/v1`` types.

Every model is a partial, frozen view with ``extra="ignore"``. Each field accepts both wire
spellings (``kubernetes_asyncio``'s snake_case attribute and the apiserver's camelCase JSON key)
through ``AliasChoices``, and ``None`` for a map, a list or a nested object reads as empty. So one
model validates a ``kubernetes_asyncio`` model object, a snake_case or camelCase dict, and raw JSON
bytes (``Pod.model_validate_json``), which is the path ``k8s_api`` uses.

Only what names a pod and decides its parent can reject it: ``metadata.name`` (the object key)
and ``metadata.labels`` (what ``key_map`` reads). Every other field is ``Lenient``: a value that
does not validate (a timestamp before year 1, a number where a string belongs, a list item that is
not an object) reads as absent, with one DEBUG line naming the field, and the rest of the pod
stands.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

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


class FrameMetadata(_View):
    """What every Kubernetes object and ``Status`` shares: enough to log and to move the cursor."""

    name: str | None = None
    resource_version: str | None = _both("resource_version", "resourceVersion")

    _readable = model_validator(mode="before")(_mapping_or_empty)
    _strings = field_validator("name", "resource_version", mode="before")(_string_or_none)


class WatchFrame(_View):
    """The envelope of a watch frame's ``object``, readable whatever that object is.

    A pod, a bookmark (a bare ``metadata.resourceVersion``) and an ``ERROR`` frame's ``Status``
    (``code``, ``reason``, ``message``) all validate; so does anything else, a str or ``None``
    included, which reads as an object with no cursor.
    """

    kind: str | None = None
    metadata: FrameMetadata = Field(default_factory=FrameMetadata)
    code: int | None = None
    reason: str | None = None
    message: str | None = None

    _readable = model_validator(mode="before")(_mapping_or_empty)
    _strings = field_validator("kind", "reason", "message", mode="before")(_string_or_none)

    @field_validator("code", mode="before")
    @classmethod
    def _int_or_none(cls, value: Any) -> Any:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
