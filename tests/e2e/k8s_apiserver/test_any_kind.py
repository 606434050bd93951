"""Layer: real apiserver, no kubelet. The reflector over any resource against a real
kube-apiserver (watch cache on): a CustomResourceDefinition's objects (an engine pool, the manifest
in ``miles/utils/k8s_testenv/crds/enginepool.yaml``) synced typed and dynamic and followed through
creates, updates and deletes; a watch across every namespace; a cluster-scoped resource; a field
selector; a CRD missing at start, then installed, picked up by the 10 s retry.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml  # type: ignore[import-untyped]
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import miles.utils.k8s_testenv
from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioResourceApi
from miles.utils.workers.reconcile.k8s_objects import (
    DynamicObject,
    KubernetesModel,
    KubernetesObject,
    PartialObjectMetadata,
)
from miles.utils.workers.reconcile.k8s_pager import list_in_pages
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_types import Lenient
from miles.utils.workers.reconcile.k8s_values import ListOptions
from miles.utils.workers.reconcile.resource import (
    CONFIG_MAPS,
    CUSTOM_RESOURCE_DEFINITIONS,
    Resource,
)
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)
from tests.e2e.k8s_apiserver.harness import eventually

pytestmark = pytest.mark.k8s_apiserver

CRD_MANIFEST = Path(miles.utils.k8s_testenv.__file__).parent / "crds" / "enginepool.yaml"
POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
LAYER = "k8s_apiserver: ran on the cached kube-apiserver (watch cache on)"


class EnginePoolSpec(KubernetesModel):
    replicas: int = 0
    engine: Lenient[str | None] = None


class EnginePool(KubernetesObject):
    spec: EnginePoolSpec = EnginePoolSpec()


async def _install_crd(api: Any, manifest: dict[str, Any]) -> None:
    """Creates the CRD (or finds it there) and waits until it is Established."""
    extensions = client.ApiextensionsV1Api(api)
    try:
        await extensions.create_custom_resource_definition(manifest)  # type: ignore[arg-type]
    except ApiException as err:
        if err.status != 409:
            raise
    name = manifest["metadata"]["name"]

    async def established() -> bool:
        crd = await extensions.read_custom_resource_definition(name)
        conditions = crd.status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for _ in range(200):
        if await established():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"CRD {name} never Established")


def _pool(name: str, replicas: int, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": POOLS.api_version,
        "kind": POOLS.kind,
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "engine": "sglang"},
    }


class Collected:
    """A reflector's events as they arrive, in a task this owns."""

    def __init__(self) -> None:
        self.events: list[SourceEvent] = []

    def latest(self) -> dict[str, Any]:
        """The objects the events so far leave a store holding."""
        store: dict[str, Any] = {}
        for e in self.events:
            if isinstance(e, ReplaceEvent):
                store = dict(e.objects)
            elif isinstance(e, UpsertEvent):
                store[e.key] = e.obj
            elif isinstance(e, DeleteEvent):
                store.pop(e.key, None)
        return store


@asynccontextmanager
async def collecting(reflector: KubernetesReflector) -> AsyncIterator[Collected]:
    collected = Collected()

    async def pump() -> None:
        async for e in reflector.watch():
            collected.events.append(e)

    task = asyncio.create_task(pump())
    try:
        yield collected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _holds(seen: Collected, keys: list[str]) -> bool:
    return sorted(seen.latest()) == keys


def _reflector(api: Any, resource: Resource, model: Any, **kwargs: Any) -> KubernetesReflector:
    return KubernetesReflector(
        api=KubernetesAsyncioResourceApi(api_client=api, resource=resource, model=model), **kwargs
    )


async def test_custom_objects_sync_typed_and_dynamic_and_follow_changes(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        await _install_crd(api, yaml.safe_load(CRD_MANIFEST.read_text()))
        custom = client.CustomObjectsApi(api)
        create = custom.create_namespaced_custom_object
        args = (POOLS.group, POOLS.version, k8s_namespace, POOLS.plural)
        await create(*args, _pool("a", 1))
        await create(*args, _pool("b", 2))
        typed = _reflector(api, POOLS, EnginePool, namespace=k8s_namespace)
        dynamic = _reflector(
            api, POOLS, DynamicObject, namespace=k8s_namespace, streaming_list=True
        )
        async with collecting(typed) as t, collecting(dynamic) as d:
            for seen in (t, d):
                await eventually(partial(_holds, seen, ["a", "b"]), what="a and b")
            assert isinstance(t.events[0], ReplaceEvent)
            assert t.latest()["b"].spec.replicas == 2
            assert d.latest()["b"]["spec"] == {"replicas": 2, "engine": "sglang"}

            await create(*args, _pool("c", 3))
            await custom.patch_namespaced_custom_object(
                *args,
                "a",
                {"spec": {"replicas": 5}},
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            )
            await custom.delete_namespaced_custom_object(*args, "b")
            for seen in (t, d):
                await eventually(partial(_holds, seen, ["a", "c"]), what="c added, b deleted")
            await eventually(lambda: t.latest()["a"].spec.replicas == 5, what="a's update")
            assert d.latest()["a"]["spec"]["replicas"] == 5
            assert t.latest()["a"].metadata.generation == 2
            deletes = [e for e in t.events if isinstance(e, DeleteEvent)]
            assert [e.key for e in deletes] == ["b"]
    print(LAYER)


async def test_a_watch_across_all_namespaces_keys_namespace_slash_name(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    label = f"t{uuid.uuid4().hex[:8]}"
    async with k8s_api_client("cached") as api:
        core = client.CoreV1Api(api)
        other = f"t-{uuid.uuid4().hex[:10]}"
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))

        def cm(name: str) -> client.V1ConfigMap:
            return client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=name, labels={"miles.test/run": label}),
                data={"k": "v"},
            )

        await core.create_namespaced_config_map(k8s_namespace, cm("same"))
        reflector = _reflector(
            api, CONFIG_MAPS, DynamicObject, namespace="", label_selector=f"miles.test/run={label}"
        )
        async with collecting(reflector) as seen:
            await eventually(lambda: list(seen.latest()) == [f"{k8s_namespace}/same"], what="one")
            await core.create_namespaced_config_map(other, cm("same"))
            expected = sorted([f"{k8s_namespace}/same", f"{other}/same"])
            await eventually(lambda: sorted(seen.latest()) == expected, what="both namespaces")
            assert seen.latest()[f"{other}/same"]["data"] == {"k": "v"}
    print(LAYER)


async def test_a_cluster_scoped_resource_with_a_field_selector(
    k8s_api_client: ApiClientFactory,
) -> None:
    """The CRDs themselves (cluster-scoped), metadata only, one picked by ``metadata.name``."""
    async with k8s_api_client("cached") as api:
        await _install_crd(api, yaml.safe_load(CRD_MANIFEST.read_text()))
        reflector = _reflector(
            api,
            CUSTOM_RESOURCE_DEFINITIONS,
            PartialObjectMetadata,
            field_selector="metadata.name=enginepools.miles.io",
        )
        async with collecting(reflector) as seen:
            await eventually(lambda: bool(seen.events), what="the listing")
            assert list(seen.latest()) == ["enginepools.miles.io"]
            crd = seen.latest()["enginepools.miles.io"]
            assert crd.kind == "CustomResourceDefinition" or crd.kind is None
            assert crd.metadata.namespace is None
    print(LAYER)


async def test_a_field_selector_scopes_list_and_watch(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core = client.CoreV1Api(api)
        for name in ("picked", "other"):
            await core.create_namespaced_config_map(
                k8s_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
            )
        reflector = _reflector(
            api,
            CONFIG_MAPS,
            DynamicObject,
            namespace=k8s_namespace,
            field_selector="metadata.name=picked",
        )
        async with collecting(reflector) as seen:
            await eventually(lambda: bool(seen.events), what="the listing")
            assert list(seen.latest()) == ["picked"]
            patch = {"data": {"n": "1"}}
            await core.patch_namespaced_config_map("other", k8s_namespace, patch)
            await core.patch_namespaced_config_map("picked", k8s_namespace, patch)
            await eventually(
                lambda: seen.latest()["picked"].get("data") == {"n": "1"}, what="picked's update"
            )
            assert [e.key for e in seen.events if isinstance(e, UpsertEvent)] == ["picked"]
    print(LAYER)


async def test_a_crd_missing_at_start_is_picked_up_once_installed(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """controller-runtime's ``Kind`` source: not served (404) is retried every 10 s with one
    ERROR line naming group, version and resource; the CRD installed meanwhile is picked up."""
    suffix = uuid.uuid4().hex[:8]
    manifest = yaml.safe_load(CRD_MANIFEST.read_text())
    plural, kind = f"late{suffix}s", f"Late{suffix}"
    manifest["metadata"]["name"] = f"{plural}.miles.io"
    manifest["spec"]["names"] = {"plural": plural, "singular": f"late{suffix}", "kind": kind}
    late = Resource.custom(group="miles.io", version="v1alpha1", plural=plural, kind=kind)
    async with k8s_api_client("cached") as api:
        reflector = _reflector(api, late, DynamicObject, namespace=k8s_namespace)
        with caplog.at_level(logging.ERROR):
            async with collecting(reflector) as seen:
                line = f'list {plural} (group "miles.io", version v1alpha1): not served'
                await eventually(
                    lambda: any(line in r.getMessage() for r in caplog.records),
                    what="the not-served line",
                )
                await _install_crd(api, manifest)
                await client.CustomObjectsApi(api).create_namespaced_custom_object(
                    "miles.io", "v1alpha1", k8s_namespace, plural, {**_pool("x", 1), "kind": kind}
                )
                loop = asyncio.get_running_loop()
                installed = loop.time()
                await eventually(lambda: "x" in seen.latest(), what="x listed", within=15.0)
                print(f"picked up {loop.time() - installed:.1f}s after the CRD was Established")
    print(LAYER)


class StrictPoolSpec(KubernetesModel):
    replicas: int
    engine: Literal["sglang", "vllm"]


class StrictPool(KubernetesObject):
    spec: StrictPoolSpec


async def test_an_object_the_model_refuses_is_named_and_never_served(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The one rule for LIST and WATCH (record row "Objects that do not validate"): a LIST leaves
    the object out with one ERROR line; a WATCH frame carrying it ends the watch with one ERROR
    line and relists, which drops the copy stored before; once it validates again it is back."""
    async with k8s_api_client("cached") as api:
        await _install_crd(api, yaml.safe_load(CRD_MANIFEST.read_text()))
        custom = client.CustomObjectsApi(api)
        args = (POOLS.group, POOLS.version, k8s_namespace, POOLS.plural)
        bad = _pool("odd", 1)
        bad["spec"]["engine"] = "other"
        await custom.create_namespaced_custom_object(*args, _pool("good", 1))
        await custom.create_namespaced_custom_object(*args, bad)
        merge = "application/merge-patch+json"
        reflector = _reflector(api, POOLS, StrictPool, namespace=k8s_namespace, retry_delay=0.2)
        with caplog.at_level(logging.ERROR):
            async with collecting(reflector) as seen:
                await eventually(partial(_holds, seen, ["good"]), what="good alone")
                listed = "EnginePool left out of LIST: EnginePool=odd"
                assert any(listed in r.getMessage() for r in caplog.records)
                await custom.patch_namespaced_custom_object(
                    *args,
                    "odd",
                    {"spec": {"engine": "vllm"}},
                    _content_type=merge,  # type: ignore[call-arg]
                )
                await eventually(partial(_holds, seen, ["good", "odd"]), what="odd valid")
                await custom.patch_namespaced_custom_object(
                    *args,
                    "good",
                    {"spec": {"engine": "other"}},
                    _content_type=merge,  # type: ignore[call-arg]
                )
                await eventually(partial(_holds, seen, ["odd"]), what="good refused, dropped")
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        frame = "EnginePool watch frame unreadable after resourceVersion="
        assert any(frame in line and f"EnginePool {k8s_namespace}/good" in line for line in lines)
        assert any("spec.engine" in line for line in lines)
    print(LAYER)


class _ReadOrder:
    """A resource API whose reads and decodes are written down in the order they happen: per
    decode, how many reads had started, and each page's hint beside its decoded token."""

    def __init__(self, api: KubernetesAsyncioResourceApi[Any]) -> None:
        self.api = api
        self.reads: list[str | None] = []
        self.sent = 0
        self.decodes: list[int] = []
        self.hints: list[tuple[str | None, str | None]] = []

    async def list_page(self, options: ListOptions) -> Any:
        return await self.api.list_page(options)

    async def read_page(
        self,
        options: ListOptions,
        *,
        on_head: Callable[[str | None], object] | None = None,
        on_sent: Callable[[], object] | None = None,
    ) -> Any:
        self.reads.append(options.continue_token)

        def sent() -> None:
            self.sent += 1
            if on_sent is not None:
                on_sent()

        undecoded = await self.api.read_page(options, on_head=on_head, on_sent=sent)
        order = self

        class Recorded:
            continue_hint = undecoded.continue_hint

            def decode(self) -> Any:
                order.decodes.append(len(order.reads))
                page = undecoded.decode()
                order.hints.append((undecoded.continue_hint, page.continue_token))
                return page

        return Recorded()

    def stream(self, **kwargs: Any) -> Any:
        return self.api.stream(**kwargs)

    def stream_list(self, **kwargs: Any) -> Any:
        return self.api.stream_list(**kwargs)


async def test_a_paged_list_of_custom_objects_reads_the_next_page_before_decoding_this_one(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Row pager overlap: the apiserver writes a custom resource's list continue token after its
    items; the pager reads it from the body's last bytes and asks for the next page, whose request
    is written, before this page decodes."""
    async with k8s_api_client("cached") as api:
        await _install_crd(api, yaml.safe_load(CRD_MANIFEST.read_text()))
        custom = client.CustomObjectsApi(api)
        args = (POOLS.group, POOLS.version, k8s_namespace, POOLS.plural)
        for name in "abcde":
            await custom.create_namespaced_custom_object(*args, _pool(name, 1))
        order = _ReadOrder(
            KubernetesAsyncioResourceApi(api_client=api, resource=POOLS, model=EnginePool)
        )
        page = await list_in_pages(
            order, ListOptions(k8s_namespace), log=logging.getLogger(__name__), page_size=2
        )
    assert sorted(o.metadata.name for o in page.objects) == list("abcde")
    assert len(order.reads) == 3
    assert order.sent == 3
    assert order.decodes == [2, 3, 3]
    assert [hint == token for hint, token in order.hints] == [True, True, True]
    assert order.hints[0][0] is not None
    assert order.hints[2] == (None, None)
    print(LAYER)
