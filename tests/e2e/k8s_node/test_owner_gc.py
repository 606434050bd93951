"""Owner references on the real node: kube-controller-manager's garbage collector deletes what a
deleted owner controlled (layer k8s_node: the garbage collector runs only in the node's
kube-controller-manager; a local control plane alone has none). Skips (fails under
MILES_K8S_REQUIRE) without root or the node's packages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import (
    BinaryPaths,
    EnvSettings,
    LocalControlPlane,
    PrerequisiteError,
    RealNode,
    api_client,
    ensure_node_binaries,
)
from miles.utils.k8s_testenv.host_state import HostSnapshot
from miles.utils.k8s_testenv.kubelet import Probe, eventually
from miles.utils.k8s_testenv.real_node import check_prerequisites
from miles.utils.workers.reconcile.controllerutil import set_controller_reference

pytestmark = pytest.mark.k8s_kind

NAMESPACE = "default"
GC_SECONDS = 90.0


@pytest.fixture(scope="module")
def plane(k8s_settings: EnvSettings, k8s_binaries: BinaryPaths) -> Iterator[LocalControlPlane]:
    try:
        check_prerequisites()
        binaries = ensure_node_binaries(settings=k8s_settings)
    except PrerequisiteError as error:
        if k8s_settings.require:
            pytest.fail(f"{error}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
        pytest.skip(str(error))
    before = HostSnapshot.take()
    with (
        LocalControlPlane(binaries=k8s_binaries, settings=EnvSettings(), keep=False) as started,
        RealNode.on(started, binaries=binaries),
    ):
        yield started
    assert before.differences() == []


def _config_map(name: str) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"k": "v"},
    }


async def test_the_garbage_collector_deletes_what_a_deleted_owner_controlled(
    plane: LocalControlPlane,
) -> None:
    async with api_client(plane.cached_kubeconfig) as api:
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
