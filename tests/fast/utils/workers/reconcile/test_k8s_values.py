"""The contract's values (``k8s_values``): a watch event read from the frames other clients hand
over (a dict, a ``kubernetes_asyncio`` model, a bookmark, an error)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    realistic_pod,
    status,
)
from miles.utils.workers.reconcile.k8s_errors import (
    FrameDecodeError,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import (
    PodWatchEvent,
)


@pytest.mark.parametrize(
    "obj",
    [
        realistic_pod("a", resource_version="7"),
        Pod.model_validate(realistic_pod("a", resource_version="7")).model_dump(),
    ],
    ids=["camelCase dict", "snake_case dict"],
)
def test_from_frame_reads_a_pod_frame_from_a_dict(obj: Any) -> None:
    event = PodWatchEvent.from_frame(event_type="MODIFIED", obj=obj)
    assert (event.type, event.resource_version) == ("MODIFIED", "7")
    assert event.pod is not None
    assert event.pod.metadata.name == "a"


async def test_from_frame_reads_a_kubernetes_asyncio_model() -> None:
    raw = realistic_pod("a", resource_version="7")
    async with ApiClient() as client:
        model = client.deserialize(SimpleNamespace(data=json.dumps(raw)), "V1Pod")
    event = PodWatchEvent.from_frame(event_type="ADDED", obj=model)
    assert event.pod is not None
    assert (event.pod.metadata.name, event.resource_version) == ("a", "7")
    assert event.pod.status.container_statuses[0].name == "engine"


def test_from_frame_reads_bookmarks_and_errors() -> None:
    end = {
        "kind": "Pod",
        "metadata": {"resourceVersion": "9", "annotations": {"k8s.io/initial-events-end": "true"}},
    }
    marked = PodWatchEvent.from_frame(event_type="BOOKMARK", obj=end)
    plain = PodWatchEvent.from_frame(
        event_type="BOOKMARK", obj={"metadata": {"resourceVersion": "8"}}
    )
    failed = PodWatchEvent.from_frame(event_type="ERROR", obj=status(410, "Expired"))
    assert (marked.resource_version, marked.initial_events_end) == ("9", True)
    assert (plain.resource_version, plain.initial_events_end) == ("8", False)
    assert (failed.type, failed.code, failed.rejects_cursor) == ("ERROR", 410, True)


def test_from_frame_rejects_what_it_cannot_read() -> None:
    broken = realistic_pod("a", resource_version="7")
    del broken["metadata"]["name"]
    with pytest.raises(FrameDecodeError) as invalid:
        PodWatchEvent.from_frame(event_type="ADDED", obj=broken)
    with pytest.raises(FrameDecodeError) as unreadable:
        PodWatchEvent.from_frame(event_type="ADDED", obj=None)
    with pytest.raises(FrameDecodeError) as unknown:
        PodWatchEvent.from_frame(event_type="SOMETHING", obj={})
    assert (invalid.value.resource_version, invalid.value.event_type) == ("7", "ADDED")
    assert unreadable.value.resource_version is None
    assert unknown.value.resource_version is None
    assert "SOMETHING" in unknown.value.reason
