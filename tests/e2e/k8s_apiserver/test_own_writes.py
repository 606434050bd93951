"""Layer: real apiserver (cached, watch cache on), no kubelet; the loop's watches go through
`HttpFaultProxy`, its writes straight to the apiserver. Read your own writes (`own_writes.py`):

- a controller keeping N pods per pool (a ConfigMap, `data.replicas`), creating them with
  `generateName` through `Client`, its pods watch delayed by `DELAY` s (the proxy's `Delay`) and
  its pools watch not: the pool changed right after its pods were made is reconciled again while
  the cache still lacks them. Without a gate the reconcile reads the stale cache and the pool gets
  at least 2N pods; with `OwnWrites` wired as documented (`Client(on_write=tracker.observer(PODS))`,
  the pods source `tracker.watching(...)`, `ReconcileLoop(dispatch_gate=tracker)`) it gets
  exactly N, and every reconcile after the first starts with every pod made before it cached;
- the bound: the pods watch frozen, the write's resourceVersion never arrives, and the pool is
  reconciled `BOUND` s after the write with one warning line naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.http_fault_proxy import WATCH, Delay, HttpFaultProxy
from miles.utils.workers.reconcile.client import Client, MergePatch
from miles.utils.workers.reconcile.k8s_api import (
    KubernetesAsyncioResourceApi,
    KubernetesAsyncioTransport,
)
from miles.utils.workers.reconcile.k8s_objects import DynamicObject, PartialObjectMetadata
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.own_writes import OwnWrites
from miles.utils.workers.reconcile.resource import CONFIG_MAPS, PODS
from miles.utils.workers.reconcile.source_event import ParentKey
from miles.utils.workers.reconcile.watches import Watch
from tests.e2e.k8s_apiserver.harness import POLL_SECONDS, eventually

pytestmark = [pytest.mark.k8s_apiserver, pytest.mark.usefixtures("behind_the_fault_proxy")]

POOL = "pool-a"
REPLICAS = 2
DELAY = 2.0
"""How late the pods watch's frames reach the loop: well above the apiserver's latency for a
write and a watch event on loopback (milliseconds), so the second reconcile surely comes first."""
BOUND = 3.0
POOL_LABEL = "miles.test/pool"
RUN_LABEL = "miles.test/run"
OWN_WRITES_LOGGER = "miles.utils.workers.reconcile.own_writes"


@dataclass(frozen=True)
class Reconciled:
    """One reconcile of a pool: when it began, the pods its cache held then, and (with a gate)
    the newest resourceVersion the pods source had applied."""

    at: float
    cached: frozenset[str]
    store_version: int | None


@dataclass
class Replicas:
    """Keeps `data.replicas` pods per pool, counted in the loop's cache, creating the missing
    ones with `generateName` (the apiserver cannot refuse a second): the naive controller."""

    writer: Client
    namespace: str
    run: str
    tracker: OwnWrites | None
    loop: ReconcileLoop | None = None
    runs: list[Reconciled] = field(default_factory=list)
    created: list[tuple[float, str, int]] = field(default_factory=list)
    """When each pod's create was sent, its name and the resourceVersion the create returned."""

    async def __call__(self, pool: ParentKey) -> None:
        assert self.loop is not None
        config = self.loop.cache("pools").get(pool)
        if config is None:
            return
        cached = {p.metadata.name for p in self.loop.cache("pods").get_by_parent(pool)}
        version = None if self.tracker is None else self.tracker.store_version
        self.runs.append(Reconciled(time.monotonic(), frozenset(cached), version))
        for _ in range(int(config["data"]["replicas"]) - len(cached)):
            started = time.monotonic()
            made = await self.writer.create(PODS, self._pod(pool), namespace=self.namespace)
            meta = made["metadata"]
            self.created.append((started, meta["name"], int(meta["resourceVersion"])))

    def _pod(self, pool: str) -> dict[str, Any]:
        return {
            "metadata": {
                "generateName": f"{pool}-",
                "labels": {POOL_LABEL: pool, RUN_LABEL: self.run},
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox"}]},
        }

    def made_before(self, at: float) -> set[str]:
        return {name for made_at, name, _ in self.created if made_at < at}


@dataclass
class Running:
    proxy: HttpFaultProxy
    direct: Client
    core: Any
    controller: Replicas
    loop: ReconcileLoop
    namespace: str

    async def create_pool(self) -> None:
        pool = {
            "metadata": {"name": POOL, "labels": {RUN_LABEL: self.controller.run}},
            "data": {"replicas": str(REPLICAS)},
        }
        await self.direct.create(CONFIG_MAPS, pool, namespace=self.namespace)

    async def touch_pool(self) -> None:
        """A change to the pool the controller does not act on: one more event for it."""
        touched = MergePatch({"metadata": {"annotations": {"miles.test/touched": "yes"}}})
        await self.direct.patch(CONFIG_MAPS, POOL, touched, namespace=self.namespace)

    async def pods(self) -> set[str]:
        """The pool's pods as the apiserver lists them."""
        selector = f"{POOL_LABEL}={POOL},{RUN_LABEL}={self.controller.run}"
        listed = await self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return {pod.metadata.name for pod in listed.items}

    def cached(self) -> set[str]:
        return {p.metadata.name for p in self.loop.cache("pods").get_by_parent(POOL)}

    async def settled(self) -> set[str]:
        """The pool's pods once the loop's cache holds every one the apiserver lists: no pod is
        deleted here, so from then on every reconcile counts at least as many as it wants."""
        deadline = time.monotonic() + 30.0
        while True:
            listed = await self.pods()
            if listed and self.cached() == listed:
                return listed
            assert time.monotonic() < deadline, f"cache {self.cached()} never held {listed}"
            await asyncio.sleep(POLL_SECONDS)


@asynccontextmanager
async def running(
    kubeconfig: Path, tmp_path: Path, namespace: str, *, tracker: OwnWrites | None
) -> AsyncIterator[Running]:
    """The controller's loop behind the proxy (its pods watch delayed by `DELAY`), its writes and
    the test's straight to the apiserver; with `tracker`, wired as `own_writes.py` documents."""
    run = uuid.uuid4().hex[:8]
    async with HttpFaultProxy(kubeconfig=kubeconfig) as proxy:
        proxy.add(WATCH, Delay(DELAY))
        proxied = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        async with api_client(proxied) as through, api_client(kubeconfig) as straight:
            transport = KubernetesAsyncioTransport(api_client=straight)
            on_write = None if tracker is None else tracker.observer(PODS)
            writer = Client(transport=transport, field_manager="replicas", on_write=on_write)
            controller = Replicas(writer=writer, namespace=namespace, run=run, tracker=tracker)
            loop = _loop(through, namespace, run, controller, tracker)
            controller.loop = loop
            direct = Client(transport=transport, field_manager="test")
            async with loop:
                core = k8s.CoreV1Api(straight)
                yield Running(proxy, direct, core, controller, loop, namespace)


def _loop(
    api: Any, namespace: str, run: str, controller: Replicas, tracker: OwnWrites | None
) -> ReconcileLoop:
    def reflector(resource: Any, model: type[Any], name: str) -> KubernetesReflector:
        source = KubernetesAsyncioResourceApi(
            api_client=api, resource=resource, model=model, metadata_only=resource == PODS
        )
        selector = f"{RUN_LABEL}={run}"
        return KubernetesReflector(
            api=source, namespace=namespace, label_selector=selector, name=name
        )

    pods = reflector(PODS, PartialObjectMetadata, "pods").watch
    return ReconcileLoop(
        sources=[
            Watch(source=reflector(CONFIG_MAPS, DynamicObject, "pools").watch, name="pools"),
            Watch(
                source=pods if tracker is None else tracker.watching(pods),
                key_map=lambda pod: pod.metadata.labels.get(POOL_LABEL),
                name="pods",
            ),
        ],
        reconcile=controller,
        dispatch_gate=tracker,
        name="replicas",
    )


async def _create_then_touch(env: Running) -> float:
    """The pool is created, reconciled once (its pods made), then changed while the pods watch
    still lags; returns when the change was made."""
    controller = env.controller
    await env.create_pool()
    await eventually(lambda: len(controller.created) == REPLICAS, what="the first reconcile")
    await env.touch_pool()
    touched = time.monotonic()
    assert not env.cached() & controller.made_before(touched), (
        "the pods watch caught up before the pool was touched: the test tested nothing"
    )
    return touched


@pytest.mark.parametrize("read_own_writes", [False, True], ids=["naive", "own-writes"])
async def test_a_lagging_watch_doubles_a_naive_controllers_pods_and_the_gate_makes_exactly_n(
    read_own_writes: bool, cached_kubeconfig: Path, tmp_path: Path, k8s_namespace: str
) -> None:
    tracker = OwnWrites(name="replicas") if read_own_writes else None
    async with running(cached_kubeconfig, tmp_path, k8s_namespace, tracker=tracker) as env:
        touched = await _create_then_touch(env)
        pods = await env.settled()
        controller = env.controller
        delayed = env.proxy.seen(lambda s: s.outcome == f"response delayed {DELAY:g}s")
        assert delayed, "the pods watch was never delayed"
    assert pods == {name for _, name, _ in controller.created}
    second = controller.runs[1]
    print(
        f"{'own writes' if tracker else 'naive'}: {len(pods)} pods for {REPLICAS} replicas, "
        f"{len(controller.runs)} reconciles; the touched pool reconciled "
        f"{second.at - touched:.2f}s after the touch, its cache holding {len(second.cached)} pods"
    )
    if tracker is None:
        assert len(pods) >= 2 * REPLICAS, f"the naive controller made only {sorted(pods)}"
        assert not second.cached, "the second reconcile read a cache that held the pods"
        return
    assert len(pods) == REPLICAS, f"made {sorted(pods)}"
    assert tracker.waits >= 1
    assert tracker.bound_passed == 0
    for reconciled in controller.runs[1:]:
        made = {n: v for at, n, v in controller.created if at < reconciled.at}
        assert reconciled.cached >= set(made), "a reconcile ran before its writes were cached"
        assert reconciled.store_version is not None
        assert reconciled.store_version >= max(made.values())
    assert second.cached == pods


async def test_a_write_the_watch_never_delivers_is_reconciled_after_the_bound_with_one_line(
    cached_kubeconfig: Path,
    tmp_path: Path,
    k8s_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = OwnWrites(name="replicas", bound=BOUND)
    caplog.set_level(logging.WARNING, logger=OWN_WRITES_LOGGER)
    async with running(cached_kubeconfig, tmp_path, k8s_namespace, tracker=tracker) as env:
        env.proxy.clear()
        await _freeze_the_pods_watch(env.proxy)
        await _create_then_touch(env)
        controller = env.controller
        await eventually(lambda: len(controller.runs) >= 2, what="the pool reconciled again")
    last_write_at, _, last_version = controller.created[REPLICAS - 1]
    waited = controller.runs[1].at - last_write_at
    print(f"bound {BOUND}s: the touched pool reconciled {waited:.2f}s after the last write")
    assert waited >= BOUND, f"reconciled {waited:.2f}s after the write"
    assert tracker.bound_passed == 1
    lines = [r.getMessage() for r in caplog.records if r.name == OWN_WRITES_LOGGER]
    assert lines == [
        f"[replicas] {POOL}: the cache still lacks this controller's write at resourceVersion "
        f"{last_version} (store at {tracker.store_version}) after {BOUND}s; reconciling it anyway"
    ]


async def _freeze_the_pods_watch(proxy: HttpFaultProxy) -> None:
    """Freezes the loop's pods watch, polling until it streams (the loop is synced, its WATCH may
    still be on its way)."""
    deadline = time.monotonic() + 30.0
    while not await proxy.freeze(WATCH):
        assert time.monotonic() < deadline, "the pods watch never streamed through the proxy"
        await asyncio.sleep(POLL_SECONDS)
