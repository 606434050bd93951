"""Owner references on the real node: kube-controller-manager's garbage collector deletes what a
deleted owner controlled (layer k8s_node: the garbage collector runs only in the node's
kube-controller-manager; a local control plane alone has none). Skips (fails under
MILES_K8S_REQUIRE) without root or the node's packages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import (
    api_client,
)
from miles.utils.k8s_testenv.kubelet import Probe, eventually
from miles.utils.workers.reconcile.controllerutil import set_controller_reference

if TYPE_CHECKING:
    from tests.e2e.k8s_node.conftest import NodeOnPlane

pytestmark = pytest.mark.k8s_kind

NAMESPACE = "default"
GC_SECONDS = 90.0


def _config_map(name: str) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"k": "v"},
    }


async def test_the_garbage_collector_deletes_what_a_deleted_owner_controlled(
    node_on_plane: NodeOnPlane,
) -> None:
    async with api_client(node_on_plane.plane.cached_kubeconfig) as api:
        core = client.CoreV1Api(api)
        owner = await core.create_namespaced_config_map(NAMESPACE, _config_map("owner"))
        owned = _config_map("owned")
        set_controller_reference(api.sanitize_for_serialization(owner), owned)
        await core.create_namespaced_config_map(NAMESPACE, owned)
        kept = await core.create_namespaced_config_map(NAMESPACE, _config_map("unowned"))
        await core.delete_namespaced_config_map("owner", NAMESPACE, propagation_policy="Background")

        async def owned_is_gone() -> str | None:
            try:
                await core.read_namespaced_config_map("owned", NAMESPACE)
            except ApiException as err:
                return "gone" if err.status == 404 else None
            return None

        probe: Probe[str] = owned_is_gone
        await eventually(probe, what="the owned ConfigMap collected", timeout_seconds=GC_SECONDS)
        still = await core.read_namespaced_config_map("unowned", NAMESPACE)
        assert still.metadata.uid == kept.metadata.uid
