"""Layer: real apiserver (cached), no kubelet. The write client (`client.Client` over each
transport: `k8s_http2.Http2Transport`, `k8s_http.HttpTransport` and `KubernetesAsyncioTransport`)
against a real kube-apiserver: create, get, replace guarded by resourceVersion, merge, JSON
(guarded by a `test`) and strategic merge patches, server-side apply with its field-manager
conflicts and `force`, the status subresource (of a pod and of a custom resource: patch, replace,
apply; strategic merge refused for the latter before any request), and delete with preconditions,
propagation policy and grace period; typed (a pydantic model) and dynamic (a dict).
Each error is the runtime's own, told apart by its reason.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field

import miles.utils.k8s_testenv
from miles.utils.workers.reconcile.client import (
    Client,
    JsonPatch,
    MergePatch,
    Preconditions,
    StrategicMergePatch,
    retry_on_conflict,
)
from miles.utils.workers.reconcile.k8s_errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidError,
    NotFoundError,
    is_conflict,
)
from miles.utils.workers.reconcile.k8s_objects import DynamicObject
from miles.utils.workers.reconcile.resource import (
    CONFIG_MAPS,
    CUSTOM_RESOURCE_DEFINITIONS,
    PODS,
    Resource,
)
from tests.e2e.k8s_apiserver.harness import writer_on

pytestmark = pytest.mark.k8s_apiserver


class _Meta(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    name: str
    namespace: str | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    uid: str | None = None
    labels: dict[str, str] | None = None


class _ConfigMap(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    api_version: str = Field(default="v1", alias="apiVersion")
    kind: str = "ConfigMap"
    metadata: _Meta
    data: dict[str, str] | None = None


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "writes"}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/main:1"}]},
    }


def writing(kubeconfig: Path, transport: str) -> AbstractAsyncContextManager[Client]:
    return writer_on(kubeconfig, transport, field_manager="e2e")


async def test_create_get_replace_and_conflicts_typed(
    cached_kubeconfig: Path, k8s_namespace: str, write_transport_name: str
) -> None:
    async with writing(cached_kubeconfig, write_transport_name) as writes:
        made = await writes.create(
            CONFIG_MAPS,
            _ConfigMap(metadata=_Meta(name="typed", namespace=k8s_namespace), data={"a": "1"}),
        )
        assert isinstance(made, _ConfigMap)
        assert made.metadata.resource_version
        with pytest.raises(AlreadyExistsError) as taken:
            await writes.create(
                CONFIG_MAPS,
                made.model_copy(update={"metadata": _Meta(name="typed")}),
                namespace=k8s_namespace,
            )
        assert taken.value.code == 409
        assert taken.value.reason == "AlreadyExists"
        got = await writes.get(CONFIG_MAPS, "typed", namespace=k8s_namespace, into=_ConfigMap)
        assert got.data == {"a": "1"}
        replaced = await writes.replace(CONFIG_MAPS, got.model_copy(update={"data": {"a": "2"}}))
        assert replaced.data == {"a": "2"}
        with pytest.raises(ConflictError) as stale:
            await writes.replace(CONFIG_MAPS, got.model_copy(update={"data": {"a": "3"}}))
        assert stale.value.code == 409
        assert is_conflict(stale.value)
        with pytest.raises(NotFoundError):
            await writes.get(CONFIG_MAPS, "absent", namespace=k8s_namespace)


async def test_patches_dynamic(
    cached_kubeconfig: Path, k8s_namespace: str, write_transport_name: str
) -> None:
    async with writing(cached_kubeconfig, write_transport_name) as writes:
        pod = await writes.create(PODS, _pod("patched"), namespace=k8s_namespace)
        version = pod["metadata"]["resourceVersion"]
        merged = await writes.patch(
            PODS,
            "patched",
            MergePatch({"metadata": {"labels": {"m": "1"}}}),
            namespace=k8s_namespace,
        )
        assert merged["metadata"]["labels"] == {"app": "writes", "m": "1"}
        with pytest.raises(ConflictError):
            await writes.patch(
                PODS,
                "patched",
                JsonPatch.guarded(
                    version, [{"op": "add", "path": "/metadata/labels/j", "value": "1"}]
                ),
                namespace=k8s_namespace,
            )
        guarded = JsonPatch.guarded(
            merged["metadata"]["resourceVersion"],
            [{"op": "add", "path": "/metadata/labels/j", "value": "1"}],
        )
        assert (await writes.patch(PODS, "patched", guarded, namespace=k8s_namespace))["metadata"][
            "labels"
        ]["j"] == "1"
        strategic = StrategicMergePatch(
            {"spec": {"containers": [{"name": "main", "image": "registry.invalid/main:2"}]}}
        )
        after = await writes.patch(PODS, "patched", strategic, namespace=k8s_namespace)
        assert [c["image"] for c in after["spec"]["containers"]] == ["registry.invalid/main:2"]
        status = await writes.patch(
            PODS,
            "patched",
            MergePatch({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            namespace=k8s_namespace,
            subresource="status",
        )
        assert status["status"]["conditions"][0]["type"] == "Ready"


async def test_apply_conflict_force_and_status(
    cached_kubeconfig: Path, k8s_namespace: str, write_transport_name: str
) -> None:
    async with writing(cached_kubeconfig, write_transport_name) as writes:
        desired = {"metadata": {"name": "applied", "namespace": k8s_namespace}, "data": {"k": "a"}}
        first = await writes.apply(CONFIG_MAPS, desired, field_manager="first")
        again = await writes.apply(CONFIG_MAPS, desired, field_manager="first")
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        other = {"metadata": {"name": "applied", "namespace": k8s_namespace}, "data": {"k": "b"}}
        with pytest.raises(ConflictError) as owned:
            await writes.apply(CONFIG_MAPS, other, field_manager="second")
        assert [c.field for c in owned.value.causes] == [".data.k"]
        assert owned.value.causes[0].type == "FieldManagerConflict"
        forced = await writes.apply(CONFIG_MAPS, other, field_manager="second", force=True)
        assert forced["data"] == {"k": "b"}
        with pytest.raises(ValueError, match="managedFields"):
            await writes.apply(CONFIG_MAPS, forced, field_manager="first")
        await writes.create(PODS, _pod("status"), namespace=k8s_namespace)
        status = {
            "metadata": {"name": "status", "namespace": k8s_namespace},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]},
        }
        applied = await writes.apply(PODS, status, field_manager="status-mgr", subresource="status")
        assert applied["status"]["conditions"][0]["type"] == "PodScheduled"
        with pytest.raises(InvalidError) as invalid:
            await writes.patch(
                PODS,
                "status",
                MergePatch({"metadata": {"labels": {"bad label": "x"}}}),
                namespace=k8s_namespace,
            )
        assert invalid.value.code == 422
        assert invalid.value.causes


async def test_delete_preconditions_and_retry_on_conflict(
    cached_kubeconfig: Path, k8s_namespace: str, write_transport_name: str
) -> None:
    async with writing(cached_kubeconfig, write_transport_name) as writes:
        made = await writes.create(
            CONFIG_MAPS, {"metadata": {"name": "gone"}, "data": {"n": "0"}}, namespace=k8s_namespace
        )

        async def bump() -> dict[str, Any]:
            now = await writes.get(CONFIG_MAPS, "gone", namespace=k8s_namespace)
            now["data"]["n"] = str(int(now["data"]["n"]) + 1)
            return await writes.replace(CONFIG_MAPS, now)

        assert (await retry_on_conflict(bump))["data"]["n"] == "1"
        with pytest.raises(ConflictError):
            await writes.delete(
                CONFIG_MAPS,
                "gone",
                namespace=k8s_namespace,
                preconditions=Preconditions(uid="00000000-0000-0000-0000-000000000000"),
            )
        with pytest.raises(ConflictError):
            await writes.delete(
                CONFIG_MAPS,
                "gone",
                namespace=k8s_namespace,
                preconditions=Preconditions(resource_version=made["metadata"]["resourceVersion"]),
            )
        await writes.delete(
            CONFIG_MAPS,
            "gone",
            namespace=k8s_namespace,
            preconditions=Preconditions(uid=made["metadata"]["uid"]),
            propagation_policy="Background",
            grace_period_seconds=0,
        )
        with pytest.raises(NotFoundError):
            await writes.get(CONFIG_MAPS, "gone", namespace=k8s_namespace)
        await writes.create(CONFIG_MAPS, {"metadata": {"name": "fg"}}, namespace=k8s_namespace)
        pending = await writes.delete(
            CONFIG_MAPS, "fg", namespace=k8s_namespace, propagation_policy="Foreground"
        )
        # No garbage collector runs on this layer: the foreground finalizer stays, which shows
        # the policy reached the apiserver.
        assert pending["metadata"]["finalizers"] == ["foregroundDeletion"]
        assert pending["metadata"]["deletionTimestamp"]


async def test_a_dynamic_object_round_trips(
    cached_kubeconfig: Path, k8s_namespace: str, write_transport_name: str
) -> None:
    async with writing(cached_kubeconfig, write_transport_name) as writes:
        desired = DynamicObject.model_validate(
            {"metadata": {"name": "dyn", "namespace": k8s_namespace}, "data": {"k": "1"}}
        )
        made = await writes.create(CONFIG_MAPS, desired)
        assert isinstance(made, DynamicObject)
        assert made.metadata.uid
        read = await writes.get(CONFIG_MAPS, "dyn", namespace=k8s_namespace, into=DynamicObject)
        changed = read.model_copy(update={"data": {"k": "2"}})
        replaced = await writes.replace(CONFIG_MAPS, changed)
        assert replaced["data"] == {"k": "2"}
        assert replaced.metadata.resource_version != read.metadata.resource_version


POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
CRD_MANIFEST = Path(miles.utils.k8s_testenv.__file__).parent / "crds" / "enginepool.yaml"


async def install_pools(writes: Client) -> None:
    """The engine pool CRD, created (or found) through the client and Established."""
    manifest = yaml.safe_load(CRD_MANIFEST.read_text())
    with suppress(AlreadyExistsError):
        await writes.create(CUSTOM_RESOURCE_DEFINITIONS, manifest)
    for _ in range(200):
        crd = await writes.get(CUSTOM_RESOURCE_DEFINITIONS, manifest["metadata"]["name"])
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the engine pool CRD never became Established")


async def test_a_custom_resources_status_subresource(
    cached_kubeconfig: Path, k8s_namespace: str, write_transport_name: str
) -> None:
    async with writing(cached_kubeconfig, write_transport_name) as writes:
        await install_pools(writes)
        pool = {"metadata": {"name": "pool"}, "spec": {"replicas": 3, "engine": "sglang"}}
        made = await writes.create(POOLS, pool, namespace=k8s_namespace)
        generation = made["metadata"]["generation"]
        status = MergePatch({"status": {"readyReplicas": 1, "observedGeneration": generation}})
        patched = await writes.patch(
            POOLS, "pool", status, namespace=k8s_namespace, subresource="status"
        )
        assert patched["status"]["readyReplicas"] == 1
        assert patched["metadata"]["generation"] == generation
        # Through the main resource a status is ignored; through the status one, the spec is.
        ignored = MergePatch({"status": {"readyReplicas": 9}, "spec": {"replicas": 4}})
        main = await writes.patch(POOLS, "pool", ignored, namespace=k8s_namespace)
        assert main["status"]["readyReplicas"] == 1
        assert main["spec"]["replicas"] == 4
        replaced = await writes.replace(
            POOLS,
            {**main, "status": {"readyReplicas": 2}, "spec": {"replicas": 7}},
            subresource="status",
        )
        assert replaced["status"] == {"readyReplicas": 2}
        assert replaced["spec"]["replicas"] == 4
        with pytest.raises(ConflictError):
            await writes.replace(
                POOLS, {**main, "status": {"readyReplicas": 5}}, subresource="status"
            )
        desired = {
            "metadata": {"name": "pool", "namespace": k8s_namespace},
            "status": {"readyReplicas": 3},
        }
        with pytest.raises(ConflictError) as owned:
            await writes.apply(POOLS, desired, field_manager="pool-status", subresource="status")
        assert [c.field for c in owned.value.causes] == [".status.readyReplicas"]
        applied = await writes.apply(
            POOLS, desired, field_manager="pool-status", force=True, subresource="status"
        )
        assert applied["status"]["readyReplicas"] == 3
        with pytest.raises(ValueError, match="strategic merge patch needs a built-in kind"):
            await writes.patch(
                POOLS, "pool", StrategicMergePatch({"spec": {}}), namespace=k8s_namespace
            )
