"""Layer: real apiserver, no kubelet. The reflector's streaming list against real kube-apiservers.

On both apiservers (v1.36.3 serves a streaming list with and without its watch cache) a
`sendInitialEvents` watch streams the current pods, ends them with the `k8s.io/initial-events-end`
bookmark, and goes on as the watch: one request, no LIST. The fallback to a LIST for a server
that refuses the stream is proven in the fast layer.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory, ApiServerName
from miles.utils.k8s_testenv.testing.pod_api_recorder import RecordingPodApi
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.source_event import ReplaceEvent, SourceEvent, UpsertEvent
from tests.e2e.k8s_apiserver.harness import SELECTOR, WAIT_SECONDS, create_pod

pytestmark = pytest.mark.k8s_apiserver


async def _next(events: object, what: str) -> SourceEvent:
    try:
        return await asyncio.wait_for(anext(events), WAIT_SECONDS)  # type: ignore[call-overload]
    except TimeoutError:
        raise AssertionError(f"timed out after {WAIT_SECONDS:.0f}s waiting for {what}") from None


@pytest.mark.parametrize("server", ["cached", "uncached"])
async def test_streaming_list_syncs_then_follows_changes(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, server: ApiServerName
) -> None:
    async with k8s_api_client(server) as api:
        core = client.CoreV1Api(api)
        for name in ("a-0", "a-1"):
            await create_pod(core, k8s_namespace, name, cell="a")
        recording = RecordingPodApi(KubernetesAsyncioPodApi(core_v1_api=core))
        reflector = KubernetesReflector(
            kube_client=recording,
            namespace=k8s_namespace,
            label_selector=SELECTOR,
            streaming_list=True,
            retry_delay=0.2,
        )
        events = reflector.watch()
        try:
            replace = await _next(events, "the first listing")
            await create_pod(core, k8s_namespace, "a-2", cell="a")
            while True:
                event = await _next(events, "the ADDED of a-2")
                if isinstance(event, UpsertEvent) and event.key == "a-2":
                    break
        finally:
            await events.aclose()  # type: ignore[attr-defined]
    print(f"layer k8s_apiserver, {server} apiserver: {recording.describe()}")
    assert isinstance(replace, ReplaceEvent)
    assert sorted(replace.objects) == ["a-0", "a-1"]
    assert recording.pages == [], "the list was streamed: no LIST request"
    (stream,) = recording.watches
    assert stream.resource_version == ""
    assert [f.initial_events_end for f in stream.frames].count(True) == 1
    assert stream.frames[-1].resource_version == event.obj.metadata.resource_version
    status = reflector.source_status()
    assert (status.lists, status.watches, status.watch_restarts) == (1, 1, 0)
