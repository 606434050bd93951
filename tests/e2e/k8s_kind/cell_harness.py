"""A cell of pods watched by a real `ReconcileLoop` through `KubernetesReflector`, for the k8s_kind
layer: one namespace per test, a LIST/WATCH-recording `KubernetesPodApi`, and every reconcile
call kept with the members it saw."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.kubelet import KubeletLayer, create_namespace
from miles.utils.k8s_testenv.testing.pod_api_recorder import RecordingPodApi
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.loop import ReconcileLoop

CELL_LABEL = "miles.test/cell"
SELECTED_LABEL = "miles.test/e2e"
SELECTED = "kubelet-layer"


@dataclass(frozen=True)
class Reconciled:
    parent: str
    members: tuple[Pod, ...]

    @property
    def names(self) -> set[str]:
        return {pod.metadata.name for pod in self.members}


def cell_of(pod: Pod) -> str | None:
    return pod.metadata.labels.get(CELL_LABEL)


def is_running_and_ready(pod: Pod) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
    return pod.status.phase == "Running" and ready


class CellHarness:
    """Pods in a fresh namespace, and a `ReconcileLoop` over them keyed by `CELL_LABEL`."""

    def __init__(self, layer: KubeletLayer, core_v1: Any, namespace: str) -> None:
        self.layer = layer
        self.core_v1 = core_v1
        self.namespace = namespace
        self.api = RecordingPodApi.over(core_v1)
        self.reconciled: list[Reconciled] = []
        self._loop: ReconcileLoop | None = None

    @property
    def loop(self) -> ReconcileLoop:
        assert self._loop is not None, "the reconcile loop is not running"
        return self._loop

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, layer: KubeletLayer, *, watch_timeout_seconds: int = 300
    ) -> AsyncIterator[CellHarness]:
        async with api_client(layer.kubeconfig) as api:
            core_v1: Any = client.CoreV1Api(api)
            namespace = f"miles-e2e-{uuid.uuid4().hex[:8]}"
            await create_namespace(layer, core_v1, namespace)
            harness = cls(layer, core_v1, namespace)
            try:
                async with harness._running(watch_timeout_seconds):
                    yield harness
            finally:
                await harness._clean_up()

    @contextlib.asynccontextmanager
    async def _running(self, watch_timeout_seconds: int) -> AsyncIterator[None]:
        reflector = KubernetesReflector(
            kube_client=self.api,
            namespace=self.namespace,
            label_selector=f"{SELECTED_LABEL}={SELECTED}",
            watch_timeout_seconds=watch_timeout_seconds,
        )
        self._loop = ReconcileLoop(source=reflector.watch, reconcile=self._record, key_map=cell_of)
        async with self._loop:
            yield

    async def _record(self, parent: str) -> None:
        self.reconciled.append(Reconciled(parent, tuple(self.loop.get_by_parent(parent))))

    async def _clean_up(self) -> None:
        # No namespace controller runs beside KWOK, so pods go explicitly, at once.
        await self.core_v1.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        await self.core_v1.delete_namespace(self.namespace)

    async def create_pod(
        self, cell: str, name: str, *, restart_policy: str = "Always", selected: bool = True
    ) -> Any:
        labels = {CELL_LABEL: cell, SELECTED_LABEL: SELECTED if selected else "unselected"}
        manifest = self.layer.pod_manifest(name=name, labels=labels, restart_policy=restart_policy)
        return await self.core_v1.create_namespaced_pod(self.namespace, manifest)

    async def delete_pod(self, name: str, *, grace_period_seconds: int) -> None:
        await self.core_v1.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=grace_period_seconds
        )

    def members(self, cell: str) -> list[Pod]:
        return list(self.loop.get_by_parent(cell))

    def parent_keys(self) -> set[str]:
        return self.loop.parent_keys()

    def member_names(self, cell: str) -> set[str]:
        return {pod.metadata.name for pod in self.members(cell)}

    def member(self, cell: str, name: str) -> Pod | None:
        return next((p for p in self.members(cell) if p.metadata.name == name), None)

    def last_reconciled(self, cell: str) -> Reconciled | None:
        return next((r for r in reversed(self.reconciled) if r.parent == cell), None)

    def reconciled_when(
        self, cell: str, holds: Callable[[Reconciled], bool]
    ) -> Callable[[], Reconciled | None]:
        """A probe for `eventually`: the last reconcile of `cell`, once `holds` is true of it."""

        def probe() -> Reconciled | None:
            last = self.last_reconciled(cell)
            return last if last is not None and holds(last) else None

        return probe

    def describe(self, cell: str) -> str:
        pods = [
            f"{p.metadata.name}: phase={p.status.phase} "
            f"restarts={[s.restart_count for s in p.status.container_statuses]} "
            f"deleting={p.metadata.deletion_timestamp is not None}"
            for p in self.members(cell)
        ]
        return (
            f"store cell {cell!r} = {pods}; LISTs={len(self.api.lists)} "
            f"probes={len(self.api.probes)}"
        )

    async def converge(self, cell: str, names: set[str], *, timeout_seconds: float) -> Reconciled:
        """The first reconcile of `cell` that saw exactly `names`, every one Running and Ready."""

        def probe() -> Reconciled | None:
            last = self.last_reconciled(cell)
            if last is None or last.names != names:
                return None
            return last if all(is_running_and_ready(p) for p in last.members) else None

        return await self.layer.eventually(
            probe,
            what=f"a reconcile of cell {cell!r} seeing {sorted(names)} all Running and Ready",
            timeout_seconds=timeout_seconds,
            seen=lambda: self.describe(cell),
        )
