"""Fast layer: ``owner_key_map`` (controller-runtime's ``EnqueueRequestForOwner``) and the store's
several parents per object it relies on."""

from __future__ import annotations

from typing import Any

import pytest

from miles.utils.workers.reconcile.k8s_objects import PartialObjectMetadata
from miles.utils.workers.reconcile.object_store import ObjectStore
from miles.utils.workers.reconcile.owner_key_map import owner_key_map
from miles.utils.workers.reconcile.resource import NODES, Resource
from miles.utils.workers.reconcile.source_event import DeleteEvent, ReplaceEvent, UpsertEvent

POOLS = Resource.custom(
    group="miles.dev", version="v1alpha1", plural="enginepools", kind="EnginePool"
)


def _ref(
    name: str,
    *,
    kind: str = "EnginePool",
    api_version: str = "miles.dev/v1alpha1",
    controller: bool | None = None,
) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": "u-" + name,
    }
    if controller is not None:
        ref["controller"] = controller
    return ref


def _child(name: str, *refs: dict[str, Any], namespace: str = "ns") -> PartialObjectMetadata:
    return PartialObjectMetadata.model_validate(
        {"metadata": {"name": name, "namespace": namespace, "ownerReferences": list(refs)}}
    )


def test_the_controller_owner_of_the_kind_keyed_namespace_slash_name() -> None:
    key_map = owner_key_map(POOLS)
    child = _child("p", _ref("other", controller=False), _ref("pool-a", controller=True))
    assert key_map(child) == "ns/pool-a"
    assert owner_key_map(POOLS, key="name")(child) == "pool-a"


def test_version_and_uid_are_ignored_group_and_kind_are_not() -> None:
    key_map = owner_key_map(POOLS)
    assert key_map(_child("p", _ref("a", api_version="miles.dev/v9", controller=True))) == "ns/a"
    assert (
        key_map(_child("p", _ref("a", api_version="other.dev/v1alpha1", controller=True))) is None
    )
    assert key_map(_child("p", _ref("a", kind="Deployment", controller=True))) is None
    assert key_map(_child("p", _ref("a", api_version="v1", controller=True))) is None


def test_only_the_first_controller_reference_counts_unless_every_owner() -> None:
    child = _child("p", _ref("a"), _ref("b", controller=True), _ref("c"))
    assert owner_key_map(POOLS)(child) == "ns/b"
    assert owner_key_map(POOLS)(_child("p", _ref("a"), _ref("c"))) is None
    assert owner_key_map(POOLS, every_owner=True)(child) == frozenset({"ns/a", "ns/b", "ns/c"})


def test_a_cluster_scoped_owner_is_keyed_by_name_and_mappings_are_read_too() -> None:
    ref = _ref("node-1", kind="Node", api_version="v1", controller=True)
    child = {"metadata": {"name": "p", "namespace": "ns", "ownerReferences": [ref]}}
    assert owner_key_map(NODES)(child) == "node-1"
    assert owner_key_map(POOLS)({"metadata": {"name": "p"}}) is None
    assert owner_key_map(POOLS)({}) is None


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="key must be"):
        owner_key_map(POOLS, key="uid")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Resource"):
        owner_key_map("EnginePool")  # type: ignore[arg-type]


def test_a_change_of_owner_wakes_the_old_owner_and_the_new() -> None:
    store = ObjectStore(key_map=owner_key_map(POOLS))
    store.handle_event(UpsertEvent("p", _child("p", _ref("a", controller=True))))
    moved = _child("p", _ref("b", controller=True))
    assert list(store.handle_event(UpsertEvent("p", moved))) == ["ns/a", "ns/b"]
    assert store.get_by_parent("ns/a") == []
    assert store.get_by_parent("ns/b") == [moved]


def test_a_child_of_several_owners_is_a_member_of_each_and_wakes_each() -> None:
    store = ObjectStore(key_map=owner_key_map(POOLS, every_owner=True))
    both = _child("p", _ref("b"), _ref("a"))
    assert list(store.handle_event(UpsertEvent("p", both))) == ["ns/a", "ns/b"]
    assert store.get_by_parent("ns/a") == [both] == store.get_by_parent("ns/b")
    assert store.get("p") is both
    assert len(store) == 1
    updated = _child("p", _ref("b"), _ref("c"))
    assert list(store.handle_event(UpsertEvent("p", updated))) == ["ns/a", "ns/b", "ns/c"]
    assert store.parent_keys() == {"ns/b", "ns/c"}
    only_c = _child("p", _ref("c"))
    assert list(store.handle_event(UpsertEvent("p", only_c))) == ["ns/b", "ns/c"]
    back = _child("p", _ref("c"), _ref("d"))
    assert list(store.handle_event(UpsertEvent("p", back))) == ["ns/c", "ns/d"]
    assert list(store.handle_event(DeleteEvent("p", back))) == ["ns/c", "ns/d"]
    assert store.parent_keys() == set()
    assert len(store) == 0


def test_a_replace_moves_children_of_several_owners_and_reports_lost_parents() -> None:
    store = ObjectStore(key_map=owner_key_map(POOLS, every_owner=True))
    store.handle_event(
        ReplaceEvent({"p": _child("p", _ref("a"), _ref("b")), "q": _child("q", _ref("a"))})
    )
    assert store.parent_keys() == {"ns/a", "ns/b"}
    affected = store.handle_event(ReplaceEvent({"p": _child("p", _ref("c"))}))
    assert set(affected) == {"ns/a", "ns/b", "ns/c"}
    assert store.parent_keys() == {"ns/c"}
    assert list(store.handle_event(UpsertEvent("p", _child("p")))) == ["ns/c"], "no owner: evicted"
    assert len(store) == 0


def test_a_collection_holding_a_non_str_is_refused_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = ObjectStore(key_map=lambda obj: {"a", 3})  # type: ignore[arg-type]
    assert store.handle_event(UpsertEvent("p", object())) == frozenset()
    assert "not a str or a collection of str" in caplog.text
    empty = ObjectStore(key_map=lambda obj: ())
    assert empty.handle_event(UpsertEvent("p", object())) == frozenset()
    assert len(empty) == 0
