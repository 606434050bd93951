"""k8s_kind layer, real node only: what only a real kubelet and controller manager produce, each
seen through `ReconcileLoop` over `KubernetesReflector` and checked against a fresh LIST.

Readiness through a probe and its flip, a crash (exit code, restart count) into CrashLoopBackOff,
a graceful delete whose SIGTERM handler ends the pod inside its grace period, a StatefulSet scaled
and one of its pods recreated under the same name with a new uid, a Deployment rollout replacing
every pod of a cell. KWOK runs none of these (no probes, no processes, no workload controllers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv.kubelet import (
    KubeletLayer,
    LayerName,
    crash_engine,
    engine_container,
    set_engine_health,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from tests.e2e.k8s_kind.cell_harness import (
    CELL_LABEL,
    SELECTED,
    SELECTED_LABEL,
    CellHarness,
    Reconciled,
    is_running_and_ready,
)

pytestmark = pytest.mark.k8s_kind

Identity = tuple[str | None, str | None]
"""A pod's uid and resourceVersion."""
CONVERGE_SECONDS = 60.0
EVENT_SECONDS = 30.0


@pytest.fixture
def real_layer(kubelet_layer: KubeletLayer) -> KubeletLayer:
    if kubelet_layer.name is not LayerName.REAL:
        pytest.skip(
            f"needs the real node's kubelet and controllers; this run is on {kubelet_layer.name}"
        )
    return kubelet_layer


def _labels(cell: str) -> dict[str, str]:
    return {CELL_LABEL: cell, SELECTED_LABEL: SELECTED}


def _engine_pod(name: str, cell: str, *, grace: int = 30, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": _labels(cell)},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [engine_container(**container)],
        },
    }


def _template(cell: str, *, version: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": _labels(cell)},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                engine_container(
                    term_delay_seconds=0.2, readiness_probe=True, env={"VERSION": version}
                )
            ],
        },
    }


def _workload(kind: str, name: str, cell: str, **spec: Any) -> dict[str, Any]:
    """An apps/v1 workload of two engine pods of `cell` (template version 1), plus `spec`."""
    selector = {"matchLabels": _labels(cell)}
    template = _template(cell, version="1")
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"replicas": 2, "selector": selector, "template": template, **spec},
    }


async def _listed(cells: CellHarness, cell: str) -> dict[str, Identity]:
    pods = await cells.core_v1.list_namespaced_pod(
        cells.namespace, label_selector=f"{CELL_LABEL}={cell}"
    )
    return {p.metadata.name: (p.metadata.uid, p.metadata.resource_version) for p in pods.items}


def _viewed(cells: CellHarness, cell: str) -> dict[str, Identity]:
    return {
        p.metadata.name: (p.metadata.uid, p.metadata.resource_version) for p in cells.members(cell)
    }


async def _agrees_with_a_fresh_list(cells: CellHarness, cell: str) -> dict[str, Identity]:
    """The loop's view of `cell` equals a fresh LIST (names, uids, resourceVersions)."""
    last: list[object] = [None]

    async def probe() -> dict[str, Identity] | None:
        listed = await _listed(cells, cell)
        last[0] = (listed, _viewed(cells, cell))
        return listed if listed == _viewed(cells, cell) else None

    return await cells.layer.eventually(
        probe,
        what=f"the loop's view of cell {cell!r} to equal a fresh LIST",
        timeout_seconds=EVENT_SECONDS,
        seen=lambda: last[0],
    )


def _restarted_at_least(times: int) -> Callable[[Reconciled], bool]:
    def holds(reconciled: Reconciled) -> bool:
        return any(
            bool(p.status.container_statuses)
            and p.status.container_statuses[0].restart_count >= times
            for p in reconciled.members
        )

    return holds


def _ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)


def _waiting_reason(pod: Pod) -> str | None:
    statuses = pod.status.container_statuses
    waiting = statuses[0].state.waiting if statuses else None
    return waiting.reason if waiting is not None else None


async def test_readiness_probe_makes_the_pod_ready_and_its_failure_flips_ready(
    real_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(150), CellHarness.open(real_layer) as cells:
        await cells.core_v1.create_namespaced_pod(
            cells.namespace, _engine_pod("a-0", "a", readiness_probe=True)
        )
        await cells.converge("a", {"a-0"}, timeout_seconds=CONVERGE_SECONDS)
        await set_engine_health(cells.core_v1, namespace=cells.namespace, name="a-0", healthy=False)
        unready = await real_layer.eventually(
            cells.reconciled_when(
                "a",
                lambda r: any(not _ready(p) for p in r.members if p.status.phase == "Running"),
            ),
            what="a reconcile of cell 'a' seeing a-0 Running but not Ready",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        (pod,) = unready.members
        assert pod.status.container_statuses[0].ready is False
        assert pod.status.container_statuses[0].restart_count == 0
        await _agrees_with_a_fresh_list(cells, "a")
        await set_engine_health(cells.core_v1, namespace=cells.namespace, name="a-0", healthy=True)
        await cells.converge("a", {"a-0"}, timeout_seconds=EVENT_SECONDS)
        await _agrees_with_a_fresh_list(cells, "a")
        assert len(cells.api.lists) == 1


async def test_a_crash_raises_restart_count_with_its_exit_code_then_crash_loop_back_off(
    real_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(150), CellHarness.open(real_layer) as cells:
        await cells.core_v1.create_namespaced_pod(cells.namespace, _engine_pod("a-0", "a"))
        await cells.converge("a", {"a-0"}, timeout_seconds=CONVERGE_SECONDS)
        for restarts in (1, 2):
            await crash_engine(cells.core_v1, namespace=cells.namespace, name="a-0", exit_code=7)
            await real_layer.eventually(
                cells.reconciled_when("a", _restarted_at_least(restarts)),
                what=f"a reconcile of cell 'a' seeing a-0 restarted {restarts} times",
                timeout_seconds=EVENT_SECONDS,
                seen=lambda: cells.describe("a"),
            )
            if restarts == 1:
                await cells.converge("a", {"a-0"}, timeout_seconds=EVENT_SECONDS)
        crash_looping = [
            p
            for r in cells.reconciled
            for p in r.members
            if _waiting_reason(p) == "CrashLoopBackOff"
        ]
        assert crash_looping, f"no reconcile saw CrashLoopBackOff: {cells.describe('a')}"
        pod = cells.member("a", "a-0")
        assert pod is not None
        status = pod.status.container_statuses[0]
        assert status.restart_count >= 2
        assert status.last_state.terminated is not None
        assert status.last_state.terminated.exit_code == 7
        assert status.last_state.terminated.reason == "Error"
        await _agrees_with_a_fresh_list(cells, "a")
        assert len(cells.api.lists) == 1, "restarts must come over the watch"


async def test_graceful_delete_runs_the_sigterm_handler_inside_the_grace_period(
    real_layer: KubeletLayer,
) -> None:
    grace, term_delay = 20, 2.0
    async with asyncio.timeout(150), CellHarness.open(real_layer) as cells:
        for name in ("a-0", "a-1"):
            await cells.core_v1.create_namespaced_pod(
                cells.namespace, _engine_pod(name, "a", grace=grace, term_delay_seconds=term_delay)
            )
        await cells.converge("a", {"a-0", "a-1"}, timeout_seconds=CONVERGE_SECONDS)
        loop = asyncio.get_running_loop()
        deleted_at = loop.time()
        await cells.delete_pod("a-0", grace_period_seconds=grace)
        terminating = await real_layer.eventually(
            cells.reconciled_when(
                "a",
                lambda r: any(
                    p.metadata.name == "a-0" and p.metadata.deletion_timestamp for p in r.members
                ),
            ),
            what="a reconcile of cell 'a' seeing a-0 terminating",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        assert terminating.names == {"a-0", "a-1"}
        await real_layer.eventually(
            lambda: "a-0" not in cells.member_names("a"),
            what="a-0 to leave cell 'a'",
            timeout_seconds=grace + EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        left_after = loop.time() - deleted_at
        assert term_delay - 0.5 <= left_after < grace - 5, (
            f"a-0 left {left_after:.1f} s after a delete with {grace} s of grace and a "
            f"{term_delay} s SIGTERM handler"
        )
        frames = [e for e in cells.api.pod_frames("a-0") if e.pod is not None]
        assert frames[-1].type == "DELETED"
        before_deletion = frames[-2].pod
        assert before_deletion is not None
        terminated = before_deletion.status.container_statuses[0].state.terminated
        assert terminated is not None
        assert terminated.exit_code == 0, "the SIGTERM handler exits 0"
        assert (await _agrees_with_a_fresh_list(cells, "a")).keys() == {"a-1"}
        assert len(cells.api.lists) == 1


async def _wait_for_cell(cells: CellHarness, cell: str, count: int) -> Reconciled:
    return await cells.layer.eventually(
        cells.reconciled_when(
            cell,
            lambda r: (
                len(r.members) == count
                and all(
                    is_running_and_ready(p) and not p.metadata.deletion_timestamp for p in r.members
                )
            ),
        ),
        what=f"a reconcile of cell {cell!r} seeing {count} pods Running and Ready",
        timeout_seconds=CONVERGE_SECONDS,
        seen=lambda: cells.describe(cell),
    )


async def test_statefulset_scales_and_a_deleted_pod_returns_under_its_name_with_a_new_uid(
    real_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(240), CellHarness.open(real_layer) as cells:
        apps: Any = client.AppsV1Api(cells.core_v1.api_client)
        body = _workload(
            "StatefulSet", "eng", "s", serviceName="eng", podManagementPolicy="Parallel"
        )
        await apps.create_namespaced_stateful_set(cells.namespace, body)
        assert (await _wait_for_cell(cells, "s", 2)).names == {"eng-0", "eng-1"}
        for replicas, names in ((3, {"eng-0", "eng-1", "eng-2"}), (1, {"eng-0"})):
            await apps.patch_namespaced_stateful_set_scale(
                "eng", cells.namespace, {"spec": {"replicas": replicas}}
            )
            assert (await _wait_for_cell(cells, "s", replicas)).names == names
            assert (await _agrees_with_a_fresh_list(cells, "s")).keys() == names
        old = cells.member("s", "eng-0")
        assert old is not None
        await cells.delete_pod("eng-0", grace_period_seconds=1)
        recreated = await real_layer.eventually(
            cells.reconciled_when(
                "s",
                lambda r: any(
                    p.metadata.name == "eng-0"
                    and p.metadata.uid != old.metadata.uid
                    and is_running_and_ready(p)
                    for p in r.members
                ),
            ),
            what="a reconcile of cell 's' seeing eng-0 recreated with a new uid",
            timeout_seconds=CONVERGE_SECONDS,
            seen=lambda: cells.describe("s"),
        )
        assert recreated.names == {"eng-0"}
        listed = await _agrees_with_a_fresh_list(cells, "s")
        assert listed["eng-0"][0] != old.metadata.uid
        assert len(cells.api.lists) == 1


async def test_deployment_rollout_replaces_every_pod_of_the_cell(real_layer: KubeletLayer) -> None:
    async with asyncio.timeout(240), CellHarness.open(real_layer) as cells:
        apps: Any = client.AppsV1Api(cells.core_v1.api_client)
        surge = {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        body = _workload("Deployment", "web", "d", strategy=surge)
        await apps.create_namespaced_deployment(cells.namespace, body)
        before = await _wait_for_cell(cells, "d", 2)
        old_uids = {p.metadata.uid for p in before.members}
        await apps.patch_namespaced_deployment(
            "web", cells.namespace, {"spec": {"template": _template("d", version="2")}}
        )
        after = await real_layer.eventually(
            cells.reconciled_when(
                "d",
                lambda r: (
                    len(r.members) == 2
                    and all(
                        p.metadata.uid not in old_uids
                        and is_running_and_ready(p)
                        and not p.metadata.deletion_timestamp
                        for p in r.members
                    )
                ),
            ),
            what="a reconcile of cell 'd' seeing two new pods Running and Ready, no old one",
            timeout_seconds=CONVERGE_SECONDS * 2,
            seen=lambda: cells.describe("d"),
        )
        hashes = {p.metadata.labels.get("pod-template-hash") for p in after.members}
        old_hashes = {p.metadata.labels.get("pod-template-hash") for p in before.members}
        assert len(hashes) == 1
        assert hashes.isdisjoint(old_hashes)
        listed = await _agrees_with_a_fresh_list(cells, "d")
        assert {uid for uid, _ in listed.values()}.isdisjoint(old_uids)
        peak = max(
            sum(not p.metadata.deletion_timestamp for p in r.members)
            for r in cells.reconciled
            if r.parent == "d"
        )
        assert peak <= 3, "maxSurge 1: never more than three pods not terminating in the cell"
        assert len(cells.api.lists) == 1
