"""Fast layer: ``controllerutil/owner_references.py`` against controller-runtime's
``SetControllerReference`` / ``SetOwnerReference`` rules."""

from __future__ import annotations

from typing import Any

import pytest

from miles.utils.workers.reconcile.controllerutil import (
    AlreadyOwnedError,
    controller_of,
    set_controller_reference,
    set_owner_reference,
)


def _obj(kind: str, name: str, namespace: str | None = "ns", uid: str = "", api: str = "v1") -> Any:
    metadata: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": api, "kind": kind, "metadata": metadata}


POOL_API = "miles.example.com/v1"


def test_a_controller_reference_sets_both_flags_and_names_the_owner() -> None:
    pool, pod = _obj("EnginePool", "pool-a", api=POOL_API), _obj("Pod", "pool-a-0")
    set_controller_reference(pool, pod)
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": POOL_API,
            "kind": "EnginePool",
            "name": "pool-a",
            "uid": "uid-pool-a",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_setting_it_again_replaces_the_reference_even_across_versions_and_uids() -> None:
    pod = _obj("Pod", "pool-a-0")
    set_controller_reference(_obj("EnginePool", "pool-a", api=POOL_API), pod)
    again = _obj("EnginePool", "pool-a", uid="uid-new", api="miles.example.com/v2")
    set_controller_reference(again, pod)
    (ref,) = pod["metadata"]["ownerReferences"]
    assert (ref["apiVersion"], ref["uid"]) == ("miles.example.com/v2", "uid-new")


def test_another_controller_is_named_by_the_error() -> None:
    pod = _obj("Pod", "pool-a-0")
    set_controller_reference(_obj("EnginePool", "pool-a", api=POOL_API), pod)
    with pytest.raises(AlreadyOwnedError) as raised:
        set_controller_reference(_obj("EnginePool", "pool-b", api=POOL_API), pod)
    assert str(raised.value) == (
        "Object ns/pool-a-0 is already owned by another EnginePool controller pool-a"
    )
    assert raised.value.owner.name == "pool-a"
    assert len(pod["metadata"]["ownerReferences"]) == 1


def test_a_plain_owner_reference_has_no_flags_and_keeps_the_controller() -> None:
    pod = _obj("Pod", "pool-a-0")
    set_controller_reference(_obj("EnginePool", "pool-a", api=POOL_API), pod)
    set_owner_reference(_obj("ConfigMap", "settings"), pod)
    refs = pod["metadata"]["ownerReferences"]
    assert refs[1] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "settings",
        "uid": "uid-settings",
    }
    controller = controller_of(pod)
    assert controller is not None
    assert controller.name == "pool-a"


@pytest.mark.parametrize(
    ("owner_ns", "obj_ns", "message"),
    [
        ("other", "ns", "cross-namespace owner references are disallowed"),
        ("ns", None, "cluster-scoped resource must not have a namespace-scoped owner"),
    ],
)
def test_owners_the_garbage_collector_cannot_honour_are_refused(
    owner_ns: str, obj_ns: str | None, message: str
) -> None:
    owner, obj = _obj("EnginePool", "pool-a", owner_ns, api=POOL_API), _obj("Node", "n1", obj_ns)
    for setter in (set_controller_reference, set_owner_reference):
        with pytest.raises(ValueError, match=message):
            setter(owner, obj)
    assert "ownerReferences" not in obj["metadata"]


def test_a_cluster_scoped_owner_may_own_a_namespaced_object() -> None:
    node, pod = _obj("Node", "n1", None), _obj("Pod", "p")
    set_controller_reference(node, pod)
    assert controller_of(pod) is not None


def test_an_owner_without_a_uid_is_refused_naming_the_field() -> None:
    owner = _obj("EnginePool", "pool-a", api=POOL_API)
    del owner["metadata"]["uid"]
    with pytest.raises(ValueError, match=r"ns/pool-a has no metadata\.uid"):
        set_controller_reference(owner, _obj("Pod", "p"))
