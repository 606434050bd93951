"""Layer: real apiserver (the cached kube-apiserver), no kubelet and no controllers. The models
consumers read besides `Pod`: an `Event` and a `Job` are written for real, the Job's
status through its `status` subresource (there is no job controller to write it), and what the
apiserver answers is read as bytes, as the client's models and as their snake_case dicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.workers.k8s_types import Event, EventList, Job, ObjectReference, Pod, PodList
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list
from tests.e2e.k8s_apiserver.fault_harness import raw_bytes
from tests.e2e.k8s_apiserver.harness import create_pod

pytestmark = pytest.mark.k8s_apiserver

_MERGE_PATCH = "application/merge-patch+json"
FIRST, LAST, MICRO = "2026-11-30T04:00:04Z", "2026-11-30T04:06:41Z", "2026-11-30T04:00:00.412873Z"


@pytest.fixture(autouse=True)
def _say_where(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print(f"k8s_apiserver: {request.node.name} ran on the cached kube-apiserver (watch cache on)")


def _events(namespace: str, pod: Any) -> list[dict[str, Any]]:
    about = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod.metadata.name,
        "namespace": namespace,
        "uid": pod.metadata.uid,
    }
    backoff = {
        "metadata": {"name": "engine-0.backoff"},
        "involvedObject": about,
        "reason": "BackOff",
        "message": "Back-off restarting failed container engine",
        "type": "Warning",
        "count": 7,
        "firstTimestamp": FIRST,
        "lastTimestamp": LAST,
        "source": {"component": "kubelet", "host": "node-a"},
    }
    scheduled = {
        "metadata": {"name": "engine-0.scheduled"},
        "involvedObject": about,
        "reason": "Scheduled",
        "message": f"Successfully assigned {namespace}/engine-0 to node-a",
        "type": "Normal",
        "eventTime": MICRO,
        "action": "Binding",
        "reportingComponent": "default-scheduler",
        "reportingInstance": "default-scheduler-node-a",
    }
    return [backoff, scheduled]


def _assert_events(events: EventList, pod: Any, what: str) -> None:
    assert events.skipped == (), what
    by_reason = {e.reason: e for e in events.items}
    backoff, scheduled = by_reason["BackOff"], by_reason["Scheduled"]
    assert backoff.involved_object == ObjectReference(
        kind="Pod", name="engine-0", namespace=pod.metadata.namespace, uid=pod.metadata.uid
    ), what
    assert (backoff.type, backoff.count, backoff.metadata.name) == (
        "Warning",
        7,
        "engine-0.backoff",
    ), what
    assert [t.isoformat() for t in (backoff.first_timestamp, backoff.last_timestamp) if t] == [
        "2026-11-30T04:00:04+00:00",
        "2026-11-30T04:06:41+00:00",
    ], what
    assert scheduled.event_time is not None, what
    assert scheduled.event_time.isoformat() == "2026-11-30T04:00:00.412873+00:00", what
    assert (scheduled.first_timestamp, scheduled.count) == (None, None), what


def _job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout-eval", "labels": {"miles.io/run": "grpo-7b"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "eval", "image": "busybox"}],
                }
            },
        },
    }


def _failed_status() -> dict[str, Any]:
    failure = {
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
        "lastTransitionTime": LAST,
    }
    return {
        "status": {
            "startTime": FIRST,
            "failed": 1,
            "conditions": [failure | {"type": "FailureTarget"}, failure | {"type": "Failed"}],
        }
    }


def _assert_job(job: Job, what: str) -> None:
    assert (job.metadata.name, job.metadata.labels) == ("rollout-eval", {"miles.io/run": "grpo-7b"})
    assert [(c.type, c.status, c.reason) for c in job.status.conditions] == [
        ("FailureTarget", "True", "BackoffLimitExceeded"),
        ("Failed", "True", "BackoffLimitExceeded"),
    ], what
    assert job.status.conditions[1].message == "Job has reached the specified backoff limit"
    assert (job.status.active, job.status.succeeded, job.status.failed) == (0, 0, 1), what


async def test_an_event_and_a_job_from_a_real_apiserver_read_in_every_shape(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """Two core/v1 Events (a kubelet-style one with timestamps and a count, a scheduler-style one
    with only a `MicroTime` `eventTime`) and a batch/v1 Job with a Failed condition, each read from
    the LIST's and the GET's bytes, the client's model and its `to_dict()`."""
    async with k8s_api_client("cached") as api:
        core: Any = client.CoreV1Api(api)
        batch: Any = client.BatchV1Api(api)
        pod = await create_pod(core, k8s_namespace, "engine-0", cell="a")
        for event in _events(k8s_namespace, pod):
            await core.create_namespaced_event(k8s_namespace, event)
        await batch.create_namespaced_job(k8s_namespace, _job())
        await raw_bytes(
            batch.patch_namespaced_job_status(
                "rollout-eval",
                k8s_namespace,
                _failed_status(),
                _content_type=_MERGE_PATCH,
                _preload_content=False,
            )
        )
        events_bytes = await raw_bytes(
            core.list_namespaced_event(k8s_namespace, _preload_content=False)
        )
        events_model = await core.list_namespaced_event(k8s_namespace)
        job_bytes = await raw_bytes(
            batch.read_namespaced_job("rollout-eval", k8s_namespace, _preload_content=False)
        )
        job_model = await batch.read_namespaced_job("rollout-eval", k8s_namespace)
        one_event = await core.read_namespaced_event("engine-0.backoff", k8s_namespace)
        pods_bytes = await raw_bytes(
            core.list_namespaced_pod(k8s_namespace, _preload_content=False)
        )
    _assert_events(EventList.model_validate_json(events_bytes), pod, "bytes")
    _assert_events(EventList.model_validate(events_model), pod, "kubernetes_asyncio model")
    _assert_events(EventList.model_validate(events_model.to_dict()), pod, "snake_case dict")
    assert Event.model_validate(one_event).count == 7
    _assert_job(Job.model_validate_json(job_bytes), "bytes")
    _assert_job(Job.model_validate(job_model), "kubernetes_asyncio model")
    _assert_job(Job.model_validate(job_model.to_dict()), "snake_case dict")
    pods = PodList.model_validate_json(pods_bytes)
    assert [p.metadata.name for p in pods.items] == ["engine-0"]
    assert tuple(pods.items) == decode_pod_list(pods_bytes)[0].pods
    assert isinstance(pods.items[0], Pod)
