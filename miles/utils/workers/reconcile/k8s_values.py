"""What a LIST asks for and what a pod API, or any object's, answers, as frozen values.
Go: metav1 ``ListOptions``, core/v1 ``PodList`` and apimachinery ``watch.Event``.

``PodListPage`` and ``PodWatchEvent`` are the pod case; ``ListPage`` and ``WatchEvent`` the same
values for objects of any model (``objects``, ``object``), which the pod ones also answer to.
``PodWatchEvent.from_frame`` builds an event from a frame someone else has parsed already (a
``kubernetes_asyncio`` ``Watch`` frame, say); ``k8s_wire`` builds them from the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError, status_rejects_cursor
from miles.utils.workers.reconcile.k8s_types import Pod, WatchFrame, validation_summary

_O = TypeVar("_O")

POD_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})
INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
"""Set to ``"true"`` on the bookmark that ends a streaming list's initial events
(metav1 ``InitialEventsAnnotationKey``)."""


@dataclass(frozen=True, slots=True)
class ListOptions:
    """One LIST page's request. Go: metav1 ``ListOptions`` (``LabelSelector``, ``Limit``,
    ``Continue``, ``ResourceVersion`` with ``ResourceVersionMatch=NotOlderThan``), plus the
    namespace, which Go's typed client is bound to (``Pods(namespace)``) and ours is not
    (``""``: every namespace), and ``field_selector`` (metav1 ``FieldSelector``).

    At most ``limit`` pods (all if ``None``); ``continue_token`` asks for the page after the one
    that returned it (410 once expired, never combined with ``resource_version``). With
    ``resource_version``, a LIST not older than it, which a server rejects (410, 504) when the
    version is outside its history: the reflector's cursor probe. Without it, a consistent LIST.
    """

    namespace: str
    label_selector: str = ""
    limit: int | None = None
    continue_token: str | None = None
    resource_version: str | None = None
    field_selector: str = ""

    def continued(self, continue_token: str) -> ListOptions:
        """The request for the page after the one that returned ``continue_token``."""
        return replace(self, continue_token=continue_token)


@dataclass(frozen=True, slots=True)
class PodListPage:
    """One LIST response. ``continue_token`` (``metadata.continue``) is set when more pages follow
    at the same ``resource_version``."""

    pods: tuple[Pod, ...]
    resource_version: str
    continue_token: str | None = None

    @property
    def objects(self) -> tuple[Pod, ...]:
        """``pods``, under ``ListPage``'s name."""
        return self.pods

    def joined(self, objects: list[Any], resource_version: str) -> PodListPage:
        """A page of ``objects`` (pods) at ``resource_version``, as a pager joins pages."""
        return PodListPage(tuple(objects), resource_version)


@dataclass(frozen=True, slots=True)
class ListPage(Generic[_O]):
    """One LIST response of any object model: ``PodListPage`` with ``objects`` for ``pods``."""

    objects: tuple[_O, ...]
    resource_version: str
    continue_token: str | None = None

    def joined(self, objects: list[_O], resource_version: str) -> ListPage[_O]:
        return ListPage(tuple(objects), resource_version)


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

    @property
    def object(self) -> Pod | None:
        """``pod``, under ``WatchEvent``'s name."""
        return self.pod

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
                        f"unreadable {event_type} frame: {validation_summary(err)}", name=meta.name
                    ) from None
                raise FrameDecodeError(
                    f"{event_type} pod does not validate: {validation_summary(err)}",
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
            return cls.from_status(status)
        raise FrameDecodeError(
            f"invalid watch event type {str(event_type)[:40]!r}", name=status.metadata.name
        )

    @classmethod
    def from_status(cls, status: WatchFrame) -> PodWatchEvent:
        """The ERROR event of a watch frame's Status."""
        reason = f"{status.code} {status.reason or ''}: {status.message or ''}"[:500]
        return cls(
            "ERROR",
            None,
            None,
            rejects_cursor=status_rejects_cursor(status.code, status.reason),
            reason=reason,
            code=status.code,
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


@dataclass(frozen=True, slots=True)
class WatchEvent(Generic[_O]):
    """One watch frame of any object model: ``PodWatchEvent`` with ``object`` for ``pod``."""

    type: str
    object: _O | None
    resource_version: str | None
    rejects_cursor: bool = False
    reason: str = ""
    initial_events_end: bool = False
    code: int | None = None

    @classmethod
    def of(cls, event: PodWatchEvent) -> WatchEvent[Any]:
        """A bookmark's or an ERROR frame's event (no object) as this class."""
        return cls(
            event.type,
            None,
            event.resource_version,
            event.rejects_cursor,
            event.reason,
            event.initial_events_end,
            event.code,
        )
