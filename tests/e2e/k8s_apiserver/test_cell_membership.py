"""Layer: real apiserver, no kubelet. `ReconcileLoop` + `KubernetesReflector` keep cells in step.

Every test runs the real loop over pods of its own namespace, grouped into cells by the
`miles.test/cell` label, and checks two invariants on top of its own assertions: every reconcile
read exactly the members that the LIST/WATCH frames received before it imply (the store is written
before the parent is woken), and every membership change was followed by a reconcile of its parent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory
from tests.e2e.k8s_apiserver.harness import (
    CELL_LABEL,
    SELECTED,
    SELECTED_LABEL,
    Cells,
    create_pod,
    eventually,
)

pytestmark = pytest.mark.k8s_apiserver


@asynccontextmanager
async def _cells(k8s_api_client: ApiClientFactory, namespace: str) -> AsyncIterator[Cells]:
    async with Cells.on(k8s_api_client, "cached", namespace=namespace) as cells:
        yield cells
        await cells.assert_consistent()


async def test_membership_converges_on_creation_and_on_deletion(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with _cells(k8s_api_client, k8s_namespace) as cells:
        await cells.seed("a", "a-0")
        for name, cell in (("a-1", "a"), ("a-2", "a"), ("b-0", "b")):
            await cells.create(name, cell=cell)
        await cells.converge("a", {"a-0", "a-1", "a-2"})
        await cells.converge("b", {"b-0"})

        await cells.delete("a-1")
        await cells.converge("a", {"a-0", "a-2"})
        await cells.delete("b-0")
        await cells.converge("b", set())
        assert cells.loop.parent_keys() == {"a"}


async def test_initial_list_fills_every_cell_before_start_returns(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core = client.CoreV1Api(api)
        for name, cell in (("a-0", "a"), ("a-1", "a"), ("b-0", "b")):
            await create_pod(core, k8s_namespace, name, cell=cell)
        await create_pod(core, k8s_namespace, "x-0", cell="a", selected=False)
        async with Cells.running(core_v1=core, namespace=k8s_namespace) as cells:
            assert cells.member_names("a") == {"a-0", "a-1"}
            assert cells.member_names("b") == {"b-0"}
            await cells.converge("a", {"a-0", "a-1"})
            await cells.converge("b", {"b-0"})
            await cells.assert_consistent()


async def test_every_membership_change_wakes_its_parent(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Creation, a move between cells (both wake), deletion, and losing the parent label each wake
    exactly the parents they touched, and an untouched cell is never reconciled again."""
    async with _cells(k8s_api_client, k8s_namespace) as cells:
        for name, cell in (("a-0", "a"), ("b-0", "b"), ("c-0", "c"), ("quiet-0", "quiet")):
            await cells.create(name, cell=cell)
        await cells.converge("quiet", {"quiet-0"})
        quiet_reconciles = [r for r in cells.reconciled if r.parent == "quiet"]

        await cells.patch_labels("a-0", {CELL_LABEL: "b"})
        await cells.converge("a", set())
        await cells.converge("b", {"a-0", "b-0"})
        await cells.delete("b-0")
        await cells.converge("b", {"a-0"})
        await cells.patch_labels("c-0", {CELL_LABEL: None})
        await cells.converge("c", set())

        assert [r for r in cells.reconciled if r.parent == "quiet"] == quiet_reconciles
        assert cells.loop.parent_keys() == {"b", "quiet"}


async def test_reconcile_reads_a_store_that_already_holds_the_event(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Each of a burst of label updates is in the store before the reconcile it wakes: every
    reconcile read exactly the resourceVersions its preceding frames carried."""
    async with _cells(k8s_api_client, k8s_namespace) as cells:
        await cells.seed("a", "a-0")
        for revision in range(8):
            await cells.patch_labels("a-0", {"miles.test/revision": str(revision)})
        latest = await cells.core_v1.read_namespaced_pod("a-0", k8s_namespace)

        await eventually(
            lambda: (
                (last := cells.last_reconciled("a")) is not None
                and last.members == {"a-0": latest.metadata.resource_version}
            ),
            what=f"a reconcile of cell 'a' reading a-0 at {latest.metadata.resource_version}",
            context=cells.describe,
        )
        assert cells.stale_reconciles() == []
        assert all(r.names == {"a-0"} for r in cells.reconciled if r.parent == "a")


async def test_patched_parent_label_moves_the_pod(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with _cells(k8s_api_client, k8s_namespace) as cells:
        await cells.seed("a", "p-0", "p-1")

        await cells.patch_labels("p-0", {CELL_LABEL: "b"})
        await cells.converge("a", {"p-1"})
        moved = await cells.converge("b", {"p-0"})

    assert [f.type for f in cells.api.pod_frames("p-0")] == ["ADDED", "MODIFIED"]
    assert cells.api.pod_frames("p-0")[-1].resource_version == moved.members["p-0"]


async def test_leaving_and_reentering_the_selector_arrives_as_deleted_then_added(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """The server filters by selector, so a label edit that leaves it is a DELETED frame and one
    that re-enters it an ADDED frame: the cell loses the pod, then regains it."""
    async with _cells(k8s_api_client, k8s_namespace) as cells:
        await cells.seed("a", "p-0")

        await cells.patch_labels("p-0", {SELECTED_LABEL: "no"})
        await cells.converge("a", set())
        assert cells.loop.parent_keys() == set()
        await cells.patch_labels("p-0", {SELECTED_LABEL: SELECTED})
        await cells.converge("a", {"p-0"})

    assert [f.type for f in cells.api.pod_frames("p-0")] == ["ADDED", "DELETED", "ADDED"]


async def test_removing_the_parent_label_drops_the_pod(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Still selected, so the server sends MODIFIED; with no parent label the store drops it."""
    async with _cells(k8s_api_client, k8s_namespace) as cells:
        await cells.seed("a", "p-0", "p-1")

        await cells.patch_labels("p-0", {CELL_LABEL: None})
        await cells.converge("a", {"p-1"})

    frames = cells.api.pod_frames("p-0")
    assert [f.type for f in frames] == ["ADDED", "MODIFIED"]
    assert frames[-1].pod is not None
    assert CELL_LABEL not in frames[-1].pod.metadata.labels
    assert cells.loop.parent_keys() == {"a"}
