"""Layer: real apiserver, no kubelet. A loop over several sources and loops sharing one informer,
against a real kube-apiserver (the cached one, watch cache on):

- a loop over an engine pool custom resource and the pods it owns (owner references set by the
  test), the pods watched metadata-only (``PartialObjectMetadata`` from the apiserver) and mapped
  by ``owner_key_map``: each pool is reconciled with its own pods, a pod moved to another pool
  wakes both pools;
- two loops over the same pods through one ``SharedInformerFactory``: the apiserver's own
  ``apiserver_request_total`` counts one LIST and one WATCH on pods for both, against two of each
  for two loops that do not share.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from kubernetes_asyncio import client

import miles.utils.k8s_testenv
from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.k8s_testenv.apiserver_metrics import apiserver_requests
from miles.utils.workers.reconcile.informer import SharedInformerFactory
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioResourceApi
from miles.utils.workers.reconcile.k8s_objects import PartialObjectMetadata
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.owner_key_map import owner_key_map
from miles.utils.workers.reconcile.resource import PODS, Resource
from miles.utils.workers.reconcile.source_event import ParentKey, SourceWatchFn
from miles.utils.workers.reconcile.watches import Watch
from tests.e2e.k8s_apiserver.harness import eventually, pod_manifest
from tests.e2e.k8s_apiserver.test_any_kind import EnginePool, _install_crd, _pool

pytestmark = pytest.mark.k8s_apiserver

CRD_MANIFEST = Path(miles.utils.k8s_testenv.__file__).parent / "crds" / "enginepool.yaml"
POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
LAYER = "k8s_apiserver: ran on the cached kube-apiserver (watch cache on)"
RUN_LABEL = "miles.test/run"


def _core(api: Any) -> Any:
    """The core API, untyped: the test sends manifests as mappings."""
    return client.CoreV1Api(api)


def _owned(name: str, pool: Any, run: str) -> dict[str, Any]:
    manifest = pod_manifest(name, cell=None)
    manifest["metadata"]["labels"][RUN_LABEL] = run
    manifest["metadata"]["ownerReferences"] = [_owner_ref(pool)]
    return manifest


def _owner_ref(pool: Any) -> dict[str, Any]:
    return {
        "apiVersion": POOLS.api_version,
        "kind": POOLS.kind,
        "name": pool["metadata"]["name"],
        "uid": pool["metadata"]["uid"],
        "controller": True,
    }


async def test_a_loop_over_pools_and_the_pods_they_own_metadata_only(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    run = uuid.uuid4().hex[:8]
    async with k8s_api_client("cached") as api:
        await _install_crd(api, yaml.safe_load(CRD_MANIFEST.read_text()))
        custom, core = client.CustomObjectsApi(api), _core(api)
        args = (POOLS.group, POOLS.version, k8s_namespace, POOLS.plural)
        a = await custom.create_namespaced_custom_object(*args, _pool("a", 1))
        b = await custom.create_namespaced_custom_object(*args, _pool("b", 1))
        await core.create_namespaced_pod(k8s_namespace, _owned("a-0", a, run))
        await core.create_namespaced_pod(k8s_namespace, _owned("b-0", b, run))
        stray = pod_manifest("stray", cell=None)
        stray["metadata"]["labels"][RUN_LABEL] = run
        await core.create_namespaced_pod(k8s_namespace, stray)

        pools = KubernetesReflector(
            api=KubernetesAsyncioResourceApi(api_client=api, resource=POOLS, model=EnginePool),
            namespace=k8s_namespace,
            name="pools",
        )
        pods_api = KubernetesAsyncioResourceApi(
            api_client=api, resource=PODS, model=PartialObjectMetadata, metadata_only=True
        )
        pods = KubernetesReflector(
            api=pods_api, namespace=k8s_namespace, label_selector=f"{RUN_LABEL}={run}"
        )
        seen: list[tuple[ParentKey, list[str]]] = []

        async def reconcile(pool: ParentKey) -> None:
            seen.append((pool, [p.metadata.name for p in loop.cache("pods").get_by_parent(pool)]))

        loop = ReconcileLoop(
            sources=[
                Watch(source=pools.watch),
                Watch(source=pods.watch, key_map=owner_key_map(POOLS, key="name"), name="pods"),
            ],
            reconcile=reconcile,
        )
        async with loop:
            await eventually(lambda: len(seen) >= 2, what="both pools reconciled")
            assert sorted(seen) == [("a", ["a-0"]), ("b", ["b-0"])]
            cached = loop.cache("pods").get("a-0")
            assert isinstance(cached, PartialObjectMetadata)
            assert cached.kind == "PartialObjectMetadata", "the apiserver sent metadata alone"
            assert cached.metadata.owner_references[0].api_version == POOLS.api_version
            assert loop.cache("pods").get("stray") is None, "no owner: no parent, not stored"
            status = loop.status()
            assert [s.name for s in status.sources] == ["pools", "pods"]
            assert all(s.synced for s in status.sources)

            seen.clear()
            await core.patch_namespaced_pod(
                "a-0",
                k8s_namespace,
                {"metadata": {"ownerReferences": [_owner_ref(b)]}},
                _content_type="application/merge-patch+json",
            )
            await eventually(
                lambda: ("b", ["a-0", "b-0"]) in seen and any(p == "a" for p, _ in seen),
                what="the old pool and the new woken",
            )
            assert ("a", []) in seen
            assert loop.get_by_parent("a")[0].spec.replicas == 1, "the first source's cache"
    print(LAYER)


async def _pod_reads(api: Any) -> dict[str, int]:
    """The apiserver's count of LIST and WATCH requests on pods."""
    return await apiserver_requests(api, "pods", "LIST", "WATCH")


async def _reads_of_two_loops(
    api: Any, namespace: str, run: str, *, shared: bool
) -> dict[str, int]:
    """LIST and WATCH requests on pods while two loops over the same pods start and sync."""
    selector = f"{RUN_LABEL}={run}"
    pods_api = KubernetesAsyncioResourceApi(
        api_client=api, resource=PODS, model=PartialObjectMetadata
    )
    before = await _pod_reads(api)
    reconciled: list[set[ParentKey]] = [set(), set()]

    def recorder(index: int) -> Any:
        async def reconcile(parent: ParentKey) -> None:
            reconciled[index].add(parent)

        return reconcile

    async with SharedInformerFactory() as factory:
        sources: list[SourceWatchFn]
        if shared:
            informer = factory.for_resource(pods_api, namespace=namespace, label_selector=selector)
            sources = [informer.subscribe("one"), informer.subscribe("two")]
        else:
            sources = [
                KubernetesReflector(
                    api=pods_api, namespace=namespace, label_selector=selector
                ).watch
                for _ in range(2)
            ]
        loops = [
            ReconcileLoop(source=source, reconcile=recorder(i), name=f"loop-{i}")
            for i, source in enumerate(sources)
        ]
        async with loops[0], loops[1]:
            await eventually(lambda: all(len(r) == 3 for r in reconciled), what="both loops")
            if shared:
                assert loops[0].get_by_parent("p-0")[0] is loops[1].get_by_parent("p-0")[0]
    after = await _pod_reads(api)
    return {verb: after[verb] - before[verb] for verb in before}


async def test_two_loops_share_one_watch_counted_by_the_apiserver(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    run = uuid.uuid4().hex[:8]
    async with k8s_api_client("cached") as api:
        core = _core(api)
        for i in range(3):
            manifest = pod_manifest(f"p-{i}", cell=None)
            manifest["metadata"]["labels"][RUN_LABEL] = run
            await core.create_namespaced_pod(k8s_namespace, manifest)
        shared = await _reads_of_two_loops(api, k8s_namespace, run, shared=True)
        apart = await _reads_of_two_loops(api, k8s_namespace, run, shared=False)
    print(f"pod requests for two loops: shared {shared}, apart {apart}")
    assert shared == {"LIST": 1, "WATCH": 1}
    assert apart == {"LIST": 2, "WATCH": 2}
    print(LAYER)


async def test_across_namespaces_parents_are_keyed_namespace_slash_name(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Both sources watch every namespace: the pools are keyed ``namespace/name`` by the
    reflector, the pods mapped to the same keys by ``owner_key_map``'s default."""
    run = uuid.uuid4().hex[:8]
    async with k8s_api_client("cached") as api:
        await _install_crd(api, yaml.safe_load(CRD_MANIFEST.read_text()))
        custom, core = client.CustomObjectsApi(api), _core(api)
        args = (POOLS.group, POOLS.version, k8s_namespace, POOLS.plural)
        pool = await custom.create_namespaced_custom_object(*args, _pool(f"p-{run}", 1, run=run))
        await core.create_namespaced_pod(k8s_namespace, _owned(f"p-{run}-0", pool, run))
        pools = KubernetesReflector(
            api=KubernetesAsyncioResourceApi(api_client=api, resource=POOLS, model=EnginePool),
            namespace="",
            label_selector=f"run={run}",
            name="pools",
        )
        pods = KubernetesReflector(
            api=KubernetesAsyncioResourceApi(
                api_client=api, resource=PODS, model=PartialObjectMetadata, metadata_only=True
            ),
            namespace="",
            label_selector=f"{RUN_LABEL}={run}",
        )
        seen: list[tuple[ParentKey, list[str]]] = []

        async def reconcile(parent: ParentKey) -> None:
            members = loop.cache("pods").get_by_parent(parent)
            seen.append((parent, [p.metadata.name for p in members]))

        loop = ReconcileLoop(
            sources=[
                Watch(source=pools.watch),
                Watch(source=pods.watch, key_map=owner_key_map(POOLS), name="pods"),
            ],
            reconcile=reconcile,
        )
        async with loop:
            key = f"{k8s_namespace}/p-{run}"
            await eventually(lambda: bool(seen), what="the pool reconciled")
            assert seen == [(key, [f"p-{run}-0"])]
            assert loop.parent_keys() == {key}
    print(LAYER)
