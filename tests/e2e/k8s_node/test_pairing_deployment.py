"""The pairing controller as a Deployment on the real node: layer k8s_node (containerd, runc, a
kubelet, kube-scheduler and kube-controller-manager on this host) on a local control plane's cached
apiserver (etcd + kube-apiserver, watch cache on). Needs root and the node's packages; skips
(fails under MILES_K8S_REQUIRE) without them.

The image (`python_image`, the host's interpreter and a pip-installed site-packages) is built once
per source and imported into the node's containerd by the conftest's `controller_node`;
`deploy/colocate-pairing.yaml` is applied as it is in the repository. Every assertion reads the
apiserver (pods, the Lease) or the controller pods' logs, streamed from their start: gated pods are
released once each, by the Lease's holder; deleting the leader hands over within LeaseDuration + 2 x
RetryPeriod x 2.2 (to the standby, or to the Deployment's replacement when it starts and polls
first); a rollout restart never shows two holders and releases each pod once; a Role without `patch`
gives one line per attempt (the loop's, no stack) on the backoff, and the leader turns unready.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import (
    RealNode,
    api_client,
)
from miles.utils.k8s_testenv.kubelet import engine_container
from tests.e2e.k8s_node.deployment import (
    REPO_ROOT,
    create_documents,
    read_manifest,
    ready_pod_names,
    until,
)

pytestmark = pytest.mark.k8s_kind

MANIFEST = REPO_ROOT / "deploy" / "colocate-pairing.yaml"
NAMESPACE = "colocate-pairing"
LEASE = "colocate-pairing"
APP = {"app.kubernetes.io/name": "colocate-pairing"}
GATE = "miles.io/paired-with-trainer"
HANDOVER_BOUND = 15.0 + 2 * 2.0 * 2.2
"""LeaseDuration + 2 x RetryPeriod x (1 + JitterFactor) at client-go's defaults."""
SECONDS = 180.0
FORBIDDEN_WINDOW = 20.0
RELEASED = re.compile(r"released pod colocate-pairing/(\S+) onto node")
TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Logs:
    """Each controller pod's log, streamed from its container's start to its end."""

    core_v1: Any
    lines: dict[str, list[str]] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def follow_new_pods(self) -> None:
        while True:
            for pod in (
                await self.core_v1.list_namespaced_pod(NAMESPACE, label_selector=_app())
            ).items:
                name = pod.metadata.name
                if name not in self.tasks and _started(pod):
                    self.lines[name] = []
                    self.tasks[name] = asyncio.create_task(self._follow(name))
            await asyncio.sleep(0.2)

    async def _follow(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            stream = await self.core_v1.read_namespaced_pod_log(
                name, NAMESPACE, follow=True, _preload_content=False
            )
            async for raw in stream.content:
                self.lines[name].append(raw.decode().rstrip())

    def matching(self, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
        return [
            (pod, m.group(1))
            for pod, lines in self.lines.items()
            for line in lines
            if (m := pattern.search(line))
        ]

    def dump(self) -> str:
        return "\n".join(
            f"--- {pod}\n" + "\n".join(lines[-30:]) for pod, lines in self.lines.items()
        )


def _app() -> str:
    return ",".join(f"{k}={v}" for k, v in APP.items())


def _started(pod: Any) -> bool:
    return any(
        s.state and (s.state.running or s.state.terminated)
        for s in pod.status.container_statuses or ()
    )


@dataclass
class Deployed:
    core_v1: Any
    coordination: Any
    apps: Any
    rbac: Any
    node: RealNode
    logs: Logs
    holders: list[tuple[float, str | None, int]] = field(default_factory=list)

    async def lease(self) -> Any:
        return await self.coordination.read_namespaced_lease(LEASE, NAMESPACE)

    async def holder(self) -> str | None:
        with contextlib.suppress(ApiException):
            return (await self.lease()).spec.holder_identity or None
        return None

    async def sample_lease(self) -> None:
        while True:
            with contextlib.suppress(ApiException):
                spec = (await self.lease()).spec
                self.holders.append(
                    (time.time(), spec.holder_identity or None, spec.lease_transitions or 0)
                )
            await asyncio.sleep(0.2)

    async def ready_pods(self) -> list[str]:
        return await ready_pod_names(self.core_v1, NAMESPACE, _app())

    async def create_pair(self, trainer: str, inference: tuple[str, ...]) -> None:
        for name, role in ((trainer, "trainer"), *((n, "inference") for n in inference)):
            spec: dict[str, Any] = {
                "containers": [engine_container()],
                "terminationGracePeriodSeconds": 1,
            }
            if role == "inference":
                spec["schedulingGates"] = [{"name": GATE}]
            manifest = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {"miles.io/role": role, "miles.io/trainer": trainer},
                },
                "spec": spec,
            }
            await self.core_v1.create_namespaced_pod(NAMESPACE, manifest)

    async def released(self, names: tuple[str, ...]) -> bool:
        for name in names:
            pod = await self.core_v1.read_namespaced_pod(name, NAMESPACE)
            if pod.spec.scheduling_gates or not pod.spec.node_name:
                return False
            assert pod.spec.node_selector == {"kubernetes.io/hostname": self.node.node_name}
        return True

    async def until_released(self, names: tuple[str, ...], what: str) -> None:
        """Until every pod of ``names`` is released onto the node (the logs shown on a timeout)."""
        await until(
            lambda: self.released(names), what=what, timeout_seconds=SECONDS, seen=self.logs.dump
        )


@contextlib.asynccontextmanager
async def deployed(node: RealNode, documents: list[dict[str, Any]]) -> AsyncIterator[Deployed]:
    async with api_client(node.layout.kubeconfig("admin")) as api:
        core_v1 = client.CoreV1Api(api)
        await create_documents(api, documents, namespace=NAMESPACE)
        logs = Logs(core_v1)
        deployment = Deployed(
            core_v1,
            client.CoordinationV1Api(api),
            client.AppsV1Api(api),
            client.RbacAuthorizationV1Api(api),
            node,
            logs,
        )
        tasks = [
            asyncio.create_task(logs.follow_new_pods()),
            asyncio.create_task(deployment.sample_lease()),
        ]
        try:
            yield deployment
        finally:
            for task in [*tasks, *logs.tasks.values()]:
                task.cancel()
            await asyncio.gather(*tasks, *logs.tasks.values(), return_exceptions=True)
            await core_v1.delete_namespace(NAMESPACE)


async def _released_once_each(logs: Logs, names: tuple[str, ...]) -> None:
    """Once each release line is in (the log stream trails the apiserver), each is there once."""
    await until(
        lambda: {pod for _, pod in logs.matching(RELEASED)} >= set(names),
        what=f"the release lines of {names}",
        timeout_seconds=30.0,
        seen=logs.dump,
    )
    released = [pod for _, pod in logs.matching(RELEASED)]
    for name in names:
        assert released.count(name) == 1, (
            f"{name} released {released.count(name)} times\n{logs.dump()}"
        )


def _leading_intervals(logs: Logs) -> list[tuple[datetime, datetime, str]]:
    """Per pod, from its "acquired lease" line to its "released lease" line (or its last line)."""
    intervals = []
    for pod, lines in logs.lines.items():
        stamped = [(_stamp(line), line) for line in lines if _stamp(line) is not None]
        start = None
        for at, line in stamped:
            if "acquired lease" in line:
                start = at
            elif start is not None and ("released lease" in line or "leader election lost" in line):
                intervals.append((start, at, pod))
                start = None
        if start is not None and stamped:
            intervals.append((start, stamped[-1][0], pod))
    return sorted(intervals)


def _stamp(line: str) -> Any:
    found = TIMESTAMP.match(line)
    return None if found is None else datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")


def _one_holder_at_a_time(holders: list[tuple[float, str | None, int]]) -> None:
    """Every change of holder counts one transition, and a holder never comes back from an
    earlier term while another holds: the sampled history is a sequence of terms."""
    terms: list[str] = []
    for _, holder, _ in holders:
        if holder is not None and (not terms or terms[-1] != holder):
            assert holder not in terms, f"{holder} held the Lease again after another: {terms}"
            terms.append(holder)
    transitions = [t for _, h, t in holders if h is not None]
    assert transitions == sorted(transitions)


async def test_the_pairing_deployment_on_the_real_node(controller_node: RealNode) -> None:
    documents = read_manifest(MANIFEST)
    async with asyncio.timeout(8 * SECONDS), deployed(controller_node, documents) as cluster:

        async def two_ready() -> list[str] | None:
            ready = await cluster.ready_pods()
            return ready if len(ready) == 2 else None

        ready = await until(
            two_ready,
            what="2 ready controller pods",
            timeout_seconds=SECONDS,
            seen=cluster.logs.dump,
            failure=controller_node.failure,
        )
        leader = await until(cluster.holder, what="a Lease holder", timeout_seconds=SECONDS)
        assert leader in ready

        # Gated pods are released once each, by the holder.
        first = ("infer-a0", "infer-a1")
        await cluster.create_pair("trainer-a", first)
        await cluster.until_released(first, "the first pair released")
        await _released_once_each(cluster.logs, first)
        assert {pod for pod, _ in cluster.logs.matching(RELEASED)} == {leader}

        # Deleting the leader hands over within the bound.
        deleted_at = time.monotonic()
        await cluster.core_v1.delete_namespaced_pod(leader, NAMESPACE)

        # The standby usually takes it; the Deployment's replacement pod may start and poll
        # first once the old leader released the Lease on SIGTERM, which is as good a handover.
        async def another_holds() -> str | None:
            holder: str | None = await cluster.holder()
            return holder if holder not in (None, leader) else None

        successor = await until(
            another_holds,
            what=f"a pod other than {leader} holding the Lease",
            timeout_seconds=SECONDS,
            seen=lambda: f"holders {cluster.holders[-3:]}\n{cluster.logs.dump()}",
        )
        handover = time.monotonic() - deleted_at
        print(
            f"handover after deleting the leader: {handover:.1f} s to {successor}"
            f" (bound {HANDOVER_BOUND:.1f} s)"
        )
        assert handover <= HANDOVER_BOUND

        # A rollout restart: one holder at a time, each pod released once.
        await until(two_ready, what="2 ready pods again", timeout_seconds=SECONDS)
        restarted_at = datetime.now(UTC).isoformat()
        annotation = {"kubectl.kubernetes.io/restartedAt": restarted_at}
        patch = {"spec": {"template": {"metadata": {"annotations": annotation}}}}
        before = set(await cluster.ready_pods())
        await cluster.apps.patch_namespaced_deployment("colocate-pairing", NAMESPACE, patch)
        second = ("infer-b0", "infer-b1")
        await cluster.create_pair("trainer-b", second)

        async def rolled_out() -> bool:
            ready_now = set(await cluster.ready_pods())
            listed = (
                await cluster.core_v1.list_namespaced_pod(NAMESPACE, label_selector=_app())
            ).items
            return len(ready_now) == 2 and not ready_now & before and len(listed) == 2

        await until(
            rolled_out,
            what="the rollout restart done",
            timeout_seconds=2 * SECONDS,
            seen=cluster.logs.dump,
        )
        await cluster.until_released(second, "the second pair released")
        third = ("infer-c0",)
        await cluster.create_pair("trainer-c", third)
        await cluster.until_released(third, "the third pair released")
        for names in (first, second, third):
            await _released_once_each(cluster.logs, names)
        _one_holder_at_a_time(cluster.holders)
        intervals = _leading_intervals(cluster.logs)
        for (_, end, pod), (start, _, other) in itertools.pairwise(intervals):
            assert end <= start, f"{pod} led until {end}, {other} from {start}"

        # A Role without `patch`: one line per attempt, on the backoff; the leader unready.
        role = next(d for d in documents if d["kind"] == "Role")
        without_patch = {
            **role,
            "rules": [
                {**r, "verbs": [v for v in r["verbs"] if v != "patch"]} for r in role["rules"]
            ],
        }
        await cluster.rbac.replace_namespaced_role("colocate-pairing", NAMESPACE, without_patch)
        holder = await cluster.holder()
        await cluster.create_pair("trainer-d", ("infer-d0",))
        forbidden = re.compile(
            r"ERROR miles.utils.workers.reconcile.loop: \[colocate-pairing\] reconcile of parent "
            r"'trainer-d' failed, retrying in (\S+): PairingForbiddenError\('patch of pod "
            r"colocate-pairing/infer-d0 forbidden: .*the Role needs pods: patch"
        )
        await until(
            lambda: cluster.logs.matching(forbidden) or None,
            what="a forbidden line",
            timeout_seconds=SECONDS,
            seen=cluster.logs.dump,
        )
        await asyncio.sleep(FORBIDDEN_WINDOW)
        attempts = cluster.logs.matching(forbidden)
        delays = [delay for _, delay in attempts]
        print(f"forbidden attempts in {FORBIDDEN_WINDOW:.0f} s: {len(attempts)}, delays {delays}")
        assert {pod for pod, _ in attempts} == {holder}
        assert holder is not None
        assert not any("Traceback" in line for line in cluster.logs.lines[holder])
        assert 2 <= len(attempts) <= 6, cluster.logs.dump()
        assert holder not in await cluster.ready_pods()
        await cluster.rbac.replace_namespaced_role("colocate-pairing", NAMESPACE, role)
        await until(
            lambda: cluster.released(("infer-d0",)),
            what="infer-d0 released once the Role allows it",
            timeout_seconds=2 * SECONDS,
            seen=cluster.logs.dump,
        )
        await _released_once_each(cluster.logs, ("infer-d0",))
