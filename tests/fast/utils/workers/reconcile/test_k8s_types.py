"""Fast layer: the partial pod models read every wire shape (spec rows ``k8s_types.py``)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    GATE,
    PARENT_LABEL,
    every_field_pod,
    frame,
    gated_pod,
    pod_bytes,
    realistic_pod,
    status,
)
from miles.utils.workers.reconcile import k8s_types
from miles.utils.workers.reconcile.k8s_types import (
    ContainerState,
    ContainerStateTerminated,
    ContainerStateWaiting,
    Pod,
    PodCondition,
    PodSpec,
    PodStatus,
    WatchFrame,
)
from miles.utils.workers.reconcile.k8s_wire import decode_watch_line

STARTED = datetime(2026, 11, 30, 4, 0, 5, tzinfo=UTC)
CREATED = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)


def _assert_reads_every_field(pod: Pod) -> None:
    meta = pod.metadata
    assert (meta.name, meta.namespace, meta.resource_version) == ("engine-0", "default", "1000")
    assert meta.uid is not None
    assert meta.uid.startswith("6b1c4a52-")
    assert (meta.creation_timestamp, meta.deletion_timestamp) == (CREATED, None)
    assert meta.labels[PARENT_LABEL] == "cell-3"
    assert "miles.io/config-hash" in meta.annotations
    (owner,) = meta.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "ReplicaSet",
        "cell-3-7d9f8c6b5",
        "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
        True,
    )
    spec = pod.spec
    assert (spec.node_name, spec.subdomain) == ("gpu-node-17", "cell-3")
    assert spec.node_selector == {"kubernetes.io/hostname": "gpu-node-17"}
    assert spec.scheduling_gates == []
    status = pod.status
    assert (status.phase, status.reason, status.pod_ip) == (
        "Running",
        "NodePressure",
        "10.244.17.42",
    )
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, ready.message, ready.last_transition_time) == (
        "True",
        None,
        None,
        STARTED,
    )
    (engine,) = status.container_statuses
    assert (engine.name, engine.ready, engine.started, engine.restart_count) == (
        "engine",
        True,
        True,
        2,
    )
    assert engine.container_id == "containerd://" + "cd" * 32
    assert engine.state.running is not None
    assert engine.state.running.started_at == STARTED
    assert (engine.state.waiting, engine.state.terminated) == (None, None)
    killed = engine.last_state.terminated
    assert killed is not None
    assert (killed.exit_code, killed.reason, killed.container_id) == (
        137,
        "OOMKilled",
        "containerd://" + "aa" * 32,
    )
    assert (killed.started_at, killed.finished_at) == (CREATED, STARTED)
    (init,) = status.init_container_statuses
    assert (init.name, init.ready, init.started, init.restart_count) == (
        "fetch-weights",
        True,
        False,
        0,
    )
    done = init.state.terminated
    assert done is not None
    assert (done.exit_code, done.reason, done.started_at, done.finished_at) == (
        0,
        "Completed",
        CREATED,
        STARTED,
    )
    assert done.container_id == init.container_id == "containerd://" + "ef" * 32
    assert init.last_state == ContainerState()


def _assert_reads_gated_pod(pod: Pod) -> None:
    assert pod.metadata.name == "infer-0"
    assert pod.metadata.deletion_timestamp == datetime(2026, 11, 30, 5, 0, 0, tzinfo=UTC)
    assert [g.name for g in pod.spec.scheduling_gates] == [GATE]
    assert (pod.spec.node_name, pod.spec.node_selector) == (None, {})
    assert pod.status.phase == "Pending"
    (scheduled,) = pod.status.conditions
    assert (scheduled.type, scheduled.status, scheduled.reason) == (
        "PodScheduled",
        "False",
        "SchedulingGated",
    )
    assert scheduled.message == "Scheduling is blocked due to non-empty scheduling gates"
    (engine,) = pod.status.container_statuses
    assert (engine.ready, engine.started, engine.container_id) == (False, None, None)
    assert engine.state.waiting == ContainerStateWaiting(
        reason="ContainerCreating", message="pulling"
    )
    assert pod.status.init_container_statuses == []


async def _kubernetes_asyncio_pod(wire: dict[str, Any]) -> Any:
    from kubernetes_asyncio.client import ApiClient

    async with ApiClient() as client:
        return client.deserialize(SimpleNamespace(data=json.dumps(wire)), "V1Pod")


READERS = {
    "bytes": lambda wire: Pod.model_validate_json(pod_bytes(wire)),
    "camelCase dict": Pod.model_validate,
}


@pytest.mark.parametrize("read", READERS.values(), ids=READERS.keys())
def test_every_field_miles_reads_validates_from_bytes_and_dicts(read: Any) -> None:
    """Row "Generated core/v1 types": one model reads the apiserver's camelCase bytes and dicts."""
    _assert_reads_every_field(read(every_field_pod()))
    _assert_reads_gated_pod(read(gated_pod()))


async def test_every_field_validates_from_a_kubernetes_asyncio_model_and_its_snake_case_dict() -> (
    None
):
    """Row "Two wire spellings": ``from_attributes`` reads a ``V1Pod``'s snake_case attributes, and
    its ``to_dict()`` is the snake_case dict."""
    v1pod = await _kubernetes_asyncio_pod(every_field_pod())
    _assert_reads_every_field(Pod.model_validate(v1pod))
    _assert_reads_every_field(Pod.model_validate(v1pod.to_dict()))
    v1gated = await _kubernetes_asyncio_pod(gated_pod())
    _assert_reads_gated_pod(Pod.model_validate(v1gated))
    _assert_reads_gated_pod(Pod.model_validate(v1gated.to_dict()))


def test_a_hand_built_kubernetes_asyncio_pod_validates() -> None:
    """What a controller holding client objects passes: a ``V1Pod(...)`` it built itself."""
    from kubernetes_asyncio import client as k8s

    v1pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name="infer-0",
            labels={PARENT_LABEL: "cell-3"},
            owner_references=[
                k8s.V1OwnerReference(api_version="v1", kind="Pod", name="trainer-0", uid="u-1")
            ],
        ),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="engine")],
            scheduling_gates=[k8s.V1PodSchedulingGate(name=GATE)],
            node_selector={"kubernetes.io/hostname": "gpu-node-17"},
        ),
    )
    pod = Pod.model_validate(v1pod)
    assert [g.name for g in pod.spec.scheduling_gates] == [GATE]
    assert pod.spec.node_selector == {"kubernetes.io/hostname": "gpu-node-17"}
    (owner,) = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "Pod",
        "trainer-0",
        "u-1",
        None,
    )
    assert pod.status == PodStatus()


def test_fields_a_real_apiserver_may_omit_are_optional() -> None:
    """A container the kubelet has not reported on has no ``ready``, ``containerID``, ``started``
    or ``restartCount`` yet; a termination may lack its exit code."""
    pod = Pod.model_validate_json(
        b'{"metadata":{"name":"p"},"status":{"containerStatuses":[{"name":"c"}],'
        b'"initContainerStatuses":[{"state":{"terminated":{}}}]}}'
    )
    (container,) = pod.status.container_statuses
    assert (container.ready, container.started, container.container_id) == (None, None, None)
    assert container.restart_count == 0
    (init,) = pod.status.init_container_statuses
    assert init.name is None
    assert init.state.terminated == ContainerStateTerminated()


def test_none_reads_as_empty_maps_lists_and_objects() -> None:
    """Row "An unset field": ``None`` reads as ``{}``, ``[]`` or an empty model, both spellings."""
    pod = Pod.model_validate_json(
        b'{"metadata":{"name":"p","labels":null,"annotations":null,"ownerReferences":null},'
        b'"spec":{"nodeSelector":null,"schedulingGates":null},'
        b'"status":{"conditions":null,"initContainerStatuses":null,"containerStatuses":'
        b'[{"name":"c","ready":false,"restartCount":0,"state":null,"lastState":null}]}}'
    )
    assert (pod.metadata.labels, pod.metadata.annotations, pod.metadata.owner_references) == (
        {},
        {},
        [],
    )
    assert (pod.spec.node_name, pod.spec.node_selector, pod.spec.scheduling_gates) == (None, {}, [])
    assert (pod.status.conditions, pod.status.init_container_statuses) == ([], [])
    assert pod.status.container_statuses[0].state == ContainerState()
    assert pod.status.container_statuses[0].last_state == ContainerState()
    snake = Pod.model_validate(
        {"metadata": {"name": "p", "owner_references": None}, "spec": None, "status": None}
    )
    assert (snake.metadata.owner_references, snake.spec, snake.status) == (
        [],
        PodSpec(),
        PodStatus(),
    )


def test_unknown_fields_are_ignored_and_models_are_frozen() -> None:
    pod = Pod.model_validate({"metadata": {"name": "p", "futureField": 1}, "surprise": [1]})
    with pytest.raises(ValidationError):
        pod.metadata.name = "q"


@pytest.mark.parametrize(
    ("field", "pod"),
    [
        ("metadata", {"spec": {}}),
        ("metadata", {"metadata": "engine-0"}),
        ("name", {"metadata": {"namespace": "default"}}),
        ("name", {"metadata": {"name": 7}}),
        ("labels", {"metadata": {"name": "p", "labels": {PARENT_LABEL: 3}}}),
        ("labels", {"metadata": {"name": "p", "labels": [PARENT_LABEL]}}),
    ],
)
def test_only_the_name_and_the_labels_can_reject_a_pod(field: str, pod: dict[str, Any]) -> None:
    """Row "Go's decoder has no required fields": the object key and what ``key_map`` reads."""
    with pytest.raises(ValidationError) as err:
        Pod.model_validate_json(json.dumps(pod))
    assert field in str(err.value)


def test_a_timestamp_the_apiserver_accepts_and_python_cannot_hold_reads_as_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "Lenient where Go is lenient": year 0 is a valid RFC 3339 time that
    Go's ``metav1.Time`` reads and Python's ``datetime`` cannot hold. The pod decodes, from bytes,
    a dict and a MODIFIED frame, with that one field absent and one DEBUG line naming it."""
    wire = realistic_pod("engine-0", "cell-3", resource_version="8")
    wire["status"]["conditions"][2]["lastTransitionTime"] = "0000-01-01T00:00:00Z"
    fine = Pod.model_validate(realistic_pod("engine-0", "cell-3", resource_version="8"))
    with caplog.at_level(logging.DEBUG, logger=k8s_types.__name__):
        decoded = [
            Pod.model_validate_json(pod_bytes(wire)),
            Pod.model_validate(wire),
            decode_watch_line(frame("MODIFIED", wire)).pod,
        ]
    for pod in decoded:
        assert pod is not None
        assert pod.status.conditions[2].type == "Ready"
        assert pod.status.conditions[2].last_transition_time is None
        assert pod.model_copy(update={"status": fine.status}) == fine
        assert pod.status.conditions[:2] + pod.status.conditions[3:] == (
            fine.status.conditions[:2] + fine.status.conditions[3:]
        )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert all(r.levelno == logging.DEBUG for r in caplog.records)
    assert all("PodCondition.last_transition_time" in line for line in lines)
    assert all("0000-01-01T00:00:00Z" in line for line in lines)


def test_a_bad_list_item_reads_as_an_empty_item_and_its_neighbours_stand(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wire = realistic_pod("engine-0")
    wire["status"]["conditions"][0] = "Ready"
    wire["spec"]["schedulingGates"] = [{"name": GATE}, 5]
    with caplog.at_level(logging.DEBUG, logger=k8s_types.__name__):
        pod = Pod.model_validate_json(pod_bytes(wire))
    assert pod.status.conditions[0] == PodCondition()
    assert [c.type for c in pod.status.conditions[1:]] == [
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    assert [g.name for g in pod.spec.scheduling_gates] == [GATE, None]
    assert sorted(r.getMessage().split(":")[1].strip() for r in caplog.records) == [
        "PodSpec.scheduling_gates[]",
        "PodStatus.conditions[]",
    ]


def test_the_model_is_importable_where_miless_controllers_import_it() -> None:
    """Contract: ``miles.utils.workers.k8s_types`` is the same module's classes, not copies."""
    import miles.utils.workers.k8s_types as alias

    public = {name for name in dir(k8s_types) if not name.startswith("_")}
    models = {
        name
        for name in public
        if isinstance(getattr(k8s_types, name), type)
        and issubclass(getattr(k8s_types, name), BaseModel)
        and getattr(k8s_types, name).__module__ == k8s_types.__name__
    }
    assert {"Pod", "PodMetadata", "PodSpec", "PodStatus", "WatchFrame"} <= models
    assert set(alias.__all__) == models
    for name in models:
        assert getattr(alias, name) is getattr(k8s_types, name), name
    assert alias.Pod is Pod


def test_watch_frame_reads_cursor_from_pod_and_bookmark() -> None:
    pod = WatchFrame.model_validate_json(pod_bytes(realistic_pod("p", resource_version="77")))
    bookmark = WatchFrame.model_validate({"kind": "Pod", "metadata": {"resourceVersion": "78"}})
    assert (pod.kind, pod.metadata.name, pod.metadata.resource_version) == ("Pod", "p", "77")
    assert bookmark.metadata.resource_version == "78"
    assert bookmark.code is None


def test_watch_frame_reads_status_code_and_reason() -> None:
    frame = WatchFrame.model_validate_json(pod_bytes(status(410, "Expired", "too old")))
    assert (frame.code, frame.reason, frame.message) == (410, "Expired", "too old")
    assert frame.metadata.resource_version is None


def test_watch_frame_reads_snake_case_and_client_models() -> None:
    as_model = SimpleNamespace(
        kind="Status", code=504, reason="Timeout", message=None, metadata=None
    )
    assert WatchFrame.model_validate(as_model).code == 504
    snake = WatchFrame.model_validate({"metadata": {"resource_version": "9"}})
    assert snake.metadata.resource_version == "9"


@pytest.mark.parametrize(
    "anything",
    ["not json at all", None, 42, [1, 2], {"metadata": "x", "code": "410", "reason": 3}],
)
def test_watch_frame_survives_anything(anything: object) -> None:
    """KA yields a raw str for a non-JSON line: ``WatchFrame`` must read it as 'no cursor'."""
    frame = WatchFrame.model_validate(anything)
    assert frame.metadata.resource_version is None
    assert frame.code is None


def test_adapter_imports_neither_kubernetes_asyncio_nor_aiohttp() -> None:
    """Row ``k8s_api.py``: the loop stays importable without the ``k8s`` extra."""
    code = (
        "import sys\n"
        "import miles.utils.workers.reconcile.k8s_reflector\n"
        "import miles.utils.workers.reconcile.k8s_api\n"
        "import miles.utils.workers.reconcile.k8s_types\n"
        "roots = {'kubernetes_asyncio', 'aiohttp'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in roots))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_reconcile_module_but_k8s_api_names_kubernetes_asyncio_in_an_import() -> None:
    package = Path(k8s_types.__file__).parent
    importers = [
        path.name
        for path in package.glob("*.py")
        if re.search(r"^\s*(from|import)\s+kubernetes_asyncio", path.read_text(), re.M)
    ]
    assert set(importers) <= {"k8s_api.py"}
