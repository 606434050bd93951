"""Fast layer: the list, event and job models read what ``kubectl get … -o json`` prints, the
``kubernetes_asyncio`` models and their snake_case dicts (row ``k8s_types.py`` "kubectl documents").
The prints in ``wire/kubectl_*.json`` are written by hand in kubectl's shape (``kind:
List``, each item with its ``kind``, keys sorted, four-space indent); the e2e test
``tests/e2e/k8s_apiserver/test_k8s_documents.py`` reads the same models from a real apiserver.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from miles.utils.k8s_testenv.testing.k8s_fakes import list_body, realistic_pod
from miles.utils.workers.reconcile import k8s_types
from miles.utils.workers.reconcile.k8s_types import (
    Event,
    EventList,
    FrameMetadata,
    Job,
    JobCondition,
    ObjectMeta,
    ObjectReference,
    PodList,
    SkippedItem,
    WatchFrame,
    WatchFrameMetadata,
)
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list

WIRE = Path(__file__).parent / "wire"
PODS = (WIRE / "kubectl_pods.json").read_bytes()
EVENTS = (WIRE / "kubectl_events.json").read_bytes()
JOB = (WIRE / "kubectl_job.json").read_bytes()


async def _client_model(wire: bytes, model: str) -> Any:
    from kubernetes_asyncio.client import ApiClient

    async with ApiClient() as client:
        return client.deserialize(SimpleNamespace(data=wire.decode()), model)


async def _readings(wire: bytes, model: str) -> dict[str, Any]:
    """The four shapes a consumer holds: kubectl's bytes, their camelCase dict, the client's model
    and its snake_case ``to_dict()``."""
    client_model = await _client_model(wire, model)
    return {
        "bytes": wire,
        "camelCase dict": json.loads(wire),
        "kubernetes_asyncio model": client_model,
        "snake_case dict": client_model.to_dict(),
    }


def _read(cls: Any, shape: str, value: Any) -> Any:
    return cls.model_validate_json(value) if shape == "bytes" else cls.model_validate(value)


async def test_kubectls_pod_list_reads_in_every_shape() -> None:
    for shape, value in (await _readings(PODS, "V1PodList")).items():
        pods = _read(PodList, shape, value)
        assert [p.metadata.name for p in pods.items] == ["engine-cell-3-0", "engine-cell-4-0"], (
            shape
        )
        assert pods.skipped == (), shape
        running, pending = pods.items
        assert running.metadata.labels["miles.io/cell"] == "cell-3"
        assert (running.status.phase, running.status.pod_ip) == ("Running", "10.244.17.42")
        (engine,) = running.status.container_statuses
        assert (engine.ready, engine.restart_count) == (True, 1)
        assert engine.last_state.terminated is not None
        assert (engine.last_state.terminated.exit_code, engine.last_state.terminated.reason) == (
            137,
            "OOMKilled",
        )
        (waiting,) = pending.status.container_statuses
        assert waiting.state.waiting is not None
        assert waiting.state.waiting.reason == "ContainerCreating"


async def test_kubectls_event_list_reads_in_every_shape() -> None:
    for shape, value in (await _readings(EVENTS, "CoreV1EventList")).items():
        events = _read(EventList, shape, value)
        assert events.skipped == (), shape
        scheduled, pulled, backoff = events.items
        assert (scheduled.reason, scheduled.type, scheduled.count) == ("Scheduled", "Normal", None)
        assert (scheduled.first_timestamp, scheduled.last_timestamp) == (None, None)
        assert scheduled.event_time == datetime(2026, 11, 30, 4, 0, 0, 412873, tzinfo=UTC)
        assert scheduled.involved_object == ObjectReference(
            kind="Pod",
            name="engine-cell-3-0",
            namespace="train",
            uid="6b1c4a52-5907-4f1e-9a7b-3c2d1e0f9a8b",
        )
        assert pulled.count == 2
        assert (
            pulled.message
            == 'Container image "registry.local/sglang:0.4.6" already present on machine'
        )
        assert (backoff.type, backoff.reason, backoff.count) == ("Warning", "BackOff", 7)
        assert (backoff.first_timestamp, backoff.last_timestamp) == (
            datetime(2026, 11, 30, 4, 0, 4, tzinfo=UTC),
            datetime(2026, 11, 30, 4, 6, 41, tzinfo=UTC),
        )
        assert backoff.metadata.name == "engine-cell-3-0.187c9a30a1b2c3d4"


async def test_kubectls_job_reads_in_every_shape() -> None:
    for shape, value in (await _readings(JOB, "V1Job")).items():
        job = _read(Job, shape, value)
        assert job.metadata.name == "rollout-eval-28871", shape
        assert job.metadata.labels["miles.io/run"] == "grpo-7b"
        assert [c.type for c in job.status.conditions] == ["FailureTarget", "Failed"]
        assert job.status.conditions[1] == JobCondition(
            type="Failed",
            status="True",
            reason="BackoffLimitExceeded",
            message="Job has reached the specified backoff limit",
        )
        assert (job.status.active, job.status.succeeded, job.status.failed) == (0, 0, 3)


def test_a_job_without_status_reads_as_go_zero_counts() -> None:
    job = Job.model_validate({"metadata": {"name": "j"}, "status": None})
    assert (job.status.conditions, job.status.active, job.status.succeeded, job.status.failed) == (
        [],
        0,
        0,
        0,
    )


def test_an_event_reads_from_a_hand_built_kubernetes_asyncio_model() -> None:
    from kubernetes_asyncio import client as k8s

    event = Event.model_validate(
        k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name="e-1"),
            involved_object=k8s.V1ObjectReference(kind="Job", name="rollout-eval-28871"),
            reason="Completed",
            count=1,
        )
    )
    assert (event.involved_object.kind, event.involved_object.name) == ("Job", "rollout-eval-28871")
    assert (event.reason, event.count, event.event_time) == ("Completed", 1, None)


def test_an_apiservers_pod_list_reads_as_the_list_decoder_reads_it() -> None:
    """A LIST body (items without ``kind``, as the apiserver writes them) reads as the reflector's
    page does."""
    items = [realistic_pod(f"engine-{i}", f"cell-{i}") for i in range(3)]
    body = list_body([{k: v for k, v in item.items() if k != "kind"} for item in items], "9")
    pods = PodList.model_validate_json(body)
    assert [p.metadata.name for p in pods.items] == ["engine-0", "engine-1", "engine-2"]
    assert [k.kind for k in pods.item_kinds] == [None, None, None]
    assert tuple(pods.items) == decode_pod_list(body)[0].pods
    assert pods.items == PodList.model_validate(json.loads(body)).items


def test_the_frame_metadata_keeps_its_old_name() -> None:
    import miles.utils.workers.k8s_types as consumers

    assert consumers.WatchFrameMetadata is WatchFrameMetadata is FrameMetadata
    assert consumers.FrameMetadata is FrameMetadata
    frame = WatchFrame.model_validate({"metadata": {"name": "p", "resourceVersion": "7"}})
    assert frame.metadata == WatchFrameMetadata(name="p", resource_version="7")


def _bad_document() -> dict[str, Any]:
    """kubectl's print with one item of every kind of trouble."""
    doc: dict[str, Any] = json.loads(PODS)
    running, pending = doc["items"]
    odd_time = copy.deepcopy(pending)
    odd_time["metadata"]["name"] = "engine-cell-5-0"
    odd_time["status"]["conditions"][0]["lastTransitionTime"] = "2026-13-45T99:00:00Z"
    event = json.loads(EVENTS)["items"][0]
    nameless = copy.deepcopy(running)
    del nameless["metadata"]["name"]
    doc["kind"] = "SomethingNew"
    doc["items"] = [running, None, event, nameless, "engine-cell-9-0", odd_time, pending]
    return doc


SKIPPED = (
    SkippedItem(index=1, name=None, reason="null item"),
    SkippedItem(index=2, name="engine-cell-3-0.187c9a2e4f3b1d20", reason="kind 'Event', not Pod"),
    SkippedItem(index=3, name=None, reason="metadata.name: Field required"),
    SkippedItem(index=4, name=None, reason="not an object: 'engine-cell-9-0'"),
)


@pytest.mark.parametrize("shape", ["bytes", "camelCase dict"])
def test_a_bad_document_decodes_what_it_can_and_names_what_it_skipped(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input: an unknown document kind, a null item, an item of another kind, one
    without a name, one that is not an object and a malformed timestamp. Every readable pod is
    kept (the odd timestamp reads as absent), the rest are named, with one WARNING line."""
    doc = _bad_document()
    value = json.dumps(doc, indent=4).encode() if shape == "bytes" else doc
    with caplog.at_level(logging.WARNING, logger=k8s_types.__name__):
        pods = _read(PodList, shape, value)
    assert [p.metadata.name for p in pods.items] == [
        "engine-cell-3-0",
        "engine-cell-5-0",
        "engine-cell-4-0",
    ]
    assert pods.items[1].status.conditions[0].last_transition_time is None
    assert pods.skipped == SKIPPED
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("k8s_types: PodList: 4 of 7 items skipped: items[1] (no name): null")
    assert "items[2] engine-cell-3-0.187c9a2e4f3b1d20: kind 'Event', not Pod" in line
    assert line.endswith("(+1 more)")


@pytest.mark.parametrize(
    "doc",
    [{}, {"items": None}, {"kind": "List", "metadata": None}],
    ids=["no items", "null items", "null metadata"],
)
def test_a_document_without_a_list_reads_as_empty(doc: dict[str, Any]) -> None:
    pods = PodList.model_validate(doc)
    assert (pods.items, pods.skipped) == ([], ())


def test_items_that_are_not_a_list_are_named_as_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=k8s_types.__name__):
        events = EventList.model_validate_json(b'{"kind": "List", "items": {"a": 1}}')
    assert events.items == []
    assert events.skipped == (SkippedItem(index=None, name=None, reason="not a list: {'a': 1}"),)
    [line] = [r.getMessage() for r in caplog.records]
    assert (
        line == "k8s_types: EventList: 1 of 1 items skipped: items (no name): not a list: {'a': 1}"
    )


@pytest.mark.parametrize(
    "document", [b"[]", b"null", b"5", b'"List"', b'{"kind": "List", "items": ['], ids=repr
)
def test_only_a_document_that_is_not_an_object_raises(document: bytes) -> None:
    """A cut document is not an object either: pydantic names where the JSON ends."""
    gc_was = gc.isenabled()
    for model in (PodList, EventList):
        with pytest.raises(ValidationError):
            model.model_validate_json(document)
    assert gc.isenabled() == gc_was


def test_an_event_item_with_an_odd_field_is_kept_and_one_of_another_kind_is_not() -> None:
    doc = json.loads(EVENTS)
    scheduled, pulled, backoff = doc["items"]
    pulled["count"] = "two"
    pulled["involvedObject"] = ["not", "an", "object"]
    doc["items"] = [scheduled, json.loads(PODS)["items"][0], pulled, backoff]
    events = EventList.model_validate(doc)
    assert [e.reason for e in events.items] == ["Scheduled", "Pulled", "BackOff"]
    assert (events.items[1].count, events.items[1].involved_object) == (None, ObjectReference())
    assert events.skipped == (
        SkippedItem(index=1, name="engine-cell-3-0", reason="kind 'Pod', not Event"),
    )


def test_list_models_are_frozen_and_dump_their_items_only() -> None:
    pods = PodList.model_validate_json(PODS)
    with pytest.raises(ValidationError):
        pods.items = []
    assert set(pods.model_dump()) == {"items"}
    assert PodList.model_validate(pods.model_dump()).items == pods.items


@pytest.mark.parametrize("metadata", ["absent", "null"])
def test_an_event_and_a_job_without_metadata_read_with_an_empty_one(metadata: str) -> None:
    """The system builds both from documents without metadata (a job read for its status alone,
    an event the API left half empty): absent is empty, as Go's zero ``ObjectMeta``."""
    event_doc = json.loads(EVENTS)["items"][0]
    job_doc = json.loads(JOB)
    for doc in (event_doc, job_doc):
        if metadata == "absent":
            del doc["metadata"]
        else:
            doc["metadata"] = None
    event = Event.model_validate_json(json.dumps(event_doc).encode())
    job = Job.model_validate(job_doc)
    assert event.metadata == job.metadata == ObjectMeta()
    assert (event.metadata.name, event.metadata.labels, event.metadata.finalizers) == ("", {}, [])
    assert event.reason == "Scheduled"
    assert job.status.failed == 3


@pytest.mark.parametrize("shape", ["bytes", "camelCase dict"])
def test_an_event_list_keeps_events_without_metadata_and_a_pod_list_skips_nameless_pods(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An event is kept whatever its metadata; a pod's name is the key it is stored by, so a pod
    without one is still left out and named (record row ``k8s_types.py`` "Objects without
    metadata")."""
    events = json.loads(EVENTS)
    del events["items"][1]["metadata"]
    pods = json.loads(PODS)
    del pods["items"][1]["metadata"]
    as_shape = (lambda d: json.dumps(d).encode()) if shape == "bytes" else (lambda d: d)
    with caplog.at_level(logging.WARNING, logger=k8s_types.__name__):
        event_list = _read(EventList, shape, as_shape(events))
        assert caplog.records == []
        pod_list = _read(PodList, shape, as_shape(pods))
    assert [e.reason for e in event_list.items] == ["Scheduled", "Pulled", "BackOff"]
    assert (event_list.items[1].metadata.name, event_list.skipped) == ("", ())
    assert len(pod_list.items) == len(pods["items"]) - 1
    assert pod_list.skipped == (SkippedItem(index=1, name=None, reason="metadata: Field required"),)


def test_a_long_event_list_read_in_runs_keeps_events_without_metadata() -> None:
    one = json.loads(EVENTS)["items"][0]
    del one["metadata"]
    doc = {"kind": "List", "apiVersion": "v1", "items": [one] * 3000}
    data = json.dumps(doc).encode()
    assert len(data) > 2 * 256 * 2**10, "long enough to be read in runs"
    events = EventList.model_validate_json(data)
    assert (len(events.items), events.skipped) == (3000, ())
    assert {e.metadata.name for e in events.items} == {""}
