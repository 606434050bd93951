"""Kubelet churn for the differential harness: engine pods on the real node that crash, restart,
fail their readiness probe, end gracefully and come back under the same name with a new uid.

Go counterpart: none (test-side). Only a real kubelet writes these statuses (KWOK's stages write
none of them), so the churn runs only where the plane has a `RealNode`. Two bare engine pods and a
two-replica StatefulSet run on it, created at the first churn step. Each step drives the kubelet
through the engine's own endpoints (`crash_engine`, `set_engine_health`) or a delete, waits until
the apiserver shows the state the kubelet writes, and asks the harness for a checkpoint there, so
ours, client-go and a fresh LIST must agree on it (status summary included, `views.py`); the state
each agreed checkpoint showed is counted in `Stats.kubelet`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from miles.utils.k8s_testenv.kubelet import crash_engine, engine_container, set_engine_health
from miles.utils.k8s_testenv.real_node import RealNode
from miles.utils.k8s_testenv.testing.differential.stats import Stats
from miles.utils.k8s_testenv.testing.differential.views import PodRow, View

BARE_PARENT = "engines"
SET_PARENT = "engine-set"
SET_NAME = "engset"
BARE_NAMES = ("engine-0", "engine-1")
SET_NAMES = (f"{SET_NAME}-0", f"{SET_NAME}-1")
GRACE_SECONDS = 8
TERM_DELAY_SECONDS = 3.0
"""Inside the grace period, and long enough for a checkpoint to settle on the terminating pod."""
_START_SECONDS = 90.0
_KUBELET_SECONDS = 30.0
_POLL = 0.1

Checkpoint = Callable[[str], Awaitable[View]]
"""Runs a harness checkpoint and returns the fresh LIST every view agreed with."""
Labels = Callable[[str], dict[str, str]]
"""The labels that put a pod under a parent and inside the clients' selector."""


class ChurnFailed(RuntimeError):
    """The kubelet did not write a state the churn waited for (names the pod and what it saw)."""


@dataclass(kw_only=True)
class KubeletChurn:
    """`await churn.crash()`, `.graceful_delete()`, `.recreate()`, `.flip_readiness()`; `aclose()`
    deletes what it created."""

    core: Any
    apps: Any
    namespace: str
    node: RealNode
    rng: random.Random
    labels: Labels
    parent_label: str
    checkpoint: Checkpoint
    stats: Stats
    _started: bool = field(default=False, init=False)

    @property
    def backend(self) -> str:
        return f"real node {self.node.node_name}"

    async def crash(self) -> int:
        """Two crashes with seeded exit codes: the first restarts the container with its code in
        `lastState.terminated`, the second puts it in CrashLoopBackOff (at most the 5 s cap)."""
        name = await self._choose(BARE_NAMES + SET_NAMES)
        before = _restarts(await self._read(name))
        first, second = self.rng.sample(range(2, 100), 2)
        await crash_engine(self.core, namespace=self.namespace, name=name, exit_code=first)
        await self._until(
            name,
            lambda pod: _restarts(pod) > before and _last_exit(pod) == first and _running(pod),
            f"restarted after exit code {first}",
        )
        agreed = await self._agree(f"{name} restarted after exit code {first}")
        self._count(agreed, name, "restarted-with-exit-code", lambda r: r.endswith(f"last={first}"))
        await crash_engine(self.core, namespace=self.namespace, name=name, exit_code=second)
        await self._until(
            name,
            lambda pod: _last_exit(pod) == second,
            f"terminated with exit code {second}",
        )
        agreed = await self._agree(f"{name} crashed again with exit code {second}")
        self._count(agreed, name, "crash-loop-back-off", lambda r: "CrashLoopBackOff" in r)
        await self._until(name, _running_and_ready, "running and ready after its back-off")
        return 1

    async def graceful_delete(self) -> int:
        """A delete whose SIGTERM handler ends the engine inside its grace period: the
        terminating pod, then its absence, then a bare pod under the same name (a new uid)."""
        name = await self._choose(BARE_NAMES)
        old_uid = (await self._read(name)).metadata.uid
        await self.core.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=GRACE_SECONDS
        )
        await self._until(name, lambda pod: pod.metadata.deletion_timestamp is not None, "deleting")
        agreed = await self._agree(f"{name} terminating")
        self._count(agreed, name, "terminating", lambda r: " deleting" in r)
        await self._until_gone(name, GRACE_SECONDS + _KUBELET_SECONDS)
        agreed = await self._agree(f"{name} gone")
        if name not in agreed:
            self.stats.kubelet["gone"] += 1
        await self._create_bare(name)
        await self._until_recreated(name, old_uid)
        return 1

    async def recreate(self) -> int:
        """A StatefulSet pod deleted: its controller brings the same name back with a new uid."""
        name = await self._choose(SET_NAMES)
        old_uid = (await self._read(name)).metadata.uid
        await self.core.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=GRACE_SECONDS
        )
        await self._until_recreated(name, old_uid)
        return 1

    async def flip_readiness(self) -> int:
        """The readiness probe fails (Ready False, the container running), then passes again."""
        name = await self._choose(BARE_NAMES + SET_NAMES)
        await set_engine_health(self.core, namespace=self.namespace, name=name, healthy=False)
        await self._until(name, lambda pod: _running(pod) and not _ready(pod), "running, not ready")
        agreed = await self._agree(f"{name} not ready")
        self._count(agreed, name, "not-ready", lambda r: r.startswith("Running ready=False"))
        await set_engine_health(self.core, namespace=self.namespace, name=name, healthy=True)
        await self._until(name, _running_and_ready, "ready again")
        return 1

    async def aclose(self) -> None:
        """Deletes the StatefulSet and the engine pods, without grace (best effort)."""
        if not self._started:
            return
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self.apps.delete_namespaced_stateful_set(
                SET_NAME, self.namespace, propagation_policy="Background"
            )
            await self.core.delete_collection_namespaced_pod(
                self.namespace,
                label_selector=f"{self.parent_label} in ({BARE_PARENT},{SET_PARENT})",
                grace_period_seconds=0,
            )
        except (ApiException, OSError):
            pass

    # --- engine pods ------------------------------------------------------------------------

    async def _start(self) -> None:
        self._started = True
        for name in BARE_NAMES:
            await self._create_bare(name)
        await self.apps.create_namespaced_stateful_set(
            self.namespace,
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": SET_NAME},
                "spec": {
                    "replicas": len(SET_NAMES),
                    "serviceName": SET_NAME,
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": self.labels(SET_PARENT)},
                    "template": {
                        "metadata": {"labels": self.labels(SET_PARENT)},
                        "spec": self._engine_spec(),
                    },
                },
            },
        )
        for name in BARE_NAMES + SET_NAMES:
            await self._until(name, _running_and_ready, "running and ready", _START_SECONDS)
        await self._agree("engine pods running on the real node")

    def _engine_spec(self) -> dict[str, Any]:
        return {
            "nodeName": self.node.node_name,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "containers": [
                engine_container(term_delay_seconds=TERM_DELAY_SECONDS, readiness_probe=True)
            ],
        }

    async def _create_bare(self, name: str) -> None:
        await self.core.create_namespaced_pod(
            self.namespace,
            {
                "metadata": {"name": name, "labels": self.labels(BARE_PARENT)},
                "spec": self._engine_spec(),
            },
        )

    async def _choose(self, names: tuple[str, ...]) -> str:
        """A seeded choice among `names`, once it runs and is ready (created at the first step)."""
        if not self._started:
            await self._start()
        name = self.rng.choice(names)
        await self._until(name, _running_and_ready, "running and ready")
        return name

    async def _until_recreated(self, name: str, old_uid: str | None) -> None:
        await self._until(
            name,
            lambda pod: pod.metadata.uid != old_uid and _running_and_ready(pod),
            "back under its name with a new uid, running and ready",
            GRACE_SECONDS + _START_SECONDS,
        )
        agreed = await self._agree(f"{name} recreated")
        self._count(agreed, name, "recreated-new-uid", lambda _: agreed[name].uid != old_uid)

    # --- waits ------------------------------------------------------------------------------

    async def _agree(self, what: str) -> View:
        return await self.checkpoint(f"kubelet churn: {what}")

    def _count(self, agreed: View, name: str, state: str, shows: Callable[[str], bool]) -> None:
        row: PodRow | None = agreed.get(name)
        if row is not None and row.status is not None and shows(row.status):
            self.stats.kubelet[state] += 1
        else:
            self.stats.kubelet[f"{state} (passed before a checkpoint settled)"] += 1

    async def _read(self, name: str) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def _until(
        self,
        name: str,
        holds: Callable[[Any], bool],
        what: str,
        seconds: float = _KUBELET_SECONDS,
    ) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            pod = await self._read(name)
            if pod is not None and holds(pod):
                return pod
            if (problem := self.node.failure()) is not None:
                raise ChurnFailed(f"the real node broke while {name} was to be {what}: {problem}")
            if time.monotonic() > deadline:
                raise ChurnFailed(
                    f"pod {self.namespace}/{name} was not {what} within {seconds:.0f}s; "
                    f"last seen: {_describe(pod)}"
                )
            await asyncio.sleep(_POLL)

    async def _until_gone(self, name: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (pod := await self._read(name)) is not None:
            if time.monotonic() > deadline:
                raise ChurnFailed(
                    f"pod {self.namespace}/{name} was still there {seconds:.0f}s after its "
                    f"graceful delete: {_describe(pod)}"
                )
            await asyncio.sleep(_POLL)


def _container(pod: Any) -> Any:
    statuses = pod.status.container_statuses if pod.status is not None else None
    return statuses[0] if statuses else None


def _restarts(pod: Any) -> int:
    container = _container(pod)
    return int(container.restart_count) if container is not None else 0


def _last_exit(pod: Any) -> int | None:
    container = _container(pod)
    if container is None or container.last_state is None or not container.last_state.terminated:
        return None
    return int(container.last_state.terminated.exit_code)


def _running(pod: Any) -> bool:
    container = _container(pod)
    return (
        pod.status.phase == "Running"
        and pod.metadata.deletion_timestamp is None
        and container is not None
        and container.state is not None
        and container.state.running is not None
    )


def _ready(pod: Any) -> bool:
    conditions: list[Any] = pod.status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _running_and_ready(pod: Any) -> bool:
    return _running(pod) and _ready(pod)


def _describe(pod: Any) -> str:
    if pod is None:
        return "no such pod"
    container = _container(pod)
    state: Mapping[str, Any] = container.state.to_dict() if container is not None else {}
    current = {k: v for k, v in state.items() if v is not None}
    return (
        f"uid {pod.metadata.uid}, phase {pod.status.phase}, ready {_ready(pod)}, "
        f"deleting {pod.metadata.deletion_timestamp is not None}, restarts {_restarts(pod)}, "
        f"last exit {_last_exit(pod)}, state {current}"
    )
