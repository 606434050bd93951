"""Layer: real apiserver, no kubelet. `controllerutil.Finalizer` on a ConfigMap of a real
kube-apiserver (the cached one), patched through the write client: the finalizer is added before
the controller acts, a real delete leaves the object until the cleanup ran and the finalizer was
removed (another controller's finalizer kept), and a list that changed since it was read fails the
`test` op (422) and removes nothing. Owner references written by `set_controller_reference` are
accepted by the apiserver, and a second controller is refused before any request."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.workers.reconcile.client import Client
from miles.utils.workers.reconcile.controllerutil import (
    AlreadyOwnedError,
    Finalizer,
    set_controller_reference,
)
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.resource import CONFIG_MAPS

pytestmark = pytest.mark.k8s_apiserver

DRAIN = "miles.example.com/drain"
OTHER = "other.example.com/keep"


def _client(api: Any) -> Client:
    return Client(transport=KubernetesAsyncioTransport(api_client=api), field_manager="e2e")


async def _body(response: Any) -> Any:
    """The JSON of a raw response (kubernetes_asyncio raises on no status when asked for the
    raw body); an answer other than 2xx is the runtime's `KubernetesApiError`."""
    body = json.loads(await response.read())
    if response.status >= 300:
        raise KubernetesApiError(response.status, body.get("reason", ""), body.get("message", ""))
    return body


@dataclass
class _Handlers:
    calls: list[str] = field(default_factory=list)

    async def apply(self, obj: Any) -> str:
        assert obj["metadata"].get("deletionTimestamp") is None
        self.calls.append("apply")
        return "applied"

    async def cleanup(self, obj: Any) -> str:
        assert obj["metadata"]["deletionTimestamp"]
        self.calls.append("cleanup")
        return "cleaned"


async def _read(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    response = await core.read_namespaced_config_map(name, namespace, _preload_content=False)
    if response.status == 404:
        return None
    body: dict[str, Any] = await _body(response)
    return body


async def _finalizers(core: Any, namespace: str, name: str) -> list[str]:
    """The finalizers of a ConfigMap that must still be there."""
    live = await _read(core, namespace, name)
    assert live is not None
    return list(live["metadata"]["finalizers"])


async def _refused_as_stale(finalizer: Finalizer, stale: Any, handlers: _Handlers) -> None:
    """The finalizer's patch of ``stale`` fails its ``test`` op: 422, nothing removed."""
    with pytest.raises(KubernetesApiError) as raised:
        await finalizer.reconcile(stale, apply=handlers.apply, cleanup=handlers.cleanup)
    assert raised.value.code == 422


async def test_the_finalizer_flow_with_a_real_delete(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core: Any = client.CoreV1Api(api)
        manifest = {"metadata": {"name": "pool-a", "finalizers": [OTHER]}, "data": {"k": "v"}}
        await core.create_namespaced_config_map(k8s_namespace, manifest)
        finalizer = Finalizer(name=DRAIN, client=_client(api), resource=CONFIG_MAPS)
        handlers = _Handlers()

        async def step() -> Any:
            obj = await _read(core, k8s_namespace, "pool-a")
            assert obj is not None
            return await finalizer.reconcile(obj, apply=handlers.apply, cleanup=handlers.cleanup)

        assert await step() is None
        assert handlers.calls == []
        assert await _finalizers(core, k8s_namespace, "pool-a") == [OTHER, DRAIN]
        assert await step() == "applied"

        await core.delete_namespaced_config_map("pool-a", k8s_namespace)
        stale = await _read(core, k8s_namespace, "pool-a")
        assert stale is not None
        assert stale["metadata"]["deletionTimestamp"]
        await core.patch_namespaced_config_map(
            "pool-a", k8s_namespace, [{"op": "remove", "path": "/metadata/finalizers/0"}]
        )
        await _refused_as_stale(finalizer, stale, handlers)
        assert await _finalizers(core, k8s_namespace, "pool-a") == [DRAIN]

        assert await step() == "cleaned"
        assert await _read(core, k8s_namespace, "pool-a") is None
    assert handlers.calls == ["apply", "cleanup", "cleanup"]
    print("k8s_apiserver: the finalizer flow ran against the cached kube-apiserver")


async def test_a_controller_reference_is_accepted_and_a_second_controller_refused(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core: Any = client.CoreV1Api(api)
        owners = [
            api.sanitize_for_serialization(
                await core.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": n}})
            )
            for n in ("owner-a", "owner-b")
        ]
        owned: dict[str, Any] = {"metadata": {"name": "owned", "namespace": k8s_namespace}}
        set_controller_reference(owners[0], owned)
        with pytest.raises(
            AlreadyOwnedError, match="owned by another ConfigMap controller owner-a"
        ):
            set_controller_reference(owners[1], owned)
        created = await core.create_namespaced_config_map(k8s_namespace, owned)
    (ref,) = created.metadata.owner_references
    assert (ref.name, ref.uid) == ("owner-a", owners[0]["metadata"]["uid"])
    assert (ref.controller, ref.block_owner_deletion) == (True, True)


async def test_an_absent_list_passes_the_null_test_and_a_present_one_fails_it(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core: Any = client.CoreV1Api(api)
        await core.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": "bare"}})
        stale = await _read(core, k8s_namespace, "bare")
        assert stale is not None
        finalizer = Finalizer(name=DRAIN, client=_client(api), resource=CONFIG_MAPS)
        handlers = _Handlers()
        assert (
            await finalizer.reconcile(stale, apply=handlers.apply, cleanup=handlers.cleanup) is None
        )
        assert await _finalizers(core, k8s_namespace, "bare") == [DRAIN]
        await _refused_as_stale(finalizer, stale, handlers)
        assert await _finalizers(core, k8s_namespace, "bare") == [DRAIN]
    assert handlers.calls == []
