"""A pod's READY, STATUS, RESTARTS and AGE as ``kubectl get pods`` prints them. Go: ``printPod`` in
``k8s.io/kubernetes/pkg/printers/internalversion/printers.go`` (v1.36) and
``k8s.io/apimachinery/pkg/util/duration.HumanDuration``.

``kubectl get pods`` prints what the apiserver's table printer computed; this is the same function
over the fields ``k8s_types.Pod`` keeps, so the view needs no second request. Pure: a pod and a
time go in, strings come out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from miles.utils.workers.reconcile.k8s_types import (
    ContainerStateTerminated,
    ContainerStatus,
    Pod,
    PodStatus,
)

NODE_LOST = "NodeLost"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
NONE = "<none>"


@dataclass(frozen=True, slots=True)
class PodColumns:
    """One pod's cells; ``last_restart`` and ``created`` are kept as times so ages can move."""

    name: str
    ready: str
    status: str
    restarts: int
    last_restart: datetime | None
    created: datetime | None
    ip: str
    node: str


def pod_columns(pod: Pod) -> PodColumns:
    """``printPod``'s cells for ``pod``, ages left as times (see :func:`restarts_cell`)."""
    counts = _Counts(pod)
    return PodColumns(
        name=pod.metadata.name,
        ready=f"{counts.ready}/{counts.total}",
        status=counts.reason,
        restarts=counts.restarts,
        last_restart=counts.last_restart,
        created=_aware(pod.metadata.creation_timestamp),
        ip=_first_ip(pod.status) or NONE,
        node=pod.spec.node_name or NONE,
    )


def restarts_cell(restarts: int, last_restart: datetime | None, now: datetime) -> str:
    """``3`` or, once a container has terminated before, ``3 (2m ago)``."""
    if restarts and last_restart is not None:
        return f"{restarts} ({human_duration((now - last_restart).total_seconds())} ago)"
    return str(restarts)


def age_cell(created: datetime | None, now: datetime) -> str:
    """``translateTimestampSince``: ``<unknown>`` without a creation time."""
    if created is None:
        return "<unknown>"
    return human_duration((now - created).total_seconds())


def human_duration(seconds: float) -> str:
    """``duration.HumanDuration``: about two significant figures (``4m3s``, ``3h12m``, ``5d2h``)."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return _pair(minutes, "m", whole % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return _pair(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return _pair(hours // 24, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        return _pair(hours // 24 // 365, "y", (hours // 24) % 365, "d")
    return f"{hours // 24 // 365}y"


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}" if small == 0 else f"{big}{big_unit}{small}{small_unit}"


class _Counts:
    """``printPod``'s walk over init containers, then containers (last to first)."""

    def __init__(self, pod: Pod) -> None:
        status = pod.status
        self.total = len(pod.spec.containers)
        self.ready = 0
        self.restarts = 0
        self.last_restart: datetime | None = None
        self.reason = status.reason or status.phase or ""
        if any(
            c.type == "PodScheduled" and c.reason == "SchedulingGated" for c in status.conditions
        ):
            self.reason = "SchedulingGated"
        sidecars = {c.name or "" for c in pod.spec.init_containers if c.restart_policy == "Always"}
        self.total += len(sidecars)
        initializing = self._init_containers(pod, sidecars)
        if not initializing or _condition_true(status, "Initialized"):
            self._containers(pod, sidecars)
        if pod.metadata.deletion_timestamp is not None:
            if status.reason == NODE_LOST:
                self.reason = "Unknown"
            elif status.phase not in TERMINAL_PHASES:
                self.reason = "Terminating"

    def _init_containers(self, pod: Pod, sidecars: set[str]) -> bool:
        declared = len(pod.spec.init_containers)
        self._sidecar_restarts = 0
        self._sidecar_last: datetime | None = None
        for index, container in enumerate(pod.status.init_container_statuses):
            self.restarts += container.restart_count
            self.last_restart = _later(self.last_restart, _last_finished(container))
            sidecar = (container.name or "") in sidecars
            if sidecar:
                self._sidecar_restarts += container.restart_count
                self._sidecar_last = _later(self._sidecar_last, _last_finished(container))
            terminated = container.state.terminated
            waiting = container.state.waiting
            if terminated is not None and not terminated.exit_code:
                continue
            if sidecar and container.started:
                self.ready += 1 if container.ready else 0
                continue
            if terminated is not None:
                self.reason = "Init:" + _terminated_reason(terminated)
            elif waiting is not None and waiting.reason and waiting.reason != "PodInitializing":
                self.reason = "Init:" + waiting.reason
            else:
                self.reason = f"Init:{index}/{declared}"
            return True
        return False

    def _containers(self, pod: Pod, sidecars: set[str]) -> None:
        self.restarts = self._sidecar_restarts
        self.last_restart = self._sidecar_last
        has_running = False
        error_reason = ""
        for container in reversed(pod.status.container_statuses):
            self.restarts += container.restart_count
            self.last_restart = _later(self.last_restart, _last_finished(container))
            state = container.state
            if state.waiting is not None and state.waiting.reason:
                self.reason = state.waiting.reason
            elif state.terminated is not None:
                self.reason = _terminated_reason(state.terminated)
                if state.terminated.exit_code:
                    error_reason = self.reason
            elif container.ready and state.running is not None:
                has_running = True
                self.ready += 1
        if self.reason == "Completed":
            if has_running and _condition_true(pod.status, "Ready"):
                self.reason = "Running"
            elif error_reason:
                self.reason = error_reason
            elif has_running:
                self.reason = "NotReady"


def _terminated_reason(terminated: ContainerStateTerminated) -> str:
    if terminated.reason:
        return terminated.reason
    if terminated.signal:
        return f"Signal:{terminated.signal}"
    return f"ExitCode:{terminated.exit_code or 0}"


def _last_finished(container: ContainerStatus) -> datetime | None:
    terminated = container.last_state.terminated
    return _aware(terminated.finished_at) if terminated is not None else None


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


def _condition_true(status: PodStatus, kind: str) -> bool:
    return next((c.status == "True" for c in status.conditions if c.type == kind), False)


def _first_ip(status: PodStatus) -> str | None:
    return next((ip.ip for ip in status.pod_ips if ip.ip), None) or status.pod_ip


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
