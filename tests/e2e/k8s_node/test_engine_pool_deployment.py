"""The engine-pool operator as a Deployment on the real node: layer k8s_node (containerd, runc, a
kubelet, kube-scheduler and kube-controller-manager on this host) on a local control plane's cached
apiserver. Needs root and the node's packages; skips (fails under MILES_K8S_REQUIRE) without them.

The controller image is imported into the node by the conftest's ``controller_node``, the CRD is
applied from ``k8s_testenv/crds`` and ``deploy/engine-pool.yaml`` as it is in the repository. A
watch of the pool and a watch of its pods run from before the pool exists to the end, and every
event is checked as it arrives:

- the pool's pods that are not terminating never outnumber ``spec.replicas`` (the larger of the
  old and the new value from the moment the test changes it until the pool has converged);
- no pod name is created twice: a name is ADDED again only after its previous pod was DELETED.

Steps: a pool of 3, scaled to 5 and to 1, a pod deleted (recreated under its name), the leader
deleted right after a scale to 4, a ``kubectl rollout restart`` (the Deployment's template
annotated) with a scale to 2 under way; after each the status converges to what the pods say
(``replicas``, ``readyReplicas``, ``observedGeneration``, the Ready condition). Deleting the pool
runs the drain once (the ``Draining`` Events' counts sum to 1, every pod was annotated) and leaves
no pod and no pool behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import (
    RealNode,
    api_client,
)
from miles.utils.k8s_testenv.kubelet import engine_container
from miles.utils.workers.reconcile.examples.engine_pool import (
    DRAINING_ANNOTATION,
    DRAINING_REASON,
    ENGINE_POOLS,
    POOL_LABEL,
)
from tests.e2e.k8s_node.deployment import (
    REPO_ROOT,
    create_documents,
    read_manifest,
    ready_pod_names,
    until,
)

pytestmark = pytest.mark.k8s_kind

MANIFEST = REPO_ROOT / "deploy" / "engine-pool.yaml"
CRD = REPO_ROOT / "miles" / "utils" / "k8s_testenv" / "crds" / "enginepool.yaml"
NAMESPACE = "engine-pool"
LEASE = "engine-pool"
POOL = "engines"
APP = "app.kubernetes.io/name=engine-pool"
SECONDS = 120.0


@dataclass
class Watched:
    """The pool and its pods as the watches saw them, with every check made at each event."""

    bound: int = 0
    """What the live pods may number now: the larger of old and new while a change is under way."""
    pods: dict[str, tuple[str, bool, bool]] = field(default_factory=dict)
    """name -> (uid, terminating, ready) of each pod that exists."""
    pool: dict[str, Any] | None = None
    uids: dict[str, list[str]] = field(default_factory=dict)
    drained: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    max_live: int = 0
    events: int = 0

    def live(self) -> list[str]:
        return sorted(n for n, (_, terminating, _) in self.pods.items() if not terminating)

    def pod_event(self, kind: str, pod: Any) -> None:
        self.events += 1
        meta = pod.metadata
        name, uid = meta.name, meta.uid
        if kind == "DELETED":
            if self.pods.get(name, ("",))[0] == uid:
                del self.pods[name]
            return
        held = self.pods.get(name)
        if held is not None and held[0] != uid:
            self.violations.append(f"{name} created as {uid} while {held[0]} still exists")
        if uid not in self.uids.setdefault(name, []):
            self.uids[name].append(uid)
        ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or ()))
        self.pods[name] = (uid, meta.deletion_timestamp is not None, ready)
        if DRAINING_ANNOTATION in (meta.annotations or {}):
            self.drained.add(name)
        live = len(self.live())
        self.max_live = max(self.max_live, live)
        if live > self.bound:
            self.violations.append(f"{live} live pods {self.live()} over the bound {self.bound}")

    def pool_event(self, kind: str, pool: dict[str, Any]) -> None:
        self.events += 1
        self.pool = None if kind == "DELETED" else pool


async def _follow(list_call: Any, *args: Any, on: Any, **kwargs: Any) -> None:
    """List then watch, from the listing's resourceVersion, until cancelled."""
    while True:
        try:
            listed = await list_call(*args, **kwargs)
        except ApiException as error:
            if error.status != 429:  # a new resource's watch cache answers 429 until it is ready
                raise
            await asyncio.sleep(0.5)
            continue
        items = listed["items"] if isinstance(listed, dict) else listed.items
        for item in items:
            on("ADDED", item)
        version = (
            listed["metadata"]["resourceVersion"]
            if isinstance(listed, dict)
            else listed.metadata.resource_version
        )
        with contextlib.suppress(ApiException):
            async with watch.Watch() as stream:
                async for event in stream.stream(
                    list_call, *args, resource_version=version, timeout_seconds=300, **kwargs
                ):
                    on(event["type"], event["object"])


@dataclass
class Cluster:
    core: Any
    apps: Any
    custom: Any
    coordination: Any
    watched: Watched
    timings: list[str] = field(default_factory=list)
    followers: list[asyncio.Task[None]] = field(default_factory=list)
    operator_logs: dict[str, str] = field(default_factory=dict)

    def failure(self) -> str | None:
        """Why waiting is pointless: a watch of the test ended."""
        for task in self.followers:
            if task.done():
                error = None if task.cancelled() else task.exception()
                return f"a watch of the test ended: {type(error).__name__} {error}"
        return None

    async def seen(self) -> str:
        with contextlib.suppress(ApiException):
            for pod in (await self.core.list_namespaced_pod(NAMESPACE, label_selector=APP)).items:
                name = pod.metadata.name
                log = await self.core.read_namespaced_pod_log(name, NAMESPACE, tail_lines=40)
                self.operator_logs[name] = log
        return "\n".join(
            [f"pods {self.watched.pods}", f"pool {self.watched.pool}"]
            + [f"--- {name}\n{log}" for name, log in self.operator_logs.items()]
        )

    async def scale(self, replicas: int) -> None:
        spec = (self.watched.pool or {}).get("spec", {})
        self.watched.bound = max(self.watched.bound, spec.get("replicas", 0), replicas)
        await self.custom.patch_namespaced_custom_object(
            ENGINE_POOLS.group,
            ENGINE_POOLS.version,
            NAMESPACE,
            ENGINE_POOLS.plural,
            POOL,
            [{"op": "replace", "path": "/spec/replicas", "value": replicas}],
        )

    def converged(self, replicas: int) -> bool:
        pool = self.watched.pool
        if pool is None:
            return False
        status = pool.get("status") or {}
        live = self.watched.live()
        ready = sum(1 for n in live if self.watched.pods[n][2])
        conditions = {c.get("type"): c for c in status.get("conditions") or ()}
        return (
            pool["spec"]["replicas"] == replicas
            and live == sorted(f"{POOL}-{i}" for i in range(replicas))
            and ready == replicas
            and status.get("replicas") == replicas
            and status.get("readyReplicas") == replicas
            and status.get("observedGeneration") == pool["metadata"]["generation"]
            and conditions.get("Ready", {}).get("status") == "True"
        )

    async def converge(self, replicas: int, step: str, started: float) -> None:
        try:
            await until(
                lambda: self.converged(replicas),
                what=f"{step}: the pool converged at {replicas}",
                timeout_seconds=SECONDS,
                failure=self.failure,
            )
        except Exception:
            print(await self.seen())
            raise
        self.timings.append(
            f"{step}: converged in {time.monotonic() - started:.1f} s, max live pods "
            f"{self.watched.max_live} (bound {self.watched.bound})"
        )
        assert self.watched.violations == []
        self.watched.bound = replicas
        self.watched.max_live = len(self.watched.live())

    async def holder(self) -> str | None:
        with contextlib.suppress(ApiException):
            lease = await self.coordination.read_namespaced_lease(LEASE, NAMESPACE)
            return lease.spec.holder_identity or None
        return None

    async def ready_controllers(self) -> list[str]:
        return await ready_pod_names(self.core, NAMESPACE, APP)


async def _crd(api: Any) -> None:
    extensions: Any = client.ApiextensionsV1Api(api)
    await extensions.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))

    async def established() -> bool:
        crd = await extensions.read_custom_resource_definition("enginepools.miles.io")
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or ()
        )

    await until(established, what="the CRD established", timeout_seconds=30.0)


@contextlib.asynccontextmanager
async def deployed(node: RealNode) -> AsyncIterator[Cluster]:
    documents = read_manifest(MANIFEST)
    async with api_client(node.layout.kubeconfig("admin")) as api:
        await _crd(api)
        await create_documents(api, documents, namespace=NAMESPACE)
        cluster = Cluster(
            client.CoreV1Api(api),
            client.AppsV1Api(api),
            client.CustomObjectsApi(api),
            client.CoordinationV1Api(api),
            Watched(),
        )
        tasks = cluster.followers = [
            asyncio.create_task(
                _follow(
                    cluster.core.list_namespaced_pod,
                    NAMESPACE,
                    label_selector=POOL_LABEL,
                    on=cluster.watched.pod_event,
                )
            ),
            asyncio.create_task(
                _follow(
                    cluster.custom.list_namespaced_custom_object,
                    ENGINE_POOLS.group,
                    ENGINE_POOLS.version,
                    NAMESPACE,
                    ENGINE_POOLS.plural,
                    on=cluster.watched.pool_event,
                )
            ),
        ]
        try:
            yield cluster
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(ApiException):
                await cluster.core.delete_namespace(NAMESPACE)


def _pool(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": ENGINE_POOLS.api_version,
        "kind": ENGINE_POOLS.kind,
        "metadata": {"name": POOL},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": "engine"}},
                "spec": {
                    "containers": [engine_container(term_delay_seconds=0)],
                    "terminationGracePeriodSeconds": 2,
                },
            },
        },
    }


async def _draining_count(core: Any) -> int:
    events = (await core.list_namespaced_event(NAMESPACE)).items
    return sum(
        e.count or 1
        for e in events
        if e.reason == DRAINING_REASON and e.involved_object.name == POOL
    )


async def test_the_engine_pool_operator_on_the_real_node(controller_node: RealNode) -> None:
    started = time.monotonic()
    async with asyncio.timeout(10 * SECONDS), deployed(controller_node) as cluster:

        async def two_ready() -> list[str] | None:
            ready = await cluster.ready_controllers()
            return ready if len(ready) == 2 else None

        await until(two_ready, what="2 ready operator pods", timeout_seconds=SECONDS)
        leader = await until(cluster.holder, what="a Lease holder", timeout_seconds=SECONDS)
        cluster.timings.append(
            f"operator ready, {leader} leading: {time.monotonic() - started:.1f} s"
        )
        watched = cluster.watched

        at = time.monotonic()
        watched.bound = 3
        await cluster.custom.create_namespaced_custom_object(
            ENGINE_POOLS.group, ENGINE_POOLS.version, NAMESPACE, ENGINE_POOLS.plural, _pool(3)
        )
        await cluster.converge(3, "create 3", at)

        for replicas in (5, 1):
            at = time.monotonic()
            await cluster.scale(replicas)
            await cluster.converge(replicas, f"scale to {replicas}", at)

        # A pod deleted is created again under its name, once the first copy is gone.
        at = time.monotonic()
        first_uid = watched.pods[f"{POOL}-0"][0]
        await cluster.core.delete_namespaced_pod(f"{POOL}-0", NAMESPACE)
        await until(
            lambda: watched.pods.get(f"{POOL}-0", (first_uid,))[0] != first_uid,
            what="pod 0 recreated",
            timeout_seconds=SECONDS,
        )
        await cluster.converge(1, "delete pod 0", at)
        assert len(watched.uids[f"{POOL}-0"]) == 2

        # The leader deleted right after a scale: its successor finishes the change.
        at = time.monotonic()
        leader = await cluster.holder()
        await cluster.scale(4)
        await cluster.core.delete_namespaced_pod(leader, NAMESPACE)
        await cluster.converge(4, f"scale to 4, leader {leader} deleted", at)

        # The old leader may finish the scale before its SIGTERM lands; leadership moves anyway.
        async def successor() -> str | None:
            holder = await cluster.holder()
            return holder if holder not in (None, leader) else None

        await until(successor, what=f"a Lease holder other than {leader}", timeout_seconds=SECONDS)

        # kubectl rollout restart, with a scale under way.
        at = time.monotonic()
        before = set(await cluster.ready_controllers())
        restarted = {"kubectl.kubernetes.io/restartedAt": datetime.now(UTC).isoformat()}
        patch = {"spec": {"template": {"metadata": {"annotations": restarted}}}}
        await cluster.apps.patch_namespaced_deployment("engine-pool", NAMESPACE, patch)
        await cluster.scale(2)

        async def rolled_out() -> bool:
            ready = set(await cluster.ready_controllers())
            listed = (await cluster.core.list_namespaced_pod(NAMESPACE, label_selector=APP)).items
            return len(ready) == 2 and not ready & before and len(listed) == 2

        await until(rolled_out, what="the rollout restart done", timeout_seconds=2 * SECONDS)
        await cluster.converge(2, "rollout restart and scale to 2", at)

        # Deleting the pool drains once and leaves nothing behind.
        at = time.monotonic()
        members = set(watched.live())
        await cluster.custom.delete_namespaced_custom_object(
            ENGINE_POOLS.group, ENGINE_POOLS.version, NAMESPACE, ENGINE_POOLS.plural, POOL
        )
        await until(
            lambda: watched.pool is None and not watched.pods,
            what="the pool and its pods gone",
            timeout_seconds=SECONDS,
            seen=lambda: f"pods {watched.pods}\npool {watched.pool}",
        )
        gone = time.monotonic() - at
        await until(
            lambda: _draining_count(cluster.core),
            what="the Draining event",
            timeout_seconds=30.0,
        )
        await asyncio.sleep(2.0)
        drains = await _draining_count(cluster.core)
        cluster.timings.append(
            f"delete pool: gone with its pods in {gone:.1f} s, Draining events {drains}, "
            f"pods annotated {sorted(watched.drained)} of {sorted(members)}"
        )
        assert drains == 1
        assert watched.drained >= members
        assert watched.violations == []
        listed = await cluster.custom.list_namespaced_custom_object(
            ENGINE_POOLS.group, ENGINE_POOLS.version, NAMESPACE, ENGINE_POOLS.plural
        )
        assert listed["items"] == []
        pods = await cluster.core.list_namespaced_pod(NAMESPACE, label_selector=POOL_LABEL)
        assert pods.items == []
        created_twice = {n: u for n, u in watched.uids.items() if len(u) > 1}
        cluster.timings.append(
            f"watch events {watched.events}; names created again after deletion: "
            f"{sorted(created_twice)}; total {time.monotonic() - started:.1f} s"
        )
        print("\n".join(cluster.timings))
