"""The pod model where miles's controllers import it. Go: ``k8s.io/api/core/v1`` types.

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
    FrameMetadata,
    OwnerReference,
    Pod,
    PodCondition,
    PodIP,
    PodMetadata,
    PodSchedulingGate,
    PodSpec,
    PodStatus,
    WatchFrame,
)

__all__ = [
    "Container",
    "ContainerState",
    "ContainerStateRunning",
    "ContainerStateTerminated",
    "ContainerStateWaiting",
    "ContainerStatus",
    "FrameMetadata",
    "OwnerReference",
    "Pod",
    "PodCondition",
    "PodIP",
    "PodMetadata",
    "PodSchedulingGate",
    "PodSpec",
    "PodStatus",
    "WatchFrame",
]
