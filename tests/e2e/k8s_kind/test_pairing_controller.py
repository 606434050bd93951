"""k8s_kind layer: the pairing controller of the kind miles's training system runs, on our runtime:
the shipped `examples/colocate_pairing` reconciler and its `ReconcileLoop` over
`KubernetesReflector` over `KubernetesAsyncioPodApi`, in the test's process.

Inference pods are created gated (`spec.schedulingGates`) and without a node, and name their
trainer in a label. The controller maps trainer and inference pods alike to the trainer's name.
Once the trainer has a node, it pins each gated inference pod of that trainer to the same node
(`spec.nodeSelector` `kubernetes.io/hostname`, which may be added to while a pod is gated, where
`nodeName` may not) and removes its gate, in one JSON patch guarded by the resourceVersion it read,
sent by the write client, and records a `Paired` event about the pod (read back from the apiserver).
Every assertion reads the apiserver (fresh GETs), never the loop's store.

The test runs unchanged on every backend of the layer. Where nothing schedules (KWOK, whose
`KubeletLayer.node_name` is set), a stand-in for kube-scheduler binds each ungated, unbound pod
whose `nodeSelector` the node's labels satisfy; on the real node kube-scheduler does that itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.kubelet import KubeletLayer, create_namespace, describe_pod
from miles.utils.workers.k8s_types import Pod
from miles.utils.workers.reconcile.client import Client
from miles.utils.workers.reconcile.events import ClientEventSink, EventRecorder
from miles.utils.workers.reconcile.examples.colocate_pairing import (
    EVENT_COMPONENT,
    PAIRED_REASON,
    ColocatePairing,
    Pairing,
    PairingConfig,
    pairing_loop,
)
from miles.utils.workers.reconcile.k8s_api import (
    KubernetesAsyncioPodApi,
    KubernetesAsyncioTransport,
)

pytestmark = pytest.mark.k8s_kind

GATE = "miles.io/paired-with-trainer"
OTHER_GATE = "example.com/quota"
TRAINER_LABEL = "miles.test/trainer"
ROLE_LABEL = "miles.test/role"
SELECTED_LABEL = "miles.test/e2e"
SELECTED = "pairing"
HOSTNAME = "kubernetes.io/hostname"
SECONDS = 90.0
CONFIG = PairingConfig(
    selector=f"{SELECTED_LABEL}={SELECTED}",
    gate=GATE,
    trainer_label=TRAINER_LABEL,
    role_label=ROLE_LABEL,
    node_label=HOSTNAME,
)
"""KWOK needs about a second for each step; the real node schedules and starts containers."""


def gates(pod: Pod) -> list[str | None]:
    return [gate.name for gate in pod.spec.scheduling_gates]


@dataclass
class Passes:
    """Every reconcile the shipped controller made, in order."""

    seen: list[Pairing] = field(default_factory=list)

    def saw(self, trainer: str, holds: Callable[[Pairing], bool], *, after: int = 0) -> bool:
        return any(p.trainer == trainer and holds(p) for p in self.seen[after:])


@dataclass(frozen=True)
class Cluster:
    layer: KubeletLayer
    core_v1: Any
    namespace: str
    controller: Passes

    def _manifest(self, name: str, role: str, trainer: str) -> dict[str, Any]:
        labels = {SELECTED_LABEL: SELECTED, ROLE_LABEL: role, TRAINER_LABEL: trainer}
        return self.layer.pod_manifest(name=name, labels=labels)

    async def create_trainer(self, name: str) -> Any:
        return await self.core_v1.create_namespaced_pod(
            self.namespace, self._manifest(name, "trainer", name)
        )

    async def create_inference(
        self, name: str, *, trainer: str, gate_names: tuple[str, ...] = (GATE,)
    ) -> Any:
        manifest = self._manifest(name, "inference", trainer)
        manifest["spec"].pop("nodeName", None)
        manifest["spec"]["schedulingGates"] = [{"name": gate} for gate in gate_names]
        return await self.core_v1.create_namespaced_pod(self.namespace, manifest)

    async def get(self, name: str) -> Any:
        return await self.core_v1.read_namespaced_pod(name, self.namespace)

    async def node_of(self, name: str) -> str:
        """The node the apiserver says pod `name` is bound to, once it is."""
        last: list[Any] = [None]

        async def bound() -> str | None:
            last[0] = await self.get(name)
            return str(last[0].spec.node_name) if last[0].spec.node_name else None

        return await self.layer.eventually(
            bound,
            what=f"pod {self.namespace}/{name} bound to a node",
            timeout_seconds=SECONDS,
            seen=lambda: describe_pod(last[0]),
        )

    async def released_onto(self, name: str, node: str) -> None:
        """Pod `name`, fetched afresh, is ungated, pinned to `node` and bound there."""
        assert await self.node_of(name) == node
        pod = await self.get(name)
        assert not pod.spec.scheduling_gates, describe_pod(pod)
        assert pod.spec.node_selector == {HOSTNAME: node}

    async def paired_event(self, name: str) -> None:
        """The controller's `Paired` event about pod `name`, as `kubectl describe pod` lists it."""

        async def recorded() -> str | None:
            events = await self.core_v1.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={name}"
            )
            reasons = {(e.reason, e.source.component) for e in events.items}
            return name if (PAIRED_REASON, EVENT_COMPONENT) in reasons else None

        found: str = await self.layer.eventually(
            recorded, what=f"a {PAIRED_REASON} event about {name}", timeout_seconds=SECONDS
        )
        assert found == name

    async def after_a_pass(self, trainer: str, holds: Callable[[Pairing], bool], what: str) -> None:
        await self.layer.eventually(
            lambda: self.controller.saw(trainer, holds),
            what=what,
            timeout_seconds=SECONDS,
            seen=lambda: [p for p in self.controller.seen if p.trainer == trainer][-3:],
        )


@contextlib.asynccontextmanager
async def pairing_cluster(layer: KubeletLayer) -> AsyncIterator[Cluster]:
    async with api_client(layer.kubeconfig) as api:
        core_v1: Any = client.CoreV1Api(api)
        namespace = f"miles-pair-{uuid.uuid4().hex[:8]}"
        await create_namespace(layer, core_v1, namespace)
        passes = Passes()
        writes = Client(transport=KubernetesAsyncioTransport(api_client=api))
        recorder = EventRecorder(sink=ClientEventSink(writes), component=EVENT_COMPONENT)
        controller = ColocatePairing(
            client=writes,
            recorder=recorder,
            namespace=namespace,
            config=CONFIG,
            on_pass=passes.seen.append,
        )
        loop = pairing_loop(
            controller,
            pod_api=KubernetesAsyncioPodApi(core_v1_api=core_v1),
            namespace=namespace,
            selector=CONFIG.selector,
        )
        try:
            async with recorder, loop, _scheduler_stand_in(layer, core_v1, namespace):
                yield Cluster(layer, core_v1, namespace, passes)
        finally:
            await core_v1.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            await core_v1.delete_namespace(namespace)


@contextlib.asynccontextmanager
async def _scheduler_stand_in(
    layer: KubeletLayer, core_v1: Any, namespace: str
) -> AsyncIterator[None]:
    """Where nothing schedules, binds what kube-scheduler would: ungated, unbound pods whose
    `nodeSelector` the node's labels satisfy (its NodeAffinity filter), through `pods/binding`."""
    if layer.node_name is None:
        yield
        return
    node = await core_v1.read_node(layer.node_name)
    task = asyncio.create_task(
        _bind_forever(core_v1, namespace, layer.node_name, node.metadata.labels or {})
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _bind_forever(core_v1: Any, namespace: str, node: str, labels: dict[str, str]) -> None:
    while True:
        for pod in (await core_v1.list_namespaced_pod(namespace)).items:
            spec = pod.spec
            if spec.node_name or spec.scheduling_gates or pod.metadata.deletion_timestamp:
                continue
            if not (spec.node_selector or {}).items() <= labels.items():
                continue
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod.metadata.name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            with contextlib.suppress(ApiException):  # bound meanwhile, or gone
                await core_v1.create_namespaced_pod_binding(
                    pod.metadata.name, namespace, binding, _preload_content=False
                )
        await asyncio.sleep(0.1)


async def test_gated_inference_pods_are_released_onto_their_trainers_node(
    kubelet_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(4 * SECONDS), pairing_cluster(kubelet_layer) as cluster:
        for name in ("infer-0", "infer-1"):
            await cluster.create_inference(name, trainer="trainer-0")
        await cluster.create_inference("held", trainer="trainer-0", gate_names=(GATE, OTHER_GATE))
        await cluster.create_inference("foreign", trainer="trainer-0", gate_names=(OTHER_GATE,))
        await cluster.create_inference("orphan", trainer="trainer-gone")
        await cluster.after_a_pass(
            "trainer-0",
            lambda p: p.node is None and {"infer-0", "infer-1", "held", "foreign"} <= p.members,
            "a pass over trainer-0's inference pods before the trainer exists",
        )
        assert gates(Pod.model_validate(await cluster.get("infer-0"))) == [GATE]

        await cluster.create_trainer("trainer-0")
        node = await cluster.node_of("trainer-0")
        for name in ("infer-0", "infer-1"):
            await cluster.released_onto(name, node)
            await cluster.paired_event(name)
        held = Pod.model_validate(await cluster.get("held"))
        assert (gates(held), held.spec.node_selector) == ([OTHER_GATE], {HOSTNAME: node})
        assert held.spec.node_name is None

        await cluster.after_a_pass(
            "trainer-gone", lambda p: p.members == {"orphan"}, "a pass over the orphan's trainer"
        )
        for name, gate_names in (("foreign", [OTHER_GATE]), ("orphan", [GATE])):
            pod = Pod.model_validate(await cluster.get(name))
            assert (gates(pod), pod.spec.node_selector, pod.spec.node_name) == (
                gate_names,
                {},
                None,
            ), f"{name} was touched"


async def test_a_trainer_deleted_and_recreated_re_pairs(kubelet_layer: KubeletLayer) -> None:
    async with asyncio.timeout(5 * SECONDS), pairing_cluster(kubelet_layer) as cluster:
        first = await cluster.create_trainer("trainer-0")
        await cluster.create_inference("infer-0", trainer="trainer-0")
        node = await cluster.node_of("trainer-0")
        await cluster.released_onto("infer-0", node)

        await cluster.core_v1.delete_namespaced_pod(
            "trainer-0", cluster.namespace, grace_period_seconds=0
        )
        await cluster.create_inference("infer-1", trainer="trainer-0")
        await cluster.after_a_pass(
            "trainer-0",
            lambda p: p.node is None and p.members == {"infer-0", "infer-1"},
            "a pass over trainer-0's pods with the trainer gone",
        )
        assert gates(Pod.model_validate(await cluster.get("infer-1"))) == [GATE]

        second = await cluster.create_trainer("trainer-0")
        assert second.metadata.uid != first.metadata.uid
        new_node = await cluster.node_of("trainer-0")
        await cluster.released_onto("infer-1", new_node)
        await cluster.released_onto("infer-0", node)
