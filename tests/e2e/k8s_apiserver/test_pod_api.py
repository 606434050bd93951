"""Layer: real apiserver, no kubelet. `KubernetesAsyncioPodApi` against real kube-apiservers.

Proves the wire semantics the reflector stands on: a LIST/WATCH round trip decodes real bytes, an
abandoned watch closes at once and the next one opens from its cursor, the label selector scopes
both LIST and WATCH, a LIST read in pages follows continue tokens to every pod at one snapshot, and
what a real server answers for a resourceVersion beyond etcd's head.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory, ApiServerName, LocalControlPlane
from miles.utils.k8s_testenv.testing.pod_api_recorder import aclose, closing
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_reflector import LIST_PAGE_SIZE, KubernetesReflector
from miles.utils.workers.reconcile.k8s_values import PodWatchEvent
from miles.utils.workers.reconcile.source_event import ReplaceEvent
from tests.e2e.k8s_apiserver.harness import (
    CELL_LABEL,
    POLL_SECONDS,
    SELECTED_LABEL,
    SELECTOR,
    WAIT_SECONDS,
    ForgedCursorCoreV1,
    future_cursor,
    open_namespaced_pod_watches,
    pod_manifest,
)

pytestmark = pytest.mark.k8s_apiserver


async def _next_pod_frame(frames: AsyncIterator[PodWatchEvent], what: str) -> PodWatchEvent:
    """The next frame carrying a pod (bookmarks skipped), within `WAIT_SECONDS`."""

    async def next_pod() -> PodWatchEvent:
        async for frame in frames:
            if frame.pod is not None:
                return frame
        raise AssertionError(f"the watch ended before {what}")

    try:
        return await asyncio.wait_for(next_pod(), WAIT_SECONDS)
    except TimeoutError:
        raise AssertionError(f"timed out after {WAIT_SECONDS:.0f}s waiting for {what}") from None


async def _pod_frames_until(
    frames: AsyncIterator[PodWatchEvent], sentinel: str
) -> list[PodWatchEvent]:
    seen: list[PodWatchEvent] = []
    while True:
        frame = await _next_pod_frame(frames, f"the ADDED frame of sentinel pod {sentinel!r}")
        seen.append(frame)
        assert frame.pod is not None
        if frame.pod.metadata.name == sentinel:
            return seen


def _pod_api(api: Any) -> tuple[Any, KubernetesAsyncioPodApi]:
    core = client.CoreV1Api(api)
    return core, KubernetesAsyncioPodApi(core_v1_api=core)


def _watch(
    pods: KubernetesAsyncioPodApi, namespace: str, resource_version: str, timeout_seconds: int = 60
) -> AsyncIterator[PodWatchEvent]:
    """The selector's pods, watched from `resource_version`."""
    return pods.stream_pods(
        namespace=namespace,
        label_selector=SELECTOR,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
    )


async def test_list_then_watch_round_trip_decodes_real_pods(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """A LIST and a WATCH from its cursor see ADDED, MODIFIED, then a grace-0 deletion (MODIFIED
    with a deletionTimestamp, then DELETED, since the pod is bound to a node), cursors rising."""
    async with k8s_api_client("cached") as api:
        core, pods = _pod_api(api)
        listed = await core.create_namespaced_pod(k8s_namespace, pod_manifest("p-0", cell="a"))
        page = await pods.list_pods(namespace=k8s_namespace, label_selector=SELECTOR)
        assert [p.metadata.name for p in page.pods] == ["p-0"]
        assert page.pods[0].metadata.uid == listed.metadata.uid
        assert page.pods[0].spec.node_name == "node-a"
        assert page.pods[0].metadata.labels[CELL_LABEL] == "a"
        assert int(page.resource_version) >= int(listed.metadata.resource_version)

        stream = _watch(pods, k8s_namespace, page.resource_version)
        async with closing(stream) as frames:
            created = await core.create_namespaced_pod(k8s_namespace, pod_manifest("p-1", cell="a"))
            added = await _next_pod_frame(frames, "ADDED p-1")
            await core.patch_namespaced_pod(
                "p-1", k8s_namespace, {"metadata": {"labels": {CELL_LABEL: "b"}}}
            )
            modified = await _next_pod_frame(frames, "MODIFIED p-1")
            await core.delete_namespaced_pod("p-1", k8s_namespace, grace_period_seconds=0)
            deleting = await _next_pod_frame(frames, "MODIFIED p-1 marked for deletion")
            deleted = await _next_pod_frame(frames, "DELETED p-1")

    assert [
        (f.type, f.pod.metadata.name if f.pod else None) for f in (added, modified, deleted)
    ] == [
        ("ADDED", "p-1"),
        ("MODIFIED", "p-1"),
        ("DELETED", "p-1"),
    ]
    assert added.pod is not None
    assert added.pod.metadata.uid == created.metadata.uid
    assert modified.pod is not None
    assert modified.pod.metadata.labels[CELL_LABEL] == "b"
    assert deleting.type == "MODIFIED"
    assert deleting.pod is not None
    assert deleting.pod.metadata.deletion_timestamp is not None
    seen = (added, modified, deleting, deleted)
    cursors = [int(page.resource_version), *(int(f.resource_version or 0) for f in seen)]
    assert all(earlier < later for earlier, later in itertools.pairwise(cursors)), cursors


async def test_abandoned_watch_closes_at_once_and_the_next_opens_from_its_cursor(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Closing a watch mid-stream returns at once (not at its 60 s timeout); a watch opened from
    the last cursor it yielded replays nothing and sees the next change."""
    async with k8s_api_client("cached") as api:
        core, pods = _pod_api(api)
        page = await pods.list_pods(namespace=k8s_namespace, label_selector=SELECTOR)
        first = _watch(pods, k8s_namespace, page.resource_version)
        await core.create_namespaced_pod(k8s_namespace, pod_manifest("p-0", cell="a"))
        seen = await _next_pod_frame(first, "ADDED p-0 on the first watch")
        closing_started = time.monotonic()
        await asyncio.wait_for(aclose(first), 5.0)
        closing_took = time.monotonic() - closing_started
        assert seen.resource_version is not None

        second = _watch(pods, k8s_namespace, seen.resource_version)
        async with closing(second) as frames:
            await core.create_namespaced_pod(k8s_namespace, pod_manifest("p-1", cell="a"))
            following = await _next_pod_frame(frames, "ADDED p-1 on the second watch")

    assert closing_took < 1.0
    assert following.type == "ADDED"
    assert following.pod is not None
    assert following.pod.metadata.name == "p-1"


async def test_abandoned_watch_is_released_on_the_server(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    """Closing a watch that is waiting for its next frame ends the server's WATCH request too
    (its `apiserver_longrunning_requests` gauge drops back), not only the client's iterator."""
    async with k8s_api_client("cached") as api:
        _, pods = _pod_api(api)
        baseline = await open_namespaced_pod_watches(api)
        page = await pods.list_pods(namespace=k8s_namespace, label_selector=SELECTOR)
        stream = _watch(pods, k8s_namespace, page.resource_version)
        waiting = asyncio.create_task(_next_pod_frame(stream, "a frame that never comes"))
        await _gauge_reaches(api, baseline + 1, "the watch to be open on the server")
        waiting.cancel()
        await asyncio.wait([waiting])
        await asyncio.wait_for(aclose(stream), 5.0)
        await _gauge_reaches(api, baseline, "the server to release the abandoned watch")


async def _gauge_reaches(api: Any, value: int, what: str) -> None:
    seen: list[int] = []

    async def reached() -> None:
        while (current := await open_namespaced_pod_watches(api)) != value:
            seen.append(current)
            await asyncio.sleep(POLL_SECONDS)

    try:
        await asyncio.wait_for(reached(), WAIT_SECONDS)
    except TimeoutError:
        raise AssertionError(
            f"timed out waiting for {what}: gauge {seen[-3:]} != {value}"
        ) from None


async def test_label_selector_scopes_both_list_and_watch(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Unselected pods are absent from the LIST, and creating, changing or deleting them sends
    no frame; the watch only ever carries the selected pods."""
    async with k8s_api_client("cached") as api:
        core, pods = _pod_api(api)
        await core.create_namespaced_pod(k8s_namespace, pod_manifest("in-0", cell="a"))
        await core.create_namespaced_pod(
            k8s_namespace, pod_manifest("out-0", cell="a", selected=False)
        )
        page = await pods.list_pods(namespace=k8s_namespace, label_selector=SELECTOR)
        stream = _watch(pods, k8s_namespace, page.resource_version)
        async with closing(stream) as frames:
            await core.create_namespaced_pod(
                k8s_namespace, pod_manifest("out-1", cell="a", selected=False)
            )
            await core.create_namespaced_pod(k8s_namespace, pod_manifest("in-1", cell="a"))
            await core.patch_namespaced_pod(
                "out-0", k8s_namespace, {"metadata": {"labels": {CELL_LABEL: "b"}}}
            )
            await core.delete_namespaced_pod("out-1", k8s_namespace, grace_period_seconds=0)
            await core.create_namespaced_pod(k8s_namespace, pod_manifest("in-sentinel", cell="a"))
            watched = await _pod_frames_until(frames, "in-sentinel")

    assert [p.metadata.name for p in page.pods] == ["in-0"]
    assert [(f.type, f.pod.metadata.name if f.pod else None) for f in watched] == [
        ("ADDED", "in-1"),
        ("ADDED", "in-sentinel"),
    ]
    assert all(f.pod is not None and f.pod.metadata.labels[SELECTED_LABEL] for f in watched)


@pytest.mark.parametrize("apiserver", ["cached", "uncached"])
async def test_real_too_large_resource_version_on_a_watch_rejects_the_cursor(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, apiserver: ApiServerName
) -> None:
    """A real server answers a watch from beyond etcd's head with an in-band ERROR frame, code 504,
    reason Timeout, "Too large resource version" (the watch cache after its 3 s wait); the api
    reads it as a cursor rejection."""
    async with k8s_api_client(apiserver) as api:
        core = client.CoreV1Api(api)
        forged = ForgedCursorCoreV1(core, await future_cursor(core, k8s_namespace), on_watch=True)
        pods = KubernetesAsyncioPodApi(core_v1_api=forged)
        stream = _watch(
            pods, k8s_namespace, "ignored: replaced by the forged cursor", timeout_seconds=30
        )
        async with closing(stream) as frames:
            frame = await asyncio.wait_for(anext(frames), WAIT_SECONDS)

    assert frame.type == "ERROR"
    assert frame.rejects_cursor
    assert frame.reason.startswith("504 Timeout: Timeout: Too large resource version")


@pytest.mark.parametrize("apiserver", ["cached", "uncached"])
async def test_real_too_large_resource_version_on_a_list_rejects_the_cursor(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, apiserver: ApiServerName
) -> None:
    """A LIST from beyond etcd's head is a real HTTP 504 whose Status the api decodes into a
    `KubernetesApiError` that rejects the cursor."""
    async with k8s_api_client(apiserver) as api:
        core = client.CoreV1Api(api)
        forged = ForgedCursorCoreV1(core, await future_cursor(core, k8s_namespace), on_watch=False)
        pods = KubernetesAsyncioPodApi(core_v1_api=forged)
        with pytest.raises(KubernetesApiError) as rejected:
            await asyncio.wait_for(
                pods.list_pods(namespace=k8s_namespace, label_selector=SELECTOR), WAIT_SECONDS
            )

    assert rejected.value.code == 504
    assert rejected.value.reason == "Timeout"
    assert "Too large resource version" in rejected.value.message
    assert rejected.value.rejects_cursor


async def test_plain_watch_from_a_future_cursor_is_accepted_and_silent(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Without `sendInitialEvents`, the watch cache accepts a cursor beyond etcd's head: no 504,
    no frame, a clean close at the server's timeout (apiserver `Cacher.Watch`: "we allow for
    establishing the connection because the clients can wait for events"). So the reflector's
    own WATCH, which never asks for initial events, cannot learn of a future cursor from a 504."""
    async with k8s_api_client("cached") as api:
        core, pods = _pod_api(api)
        future = await future_cursor(core, k8s_namespace)
        started = time.monotonic()
        stream = _watch(pods, k8s_namespace, future, timeout_seconds=2)
        async with closing(stream) as frames:
            await core.create_namespaced_pod(k8s_namespace, pod_manifest("p-0", cell="a"))
            received = [frame async for frame in frames]
        lasted = time.monotonic() - started

    assert received == []
    assert 1.5 < lasted < 6.0


PAGED_PODS = 1_200
CREATE_CONCURRENCY = 32


async def _create_pods(core: Any, namespace: str, names: list[str]) -> None:
    slots = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(name: str) -> None:
        async with slots:
            await core.create_namespaced_pod(namespace, pod_manifest(name, cell="paged"))

    await asyncio.gather(*(create(name) for name in names))


@pytest.mark.parametrize("server", ["cached", "uncached"])
async def test_paged_list_reads_every_pod_at_the_first_pages_snapshot(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, server: ApiServerName
) -> None:
    """Row ``ListPager`` (real apiserver layer): 1,200 pods LISTed 500 a page follow continue
    tokens to all of them, every page at the first page's resourceVersion (the reflector's cursor
    is the last page's), and a pod created between pages is not in the LIST; through the
    reflector, the pages make one ReplaceEvent of every pod."""
    names = [f"paged-{index:04d}" for index in range(PAGED_PODS)]
    async with k8s_api_client(server) as api:
        core, pods = _pod_api(api)
        await _create_pods(core, k8s_namespace, names)
        first = await pods.list_pods(
            namespace=k8s_namespace, label_selector=SELECTOR, limit=LIST_PAGE_SIZE
        )
        await core.create_namespaced_pod(k8s_namespace, pod_manifest("zz-late", cell="paged"))
        pages = [first]
        while (token := pages[-1].continue_token) is not None:
            pages.append(
                await pods.list_pods(
                    namespace=k8s_namespace,
                    label_selector=SELECTOR,
                    limit=LIST_PAGE_SIZE,
                    continue_token=token,
                )
            )
        reflector = KubernetesReflector(
            kube_client=pods, namespace=k8s_namespace, label_selector=SELECTOR
        )
        source = reflector.watch()
        try:
            replace = await asyncio.wait_for(anext(source), WAIT_SECONDS)
        finally:
            await aclose(source)
    assert [len(page.pods) for page in pages] == [500, 500, 200]
    assert {page.resource_version for page in pages} == {first.resource_version}
    assert [pod.metadata.name for page in pages for pod in page.pods] == names
    assert isinstance(replace, ReplaceEvent)
    assert sorted(replace.objects) == [*names, "zz-late"]
