"""The Kubernetes models where miles's controllers and tools import them.
Go: ``k8s.io/api/core/v1`` and ``batch/v1`` types.

It re-exports ``miles.utils.workers.reconcile.k8s_types``: the same classes, never copies, so
identity and ``isinstance`` hold across both names. A package, not a module, so that its
``py.typed`` marks it typed inside the ``miles.utils.workers`` namespace.
"""

from miles.utils.workers.reconcile.k8s_types import (
    Container,
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    Event,
    EventList,
    FrameMetadata,
    Job,
    JobCondition,
    JobStatus,
    ObjectMeta,
    ObjectReference,
    OwnerReference,
    Pod,
    PodCondition,
    PodIP,
    PodList,
    PodMetadata,
    PodSchedulingGate,
    PodSpec,
    PodStatus,
    SkippedItem,
    WatchFrame,
    WatchFrameMetadata,
)

__all__ = [
    "Container",
    "ContainerState",
    "ContainerStateRunning",
    "ContainerStateTerminated",
    "ContainerStateWaiting",
    "ContainerStatus",
    "Event",
    "EventList",
    "FrameMetadata",
    "Job",
    "JobCondition",
    "JobStatus",
    "ObjectMeta",
    "ObjectReference",
    "OwnerReference",
    "Pod",
    "PodCondition",
    "PodIP",
    "PodList",
    "PodMetadata",
    "PodSchedulingGate",
    "PodSpec",
    "PodStatus",
    "SkippedItem",
    "WatchFrame",
    "WatchFrameMetadata",
]
