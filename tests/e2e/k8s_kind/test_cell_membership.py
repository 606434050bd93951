"""k8s_kind layer: what only a kubelet produces, seen through `ReconcileLoop` and
`KubernetesReflector` (spec "Test layers": Running, restarts, graceful deletion, completion,
bookmarks).

The same tests run on KWOK, kind or `MILES_K8S_KUBECONFIG`; each prints which one it ran on.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from miles.utils.k8s_testenv.kubelet import KubeletLayer
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import PodWatchEvent
from tests.e2e.k8s_kind.cell_harness import CellHarness, is_running_and_ready

pytestmark = pytest.mark.k8s_kind

CONVERGE_SECONDS = 60.0
"""KWOK needs about a second; kind pulls the test image on first use."""
EVENT_SECONDS = 30.0


async def test_cell_converges_to_every_member_reported_running(kubelet_layer: KubeletLayer) -> None:
    async with asyncio.timeout(120), CellHarness.open(kubelet_layer) as cells:
        for name in ("a-0", "a-1", "a-2"):
            await cells.create_pod("a", name)
        converged = await cells.converge(
            "a", {"a-0", "a-1", "a-2"}, timeout_seconds=CONVERGE_SECONDS
        )
        assert all(pod.status.phase == "Running" for pod in converged.members)
        assert all(pod.spec.node_name for pod in converged.members)
        assert cells.parent_keys() == {"a"}


async def test_deleting_a_pod_shrinks_the_cell_by_exactly_that_member(
    kubelet_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(120), CellHarness.open(kubelet_layer) as cells:
        for name in ("a-0", "a-1", "a-2"):
            await cells.create_pod("a", name)
        await cells.converge("a", {"a-0", "a-1", "a-2"}, timeout_seconds=CONVERGE_SECONDS)
        seen_before = len(cells.reconciled)
        await cells.delete_pod("a-1", grace_period_seconds=0)
        await kubelet_layer.eventually(
            cells.reconciled_when("a", lambda r: r.names == {"a-0", "a-2"}),
            what="a reconcile of cell 'a' seeing it without a-1",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        assert cells.member_names("a") == {"a-0", "a-2"}
        after = [r for r in cells.reconciled[seen_before:] if r.parent == "a"]
        assert after, "cell 'a' was not reconciled after its member was deleted"
        assert after[-1].names == {"a-0", "a-2"}
        assert all(r.names >= {"a-0", "a-2"} for r in after)


async def test_restarts_arrive_over_the_watch_without_a_relist(
    kubelet_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(150), CellHarness.open(kubelet_layer) as cells:
        await cells.create_pod("a", "a-0")
        await cells.converge("a", {"a-0"}, timeout_seconds=CONVERGE_SECONDS)
        for expected in (1, 2):
            await kubelet_layer.restart_containers(
                cells.core_v1, namespace=cells.namespace, name="a-0"
            )
            await kubelet_layer.eventually(
                _restarted(cells, "a-0", expected),
                what=f"restartCount {expected} of a-0 in the store",
                timeout_seconds=EVENT_SECONDS + 30 * (not kubelet_layer.simulated),
                seen=lambda: cells.describe("a"),
            )
        pod = cells.member("a", "a-0")
        assert pod is not None
        status = pod.status.container_statuses[0]
        assert status.restart_count >= 2
        assert status.last_state.terminated is not None
        assert status.last_state.terminated.exit_code != 0
        await kubelet_layer.eventually(
            lambda: _running_again(cells, "a-0"),
            what="a-0 running again after its restarts",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        watched = [
            e.pod.status.container_statuses[0].restart_count
            for e in cells.api.pod_frames("a-0")
            if e.type == "MODIFIED" and e.pod is not None and e.pod.status.container_statuses
        ]
        assert watched == sorted(watched), watched
        assert watched[-1] >= 2, watched
        assert len(cells.api.lists) == 1, "restarts must come over the watch, not from a relist"


async def test_gracefully_terminating_pod_stays_a_member_until_deleted(
    kubelet_layer: KubeletLayer,
) -> None:
    grace = 6
    async with asyncio.timeout(120), CellHarness.open(kubelet_layer) as cells:
        for name in ("a-0", "a-1"):
            await cells.create_pod("a", name)
        await cells.converge("a", {"a-0", "a-1"}, timeout_seconds=CONVERGE_SECONDS)
        loop = asyncio.get_running_loop()
        deleted_at = loop.time()
        await cells.delete_pod("a-0", grace_period_seconds=grace)
        await kubelet_layer.eventually(
            cells.reconciled_when("a", lambda r: _deleting(r.members, "a-0")),
            what="a reconcile of cell 'a' seeing a-0 with a deletionTimestamp",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        await kubelet_layer.eventually(
            lambda: "a-0" not in cells.member_names("a"),
            what=f"a-0 to leave cell 'a' once its {grace} s grace period ends",
            timeout_seconds=grace + EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        left_after = loop.time() - deleted_at
        # deletionTimestamp is serialized in whole seconds: the deadline can fall up to 1 s early.
        assert left_after >= grace - 1.5, (
            f"a-0 left {left_after:.1f} s into a {grace} s grace period"
        )
        terminating = [
            r for r in cells.reconciled if r.parent == "a" and _deleting(r.members, "a-0")
        ]
        assert terminating, "no reconcile saw a-0 terminating"
        assert cells.member_names("a") == {"a-1"}
        types = [e.type for e in cells.api.pod_frames("a-0")]
        assert types[-1] == "DELETED", types
        assert len(cells.api.lists) == 1, "a-0 must leave on DELETED, not through a relist"


async def test_pod_that_reaches_succeeded_stays_a_member(kubelet_layer: KubeletLayer) -> None:
    async with asyncio.timeout(120), CellHarness.open(kubelet_layer) as cells:
        await cells.create_pod("a", "a-0", restart_policy="Never")
        await cells.converge("a", {"a-0"}, timeout_seconds=CONVERGE_SECONDS)
        await kubelet_layer.complete(cells.core_v1, namespace=cells.namespace, name="a-0")
        reconciled = await kubelet_layer.eventually(
            cells.reconciled_when("a", lambda r: all(_succeeded(p) for p in r.members)),
            what="a reconcile of cell 'a' seeing a-0 Succeeded",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        assert reconciled.names == {"a-0"}
        await asyncio.sleep(2.0)
        pod = cells.member("a", "a-0")
        assert pod is not None
        assert pod.status.phase == "Succeeded"
        terminated = pod.status.container_statuses[0].state.terminated
        assert terminated is not None
        assert terminated.exit_code == 0


async def test_deleting_every_pod_empties_the_cell_and_reconciles_its_parent(
    kubelet_layer: KubeletLayer,
) -> None:
    async with asyncio.timeout(120), CellHarness.open(kubelet_layer) as cells:
        for name in ("a-0", "a-1"):
            await cells.create_pod("a", name)
        await cells.create_pod("b", "b-0")
        await cells.converge("a", {"a-0", "a-1"}, timeout_seconds=CONVERGE_SECONDS)
        for name in ("a-0", "a-1"):
            await cells.delete_pod(name, grace_period_seconds=0)
        emptied = await kubelet_layer.eventually(
            cells.reconciled_when("a", lambda r: not r.members),
            what="a reconcile of cell 'a' seeing no members",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: cells.describe("a"),
        )
        assert emptied.members == ()
        assert cells.members("a") == []
        assert "a" not in cells.parent_keys()
        assert cells.member_names("b") == {"b-0"}


async def test_bookmark_advances_the_cursor_and_the_next_watch_opens_from_it(
    kubelet_layer: KubeletLayer,
) -> None:
    """With `timeoutSeconds=3` the watch cache sends a BOOKMARK about 2 s before the deadline."""
    async with (
        asyncio.timeout(120),
        CellHarness.open(kubelet_layer, watch_timeout_seconds=3) as cells,
    ):
        await cells.create_pod("a", "a-0")
        await cells.converge("a", {"a-0"}, timeout_seconds=CONVERGE_SECONDS)
        listed = cells.api.lists[0].resource_version
        unselected = await cells.create_pod("x", "x-0", selected=False)
        written = int(unselected.metadata.resource_version)

        def bookmark_followed_by_a_watch() -> tuple[str, str] | None:
            calls = cells.api.watches
            for call, following in itertools.pairwise(calls):
                last = call.frames[-1] if call.frames else None
                if _bookmark_at_or_past(last, written):
                    assert last is not None
                    assert last.resource_version is not None
                    return last.resource_version, following.resource_version
            return None

        bookmark, next_cursor = await kubelet_layer.eventually(
            bookmark_followed_by_a_watch,
            what=f"a BOOKMARK at or past resourceVersion {written}, then a new watch",
            timeout_seconds=EVENT_SECONDS,
            seen=lambda: [
                (c.resource_version, [(e.type, e.resource_version) for e in c.frames])
                for c in cells.api.watches
            ],
        )
        assert next_cursor == bookmark
        assert int(bookmark) > int(listed)
        assert all(e.pod is None or e.pod.metadata.name != "x-0" for e in _all_events(cells))
        assert len(cells.api.lists) == 1


def _restarted(cells: CellHarness, name: str, times: int) -> Callable[[], bool]:
    def probe() -> bool:
        pod = cells.member("a", name)
        statuses = pod.status.container_statuses if pod is not None else []
        return bool(statuses) and min(s.restart_count for s in statuses) >= times

    return probe


def _bookmark_at_or_past(event: PodWatchEvent | None, resource_version: int) -> bool:
    return (
        event is not None
        and event.type == "BOOKMARK"
        and event.resource_version is not None
        and int(event.resource_version) >= resource_version
    )


def _succeeded(pod: Pod) -> bool:
    return pod.status.phase == "Succeeded"


def _running_again(cells: CellHarness, name: str) -> bool:
    pod = cells.member("a", name)
    return (
        pod is not None
        and is_running_and_ready(pod)
        and all(s.state.running is not None for s in pod.status.container_statuses)
    )


def _deleting(members: tuple[Pod, ...], name: str) -> bool:
    return any(p.metadata.name == name and p.metadata.deletion_timestamp for p in members)


def _all_events(cells: CellHarness) -> list[PodWatchEvent]:
    return [event for call in cells.api.watches for event in call.frames]
