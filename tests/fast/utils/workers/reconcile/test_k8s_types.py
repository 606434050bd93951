"""Fast layer: the partial pod models read every wire shape (spec rows ``k8s_types.py``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    PARENT_LABEL,
    pod_bytes,
    realistic_pod,
    status,
)
from miles.utils.workers.reconcile import k8s_types
from miles.utils.workers.reconcile.k8s_types import ContainerState, Pod, WatchFrame


def _snake(value: Any) -> Any:
    renames = {"podIP": "pod_ip"}
    if isinstance(value, dict):
        return {
            renames.get(k) or "".join("_" + c.lower() if c.isupper() else c for c in k): _snake(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def _assert_reads_realistic_pod(pod: Pod) -> None:
    assert pod.metadata.name == "engine-0"
    assert pod.metadata.namespace == "default"
    assert pod.metadata.uid
    assert pod.metadata.resource_version == "1000"
    assert pod.metadata.creation_timestamp is not None
    assert pod.metadata.deletion_timestamp is None
    assert pod.metadata.labels[PARENT_LABEL] == "cell-3"
    assert "miles.io/config-hash" in pod.metadata.annotations
    assert pod.spec.node_name == "gpu-node-17"
    assert pod.status.phase == "Running"
    assert pod.status.pod_ip == "10.244.17.42"
    assert {c.type for c in pod.status.conditions} >= {"Ready", "PodScheduled"}
    (container,) = pod.status.container_statuses
    assert (container.name, container.ready, container.restart_count) == ("engine", True, 2)
    assert container.state.running is not None
    assert container.state.running.started_at is not None
    assert container.last_state == ContainerState()


def test_pod_validates_from_raw_json_bytes() -> None:
    """Row: one model reads the apiserver's camelCase bytes directly."""
    raw = pod_bytes(realistic_pod("engine-0", "cell-3", restart_count=2))
    _assert_reads_realistic_pod(Pod.model_validate_json(raw))


def test_pod_validates_from_camel_case_dict() -> None:
    _assert_reads_realistic_pod(
        Pod.model_validate(realistic_pod("engine-0", "cell-3", restart_count=2))
    )


def test_pod_validates_from_snake_case_dict() -> None:
    snake = _snake(realistic_pod("engine-0", "cell-3", restart_count=2))
    snake["metadata"]["labels"] = {PARENT_LABEL: "cell-3"}
    snake["metadata"]["annotations"] = {"miles.io/config-hash": "x"}
    _assert_reads_realistic_pod(Pod.model_validate(snake))


async def test_pod_validates_from_kubernetes_asyncio_model() -> None:
    """Row: ``from_attributes`` reads a ``V1Pod`` the client deserialized, snake_case attributes."""
    from kubernetes_asyncio.client import ApiClient

    async with ApiClient() as client:
        raw = json.dumps(realistic_pod("engine-0", "cell-3", restart_count=2))
        v1pod = client.deserialize(SimpleNamespace(data=raw), "V1Pod")
    _assert_reads_realistic_pod(Pod.model_validate(v1pod))


def test_none_reads_as_empty_maps_lists_and_objects() -> None:
    """Row: an unset field is dropped; ``None`` becomes ``{}`` / ``[]``."""
    pod = Pod.model_validate_json(
        b'{"metadata":{"name":"p","labels":null,"annotations":null},"spec":null,'
        b'"status":{"conditions":null,"containerStatuses":[{"name":"c","ready":false,'
        b'"restartCount":0,"state":null,"lastState":null}]}}'
    )
    assert pod.metadata.labels == {}
    assert pod.metadata.annotations == {}
    assert pod.spec.node_name is None
    assert pod.status.conditions == []
    assert pod.status.container_statuses[0].state == ContainerState()
    assert Pod.model_validate({"metadata": {"name": "p"}, "status": None}).status.phase is None


def test_unknown_fields_are_ignored_and_models_are_frozen() -> None:
    pod = Pod.model_validate({"metadata": {"name": "p", "futureField": 1}, "surprise": [1]})
    with pytest.raises(ValidationError):
        pod.metadata.name = "q"


@pytest.mark.parametrize(
    ("missing", "pod"),
    [
        ("metadata", {"spec": {}}),
        ("metadata.name", {"metadata": {"namespace": "default"}}),
        (
            "status.containerStatuses.0.ready",
            {
                "metadata": {"name": "p"},
                "status": {"containerStatuses": [{"name": "c", "restartCount": 0}]},
            },
        ),
    ],
)
def test_a_pod_missing_a_required_field_does_not_validate(
    missing: str, pod: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError) as err:
        Pod.model_validate_json(json.dumps(pod))
    assert missing.split(".")[-1] in str(err.value)


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
