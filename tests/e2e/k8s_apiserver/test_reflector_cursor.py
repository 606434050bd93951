"""Layer: real apiserver, no kubelet. The reflector's cursor against real servers and faults.

A real server-side watch timeout re-watches from the cursor without a relist; a cursor compaction
destroyed is read as expired and costs exactly one relist, which also synthesizes a deletion missed
while the watch was down; a real "too large resource version" 504 costs one relist; a cursor beyond
etcd's head, which a plain watch accepts silently, is caught by the cursor probe after the empty
watch and costs one relist; and the loop reconverges after an apiserver restart. Consistent LISTs
(the initial sync and relists), cursor probes and cursors are counted by a recording delegate.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory, ApiServerName, LocalControlPlane
from miles.utils.k8s_testenv.testing.pod_api_recorder import RecordingPodApi
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_values import ListOptions, PodListPage, PodWatchEvent
from tests.e2e.k8s_apiserver.harness import (
    FUTURE_OFFSET,
    SELECTOR,
    Cells,
    ForgedCursorCoreV1,
    create_pod,
    eventually,
    future_cursor,
    make_cursor_stale_then_compact,
)

pytestmark = pytest.mark.k8s_apiserver

SERVER_WATCH_TIMEOUT = 2


async def test_real_watch_timeout_rewatches_from_the_cursor_without_relisting(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Each watch is closed by the server after `timeoutSeconds=2` (not by the client, whose limit
    is 10 s later); every re-watch opens from the last cursor the previous one yielded, the one
    consistent LIST stays the only one (no relist), and a pod created after several re-watches
    still arrives. Each closed watch, with frames or without, was followed by exactly one cursor
    probe (a one-item LIST from the cursor the next watch opened from), which the server accepted
    (the last watch may have been stopped before its probe went out)."""
    async with Cells.on(
        k8s_api_client,
        "cached",
        namespace=k8s_namespace,
        watch_timeout_seconds=SERVER_WATCH_TIMEOUT,
    ) as cells:
        await cells.seed("a", "a-0")
        await eventually(
            lambda: sum(w.ended_at is not None for w in cells.api.watches) >= 3,
            what="three watches closed by the server's 2 s timeout",
            context=cells.api.describe,
        )
        await cells.create("a-1", cell="a")
        await cells.converge("a", {"a-0", "a-1"})
        await cells.assert_consistent(lists=1)

    watches = cells.api.watches
    closed = [w for w in watches if w.ended_at is not None and w.failure is None]
    assert len(closed) >= 3
    for watch in closed:
        assert watch.ended_at is not None
        assert 1.5 < watch.ended_at - watch.opened_at < SERVER_WATCH_TIMEOUT + 3
    assert watches[0].resource_version == cells.api.lists[0].resource_version
    for previous, following in itertools.pairwise(watches):
        assert following.resource_version == previous.last_cursor
    assert cells.api.cursor_rejections() == []
    rewatched_from = [w.last_cursor for w in closed]
    probed = [p.resource_version for p in cells.api.probes]
    assert probed in (rewatched_from, rewatched_from[:-1]), cells.api.describe()
    assert all(p.failure is None and p.limit == 1 for p in cells.api.probes)


async def _compaction_scenario(
    k8s_api_client: ApiClientFactory,
    plane: LocalControlPlane,
    namespace: str,
    *,
    delete_while_down: str | None,
) -> Cells:
    """Cell "a" = a-0, a-1 on the uncached apiserver, whose watches end every
    `SERVER_WATCH_TIMEOUT` seconds; make the cursor stale and compact etcd to its head.

    With `delete_while_down`, the uncached apiserver is stopped first and that pod deleted through
    the cached one, so no frame reports the deletion; the probe after the watch ends then finds
    the server gone and the reflector relists ("server was unreachable"). Without it, the server
    stays up, the probe accepts the stale cursor, and the re-watch from it meets a real 410."""
    uncached = plane.apiserver("uncached")
    async with (
        k8s_api_client("cached") as other,
        Cells.on(
            k8s_api_client,
            "uncached",
            namespace=namespace,
            watch_timeout_seconds=SERVER_WATCH_TIMEOUT,
        ) as cells,
    ):
        await cells.seed("a", "a-0", "a-1")
        stale = cells.api.watches[-1].last_cursor

        other_core = client.CoreV1Api(other)
        if delete_while_down is not None:
            await asyncio.to_thread(uncached.stop)
            await other_core.delete_namespaced_pod(
                delete_while_down, namespace, grace_period_seconds=0
            )
        await make_cursor_stale_then_compact(other_core, plane, namespace, stale)
        if delete_while_down is not None:
            await asyncio.to_thread(uncached.start)

        await eventually(
            lambda: len(cells.api.lists) == 2,
            what="the relist after the stale cursor",
            context=cells.api.describe,
        )
        await create_pod(other_core, namespace, "a-2", cell="a")
        survivors = {"a-0", "a-1", "a-2"} - {delete_while_down}
        await cells.converge("a", survivors)
        await cells.assert_consistent(lists=2)

    rejected = [w for w in cells.api.watches if any(f.rejects_cursor for f in w.frames)]
    if delete_while_down is None:
        assert [w.resource_version for w in rejected] == [stale]
    else:
        assert rejected == []
        assert any(p.failure is not None for p in cells.api.probes), cells.api.describe()
    return cells


async def test_compacted_cursor_is_read_as_expired_and_costs_exactly_one_relist(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    """Recipe §3: with no watch cache, the re-watch from a cursor below etcd's compaction gets a
    real 410 Expired frame; the reflector relists once and watches on from the new cursor."""
    cells = await _compaction_scenario(
        k8s_api_client, k8s_local_control_plane, k8s_namespace, delete_while_down=None
    )

    [rejection] = cells.api.cursor_rejections()
    assert rejection.type == "ERROR"
    assert rejection.reason.startswith("410 Expired:")
    relist = cells.api.lists[1]
    after_relist = [w for w in cells.api.watches if w.opened_at > cells.api.watches[0].opened_at]
    assert any(w.resource_version == relist.resource_version for w in after_relist)
    assert [f.type for f in cells.api.pod_frames("a-2")][:1] == ["ADDED"]


async def test_deletion_missed_while_the_watch_was_down_is_synthesized_by_the_relist(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    """a-1 is deleted while the uncached apiserver is down and the compaction erases its DELETED
    event, so no frame ever reports it: the relist (the probe found the server gone) removes it
    and wakes cell "a"."""
    cells = await _compaction_scenario(
        k8s_api_client, k8s_local_control_plane, k8s_namespace, delete_while_down="a-1"
    )

    assert [f.type for f in cells.api.pod_frames("a-1")] == ["ADDED"]
    assert [p.metadata.name for p in cells.api.lists[1].pods] == ["a-0"]
    relist_index = cells.api.log.index(cells.api.lists[1])
    woken = [r for r in cells.reconciled if r.parent == "a" and r.log_length > relist_index]
    assert woken, "cell 'a' was not reconciled after the relist"
    assert woken[0].names == {"a-0"}


async def test_real_too_large_resource_version_costs_exactly_one_relist(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """The first WATCH goes out from beyond etcd's head (with `sendInitialEvents`, see
    `ForgedCursorCoreV1`): the watch cache answers, after its 3 s wait, with a real 504
    "Too large resource version" ERROR frame, which the reflector reads as a cursor rejection and
    answers with one relist; the loop then follows changes from the new cursor."""
    async with k8s_api_client("cached") as api:
        core = client.CoreV1Api(api)
        await create_pod(core, k8s_namespace, "a-0", cell="a")
        forged = ForgedCursorCoreV1(core, await future_cursor(core, k8s_namespace), on_watch=True)
        recording = RecordingPodApi.over(forged)
        async with Cells.running(core_v1=core, namespace=k8s_namespace, api=recording) as cells:
            await eventually(
                lambda: len(cells.api.lists) == 2,
                what="the relist after the 504",
                context=cells.api.describe,
            )
            await cells.create("a-1", cell="a")
            await cells.converge("a", {"a-0", "a-1"})
            await cells.assert_consistent(lists=2)

    [rejection] = cells.api.cursor_rejections()
    assert rejection.reason.startswith("504 Timeout: Timeout: Too large resource version")
    assert cells.api.watches[1].resource_version == cells.api.lists[1].resource_version


class _ListFromBeforeARollback:
    """A `KubernetesPodApi` whose first LIST page carries a cursor beyond etcd's head, as if etcd
    had been restored from an older snapshot after serving it; everything else is forwarded."""

    def __init__(self, inner: KubernetesAsyncioPodApi) -> None:
        self._inner = inner
        self._rolled_back = False

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        return await self.list_pod_page(ListOptions(namespace, label_selector))

    async def list_pod_page(self, options: ListOptions) -> PodListPage:
        page = await self._inner.list_pod_page(options)
        if self._rolled_back or options.resource_version is not None:
            return page
        self._rolled_back = True
        forged = str(int(page.resource_version) + FUTURE_OFFSET)
        return PodListPage(page.pods, forged, page.continue_token)

    def stream_pods(
        self, *, namespace: str, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        return self._inner.stream_pods(
            namespace=namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )


@pytest.mark.parametrize("server", ["cached", "uncached"])
async def test_cursor_probe_accepts_a_cursor_the_server_has_and_rejects_one_beyond_its_head(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, server: ApiServerName
) -> None:
    """The probe's semantics on a real server: a LIST with `resourceVersionMatch=NotOlderThan` and
    `limit=1` from a cursor the server has returns at most one pod; from beyond etcd's head it is
    answered 504 Timeout with cause ResourceVersionTooLarge (the watch cache after its 3 s wait
    for the revision, the cache-less server at once), which reads as a cursor rejection."""
    async with k8s_api_client(server) as api:
        core = client.CoreV1Api(api)
        for name in ("a-0", "a-1"):
            created = await create_pod(core, k8s_namespace, name, cell="a")
        pods = KubernetesAsyncioPodApi(core_v1_api=core)
        cursor = created.metadata.resource_version
        page = await pods.list_pods(
            namespace=k8s_namespace, label_selector=SELECTOR, resource_version=cursor, limit=1
        )
        assert len(page.pods) == 1
        assert int(page.resource_version) >= int(cursor)
        with pytest.raises(KubernetesApiError) as rejected:
            await pods.list_pods(
                namespace=k8s_namespace,
                label_selector=SELECTOR,
                resource_version=str(int(cursor) + FUTURE_OFFSET),
                limit=1,
            )
    assert (rejected.value.code, rejected.value.reason) == (504, "Timeout")
    assert rejected.value.rejects_cursor
    assert "Too large resource version" in rejected.value.message


@pytest.mark.parametrize("server", ["cached", "uncached"])
async def test_cursor_beyond_etcd_head_after_a_rollback_is_recovered_by_a_relist(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, server: ApiServerName
) -> None:
    """Spec row `IsTooLargeResourceVersion`: "a rolled-back backend would otherwise freeze the
    store forever". A real server accepts a plain WATCH from a future cursor and closes it at the
    timeout with no frame; the reflector then probes the cursor with a one-item LIST, which the
    server rejects with 504 ResourceVersionTooLarge, and relists once: a pod created after the
    rollback is delivered, and every watch after the relist opens from a real cursor."""
    async with k8s_api_client(server) as api:
        core = client.CoreV1Api(api)
        await create_pod(core, k8s_namespace, "a-0", cell="a")
        recording = RecordingPodApi(
            _ListFromBeforeARollback(KubernetesAsyncioPodApi(core_v1_api=core))
        )
        async with Cells.running(
            core_v1=core,
            namespace=k8s_namespace,
            api=recording,
            watch_timeout_seconds=SERVER_WATCH_TIMEOUT,
        ) as cells:
            await cells.create("a-1", cell="a")
            await cells.converge("a", {"a-0", "a-1"}, within=15.0)
            await cells.assert_consistent(lists=2)

    forged = cells.api.watches[0].resource_version
    rejected = [p for p in cells.api.probes if p.failure is not None]
    assert [p.resource_version for p in rejected] == [forged], cells.api.describe()
    assert isinstance(rejected[0].failure, KubernetesApiError)
    assert rejected[0].failure.rejects_cursor
    assert "Too large resource version" in rejected[0].failure.message
    assert [
        w.resource_version for w in cells.api.watches if w.opened_at < rejected[0].opened_at
    ] == [forged]
    relist = cells.api.lists[1]
    assert cells.api.watches[1].resource_version == relist.resource_version


async def test_loop_reconverges_after_an_apiserver_restart(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    """The watch breaks when the cached apiserver stops; the reflector retries until it is back
    and the loop then follows a creation and a deletion made after the restart, with at most one
    relist (a restarted watch cache may no longer hold the cursor)."""
    async with Cells.on(k8s_api_client, "cached", namespace=k8s_namespace) as cells:
        await cells.seed("a", "a-0", "a-1")
        watches_before = len(cells.api.watches)

        await asyncio.to_thread(k8s_local_control_plane.restart_apiserver, "cached")
        async with k8s_api_client("cached") as fresh:
            writer = client.CoreV1Api(fresh)
            await create_pod(writer, k8s_namespace, "a-2", cell="a")
            await writer.delete_namespaced_pod("a-0", k8s_namespace, grace_period_seconds=0)
        await cells.converge("a", {"a-1", "a-2"})
        relists = len(cells.api.lists) - 1
        await cells.assert_consistent(lists=1 + relists)

    assert len(cells.api.watches) > watches_before
    assert relists <= 1, cells.api.describe()
