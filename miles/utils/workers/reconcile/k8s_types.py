"""The pod fields miles reads, validated straight off the wire. Go: ``k8s.io/api/core/v1`` types.

Every model is a partial, frozen view with ``extra="ignore"``. Each field accepts both wire
spellings (``kubernetes_asyncio``'s snake_case attribute and the apiserver's camelCase JSON key)
through ``AliasChoices``, and ``None`` for a map, a list or a nested object reads as empty. So one
model validates a ``kubernetes_asyncio`` model object, a snake_case or camelCase dict, and raw JSON
bytes (``Pod.model_validate_json``), which is the path ``k8s_api`` uses.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar, get_origin

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


OrEmpty = Annotated[_T, _NoneIsEmpty()]


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


class PodMetadata(_View):
    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = _both("resource_version", "resourceVersion")
    creation_timestamp: datetime | None = _both("creation_timestamp", "creationTimestamp")
    deletion_timestamp: datetime | None = _both("deletion_timestamp", "deletionTimestamp")
    labels: OrEmpty[dict[str, str]] = Field(default_factory=dict)
    annotations: OrEmpty[dict[str, str]] = Field(default_factory=dict)


class Container(_View):
    name: str | None = None
    restart_policy: str | None = _both("restart_policy", "restartPolicy")


class PodSpec(_View):
    node_name: str | None = _both("node_name", "nodeName")
    containers: OrEmpty[list[Container]] = Field(default_factory=list)
    init_containers: OrEmpty[list[Container]] = _both(
        "init_containers", "initContainers", default_factory=list
    )


class PodCondition(_View):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = _both("last_transition_time", "lastTransitionTime")


class ContainerStateRunning(_View):
    started_at: datetime | None = _both("started_at", "startedAt")


class ContainerStateWaiting(_View):
    reason: str | None = None
    message: str | None = None


class ContainerStateTerminated(_View):
    exit_code: int = _both("exit_code", "exitCode", default=...)
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    started_at: datetime | None = _both("started_at", "startedAt")
    finished_at: datetime | None = _both("finished_at", "finishedAt")


class ContainerState(_View):
    running: ContainerStateRunning | None = None
    waiting: ContainerStateWaiting | None = None
    terminated: ContainerStateTerminated | None = None


class ContainerStatus(_View):
    name: str
    ready: bool
    restart_count: int = _both("restart_count", "restartCount", default=...)
    started: bool | None = None
    state: OrEmpty[ContainerState] = Field(default_factory=ContainerState)
    last_state: OrEmpty[ContainerState] = _both(
        "last_state", "lastState", default_factory=ContainerState
    )


class PodIP(_View):
    ip: str | None = None


class PodStatus(_View):
    phase: str | None = None
    reason: str | None = None
    pod_ip: str | None = _both("pod_ip", "podIP")
    pod_ips: OrEmpty[list[PodIP]] = _both("pod_ips", "podIPs", default_factory=list)
    conditions: OrEmpty[list[PodCondition]] = Field(default_factory=list)
    container_statuses: OrEmpty[list[ContainerStatus]] = _both(
        "container_statuses", "containerStatuses", default_factory=list
    )
    init_container_statuses: OrEmpty[list[ContainerStatus]] = _both(
        "init_container_statuses", "initContainerStatuses", default_factory=list
    )


class Pod(_View):
    metadata: PodMetadata
    spec: OrEmpty[PodSpec] = Field(default_factory=PodSpec)
    status: OrEmpty[PodStatus] = Field(default_factory=PodStatus)


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
