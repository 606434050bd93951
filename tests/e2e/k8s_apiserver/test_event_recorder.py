"""Layer: real apiserver, no kubelet. `events.EventRecorder` writing core/v1 Events to a real
kube-apiserver (the cached one, watch cache on) through `ClientEventSink` and the write client.

`kubectl describe pod` and `kubectl get events` show what it records; a storm of 10,000 identical
events is written as client-go writes it, counted by the apiserver's own
`apiserver_request_total` for events: client-go's spam filter lets 25 through (a token bucket of 25,
refilled at one per 300 s: `25 + floor(seconds / 300)` for a storm of that many seconds), the
first a POST, the other 24 PATCHes of its count, so the one Event ends with count 25.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.k8s_testenv.apiserver_metrics import apiserver_requests
from miles.utils.workers.reconcile.client import Client
from miles.utils.workers.reconcile.events import ClientEventSink, EventRecorder
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport
from tests.e2e.k8s_apiserver.harness import create_pod

pytestmark = pytest.mark.k8s_apiserver

SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0


def _sink(api: Any) -> ClientEventSink:
    transport = KubernetesAsyncioTransport(api_client=api)
    return ClientEventSink(Client(transport=transport, field_manager="pool-ctl"))


async def _event_writes(api: Any) -> dict[str, int]:
    """The apiserver's count of POST and PATCH requests on events, by verb."""
    return await apiserver_requests(api, "events", "POST", "PATCH")


async def _kubectl(kubeconfig: Path, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--kubeconfig={kubeconfig}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_kubectl_describe_and_get_events_show_the_recorded_events(
    k8s_api_client: ApiClientFactory, cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core = client.CoreV1Api(api)
        pod = api.sanitize_for_serialization(
            await create_pod(core, k8s_namespace, "engine-0", cell=None)
        )
        async with EventRecorder(sink=_sink(api), component="pool-ctl") as recorder:
            recorder.record(pod, "Normal", "Created", "created engine-0 for pool-a")
            recorder.record(pod, "Warning", "DrainSlow", "drain of engine-0 took 31s")
        assert (recorder.written, recorder.given_up, recorder.dropped) == (2, 0, 0)
    described = await _kubectl(
        cached_kubeconfig, "describe", "pod", "engine-0", "-n", k8s_namespace
    )
    events_section = described.split("Events:", 1)[1]
    assert "Created" in events_section
    assert "created engine-0 for pool-a" in events_section
    assert "drain of engine-0 took 31s" in events_section
    assert "pool-ctl" in events_section
    listed = await _kubectl(cached_kubeconfig, "get", "events", "-n", k8s_namespace)
    assert "pod/engine-0" in listed
    assert "DrainSlow" in listed
    print("k8s_apiserver: kubectl describe and get events ran against the cached kube-apiserver")


async def test_a_storm_of_10000_identical_events_writes_what_client_go_writes(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        core = client.CoreV1Api(api)
        pod = api.sanitize_for_serialization(
            await create_pod(core, k8s_namespace, "engine-1", cell=None)
        )
        before = await _event_writes(api)
        started = time.monotonic()
        async with EventRecorder(sink=_sink(api), component="pool-ctl") as recorder:
            for _ in range(10_000):
                recorder.record(pod, "Warning", "BackOff", "Back-off restarting failed container")
                if recorder.queued > 500:  # paced, so the storm is filtered, not dropped
                    await asyncio.sleep(0.01)
        seconds = time.monotonic() - started
        after = await _event_writes(api)
        events = (await core.list_namespaced_event(k8s_namespace)).items
    expected = SPAM_BURST + int(seconds // SPAM_REFILL_SECONDS)
    writes = {verb: after[verb] - before[verb] for verb in after}
    print(
        f"k8s_apiserver: 10,000 identical events in {seconds:.1f}s wrote {writes} "
        f"(client-go: {expected} = 1 POST + {expected - 1} PATCH); recorder: "
        f"written={recorder.written} skipped={recorder.skipped} dropped={recorder.dropped}"
    )
    assert recorder.dropped == 0
    assert writes == {"POST": 1, "PATCH": expected - 1}
    assert (recorder.written, recorder.skipped) == (expected, 10_000 - expected)
    (event,) = [e for e in events if e.involved_object.name == "engine-1"]
    assert event.count == expected
