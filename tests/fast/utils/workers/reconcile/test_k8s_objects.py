"""Fast layer: objects of any kind decode straight off the bytes into the user's model, a
``DynamicObject`` or a ``PartialObjectMetadata`` (``k8s_objects``, ``k8s_wire.ObjectDecoder``);
an object that does not validate, or has no name, is named and left out (record row
``k8s_objects.py``)."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from miles.utils.workers.reconcile import k8s_objects
from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError
from miles.utils.workers.reconcile.k8s_objects import (
    DynamicObject,
    KubernetesModel,
    KubernetesObject,
    ObjectMeta,
    PartialObjectMetadata,
)
from miles.utils.workers.reconcile.k8s_types import Lenient
from miles.utils.workers.reconcile.k8s_values import ListPage, WatchEvent
from miles.utils.workers.reconcile.k8s_wire import ObjectDecoder


class EnginePoolSpec(KubernetesModel):
    replicas: int
    engine: Lenient[str | None] = None


class EnginePool(KubernetesObject):
    spec: EnginePoolSpec


def _pool(name: str, replicas: Any = 2, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "miles.io/v1alpha1",
        "kind": "EnginePool",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "41",
            "generation": 3,
            "labels": {"app": "x"},
            "finalizers": ["miles.io/cleanup"],
            "ownerReferences": [{"kind": "Job", "name": "j", "uid": "u", "controller": True}],
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            **metadata,
        },
        "spec": {"replicas": replicas, "engine": 7},
        "status": {"ready": 1},
    }


def _list(*items: dict[str, Any]) -> bytes:
    return json.dumps(
        {"kind": "EnginePoolList", "metadata": {"resourceVersion": "50"}, "items": list(items)},
        separators=(",", ":"),
    ).encode()


def _frame(event_type: str, obj: Any) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode()


def test_a_typed_model_reads_metadata_in_both_spellings_and_its_own_fields_leniently() -> None:
    pool = EnginePool.model_validate_json(json.dumps(_pool("a")).encode())
    meta = pool.metadata
    assert (meta.name, meta.namespace, meta.uid, meta.resource_version) == (
        "a",
        "ns",
        "uid-a",
        "41",
    )
    assert (meta.generation, meta.finalizers, meta.labels) == (
        3,
        ["miles.io/cleanup"],
        {"app": "x"},
    )
    assert meta.owner_references[0].controller is True
    assert (pool.api_version, pool.kind, pool.spec.replicas) == (
        "miles.io/v1alpha1",
        "EnginePool",
        2,
    )
    assert pool.spec.engine is None, "a wrong-typed Lenient field reads as absent"
    snake = EnginePool.model_validate(
        {
            "api_version": "miles.io/v1alpha1",
            "metadata": {"name": "a", "resource_version": "9"},
            "spec": {"replicas": 1},
        }
    )
    assert (snake.api_version, snake.metadata.resource_version) == ("miles.io/v1alpha1", "9")
    with pytest.raises(ValidationError):
        pool.spec = EnginePoolSpec(replicas=1)


def test_absent_metadata_reads_as_empty() -> None:
    for doc in ({}, {"metadata": None}):
        assert PartialObjectMetadata.model_validate(doc).metadata == ObjectMeta()


def test_a_dynamic_object_types_its_metadata_and_keeps_the_rest_read_only() -> None:
    obj = DynamicObject.model_validate_json(json.dumps(_pool("a")).encode())
    assert (obj.kind, obj.metadata.name, obj.metadata.generation) == ("EnginePool", "a", 3)
    assert obj["spec"] == {"replicas": 2, "engine": 7}
    assert obj.get("status") == {"ready": 1}
    assert obj.get("absent") is None
    assert set(obj.data) == {"spec", "status"}
    with pytest.raises(TypeError):
        obj.data["spec"] = {}  # type: ignore[index]
    with pytest.raises(ValidationError):
        obj.kind = "Other"


def test_partial_object_metadata_holds_the_metadata_alone() -> None:
    obj = PartialObjectMetadata.model_validate_json(json.dumps(_pool("a")).encode())
    assert obj.metadata.name == "a"
    assert set(obj.model_dump()) == {"api_version", "kind", "metadata"}


@pytest.mark.parametrize("model", [EnginePool, DynamicObject, PartialObjectMetadata])
def test_a_list_body_decodes_with_managed_fields_cut(model: type[KubernetesObject]) -> None:
    decoder = ObjectDecoder(model, kind="EnginePool")
    page, rejects = decoder.decode_list(_list(_pool("a"), _pool("b")))
    assert isinstance(page, ListPage)
    assert rejects == []
    assert [o.metadata.name for o in page.objects] == ["a", "b"]
    assert (page.resource_version, page.continue_token) == ("50", None)


def test_a_list_leaves_out_and_names_what_does_not_validate_or_has_no_name() -> None:
    nameless = _pool("x")
    del nameless["metadata"]["name"]
    decoder = ObjectDecoder(EnginePool, kind="EnginePool")
    page, rejects = decoder.decode_list(_list(_pool("a"), _pool("b", replicas="two"), nameless))
    assert [o.metadata.name for o in page.objects] == ["a"]
    assert [str(r) for r in rejects] == [
        "EnginePool ns/b does not validate: spec.replicas: Input should be a valid integer, "
        "unable to parse string as an integer",
        "EnginePool ns/: metadata.name: absent (it is the object's key)",
    ]
    assert rejects[0].name == "b"


def test_watch_lines_decode_objects_bookmarks_and_errors() -> None:
    decoder = ObjectDecoder(DynamicObject, kind="EnginePool")
    added = decoder.decode_watch_line(_frame("ADDED", _pool("a")))
    assert isinstance(added, WatchEvent)
    assert (added.type, added.resource_version, added.object and added.object["spec"]) == (
        "ADDED",
        "41",
        {"replicas": 2, "engine": 7},
    )
    bookmark = decoder.decode_watch_line(
        _frame("BOOKMARK", {"metadata": {"resourceVersion": "60"}})
    )
    assert (bookmark.type, bookmark.object, bookmark.resource_version) == ("BOOKMARK", None, "60")
    gone = decoder.decode_watch_line(
        _frame("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"})
    )
    assert (gone.type, gone.rejects_cursor, gone.code) == ("ERROR", True, 410)


def test_a_watch_frame_that_does_not_validate_is_named_by_kind_namespace_name_and_field() -> None:
    decoder = ObjectDecoder(EnginePool, kind="EnginePool")
    with pytest.raises(FrameDecodeError) as caught:
        list(
            decoder.decode_watch_read(
                [_frame("MODIFIED", _pool("b", replicas=None))], listing=False
            )
        )
    err = caught.value
    assert (err.name, err.resource_version, err.event_type) == ("b", "41", "MODIFIED")
    assert (
        str(err)
        == "EnginePool ns/b does not validate: spec.replicas: Input should be a valid integer"
    )
    nameless = _pool("x")
    nameless["metadata"]["name"] = ""
    with pytest.raises(FrameDecodeError, match=r"metadata\.name: absent"):
        decoder.decode_watch_line(_frame("ADDED", nameless))


def test_a_streaming_lists_read_decodes_up_to_the_first_bad_line() -> None:
    decoder = ObjectDecoder(EnginePool, kind="EnginePool")
    lines = [_frame("ADDED", _pool("a")), b"{not json", _frame("ADDED", _pool("c"))]
    events = decoder.decode_watch_read(lines, listing=True)
    assert next(events).object.metadata.name == "a"  # type: ignore[union-attr]
    with pytest.raises(FrameDecodeError, match="unreadable watch frame"):
        next(events)


class _Status(KubernetesModel):
    ready_replicas: int = 0
    observed_generation: Lenient[int | None] = None


class _Pool(KubernetesObject):
    status: _Status = _Status()


@pytest.mark.parametrize(
    "status",
    [
        {"readyReplicas": 3, "observedGeneration": 2},
        {"ready_replicas": 3, "observed_generation": 2},
    ],
    ids=["camelCase", "snake_case"],
)
def test_a_user_models_fields_read_both_spellings(status: dict[str, Any]) -> None:
    pool = _Pool.model_validate_json(json.dumps({"status": status}).encode())
    assert (pool.status.ready_replicas, pool.status.observed_generation) == (3, 2)
    assert set(_Status.model_fields) == {"ready_replicas", "observed_generation"}


def _unread(obj: DynamicObject) -> bool:
    return isinstance(k8s_objects._EXTRA_SLOT.__get__(obj, DynamicObject), bytes)


def _eager(item: dict[str, Any]) -> DynamicObject:
    return DynamicObject.model_validate_json(json.dumps(item).encode())


def test_a_listed_dynamic_object_keeps_its_rest_as_bytes_until_first_read() -> None:
    decoder = ObjectDecoder(DynamicObject, kind="EnginePool")
    page, rejects = decoder.decode_list(_list(_pool("a"), _pool("b", replicas=5)))
    a, b = page.objects
    assert rejects == []
    assert (page.resource_version, page.continue_token) == ("50", None)
    assert _unread(a)
    assert _unread(b)
    assert (a.kind, a.metadata.name, a.metadata.labels) == ("EnginePool", "a", {"app": "x"})
    assert _unread(a), "the typed fields are read without parsing the rest"
    assert a["spec"] == {"replicas": 2, "engine": 7}
    assert not _unread(a)
    assert a.get("status") == {"ready": 1}
    assert a.get("absent", 0) == 0
    assert b.data == {"spec": {"replicas": 5, "engine": 7}, "status": {"ready": 1}}
    with pytest.raises(TypeError):
        b.data["spec"] = {}  # type: ignore[index]
    with pytest.raises(ValidationError):
        b.kind = "Other"


@pytest.mark.parametrize(
    "read",
    [
        lambda o: o == _eager(_pool("a")),
        lambda o: _eager(_pool("a")) == o,
        lambda o: pickle.loads(pickle.dumps(o)) == _eager(_pool("a")),
        lambda o: copy.deepcopy(o) == _eager(_pool("a")),
        lambda o: o.model_dump() == _eager(_pool("a")).model_dump(),
        lambda o: o.model_dump_json() == _eager(_pool("a")).model_dump_json(),
        lambda o: repr(o) == repr(_eager(_pool("a"))),
        lambda o: o.model_copy(update={"kind": "K"}).get("spec") == _pool("a")["spec"],
        lambda o: o != _eager(_pool("a", replicas=3)),
    ],
    ids=["eq", "eq-reflected", "pickle", "deepcopy", "dump", "dump-json", "repr", "copy", "ne"],
)
def test_any_first_read_of_a_listed_dynamic_object_sees_the_object_parsed_whole(read: Any) -> None:
    decoder = ObjectDecoder(DynamicObject, kind="EnginePool")
    page, _ = decoder.decode_list(_list(_pool("a"), _pool("b")))
    assert _unread(page.objects[0])
    assert read(page.objects[0])


def test_a_list_not_cut_at_its_items_is_decoded_whole_the_same() -> None:
    """An item whose spec holds an object opening as an item does: the span cut there is not one
    JSON value, and the body is decoded whole."""
    nested = _pool("a")
    child = _pool("c")
    del child["metadata"]["managedFields"]
    nested["spec"]["children"] = [{"x": 1}, child]
    page, _ = ObjectDecoder(DynamicObject, kind="EnginePool").decode_list(_list(nested, _pool("b")))
    assert [o.metadata.name for o in page.objects] == ["a", "b"]
    assert not _unread(page.objects[0])
    assert page.objects[0] == _eager(nested)


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab{}[],:"\\ ', max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@st.composite
def _items(draw: st.DrawFn) -> Any:
    item = _pool(draw(st.sampled_from(["a", "b", ""])))
    for key in draw(st.lists(st.sampled_from(["spec", "status", "metadata", "x", "kind"]))):
        item[key] = draw(_values | st.builds(_pool, st.sampled_from(["n", "m"])))
    return draw(st.sampled_from([item, item, item, None, 7]))


@given(st.lists(_items(), max_size=5))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_dynamic_list_decodes_as_it_does_whole(items: list[Any]) -> None:
    body = json.dumps(
        {"apiVersion": "v", "items": items, "kind": "L", "metadata": {"resourceVersion": "9"}},
        separators=(",", ":"),
    ).encode()
    deferred = ObjectDecoder(DynamicObject, kind="EnginePool")
    whole = ObjectDecoder(DynamicObject, kind="EnginePool")
    whole._deferred = None
    try:
        expected: Any = whole.decode_list(body)
    except FrameDecodeError as err:
        with pytest.raises(FrameDecodeError, match=str(err)):
            deferred.decode_list(body)
        return
    (page, rejects) = deferred.decode_list(body)
    event(f"deferred: {any(_unread(obj) for obj in page.objects)}")
    assert page == expected[0]
    assert [str(r) for r in rejects] == [str(r) for r in expected[1]]


def test_a_watched_dynamic_object_keeps_its_rest_as_bytes_until_first_read() -> None:
    decoder = ObjectDecoder(DynamicObject, kind="EnginePool")
    event = decoder.decode_watch_line(_frame("MODIFIED", _pool("a")) + b"\n")
    obj = event.object
    assert isinstance(obj, DynamicObject)
    assert (event.type, event.resource_version) == ("MODIFIED", "41")
    assert _unread(obj)
    assert obj == _eager(_pool("a"))
    assert not _unread(obj)


def _decoded(decoder: ObjectDecoder[DynamicObject], line: bytes) -> Any:
    try:
        return decoder.decode_watch_line(line)
    except FrameDecodeError as err:
        return (str(err), err.name, err.resource_version, err.event_type)


@given(
    st.sampled_from(["ADDED", "MODIFIED", "DELETED", "MODIFIED", "BOOKMARK", "ERROR", "ADDED2", 5]),
    _items(),
    st.sampled_from(["type first", "type first", "type first", "object first", "extra key"]),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_dynamic_watch_line_decodes_as_it_does_whole(
    event_type: Any, item: Any, layout: str
) -> None:
    pairs = [("type", event_type), ("object", item)]
    if layout == "object first":
        pairs.reverse()
    if layout == "extra key":
        pairs.append(("x", 1))
    line = json.dumps(dict(pairs), separators=(",", ":")).encode()
    deferred = ObjectDecoder(DynamicObject, kind="EnginePool")
    whole = ObjectDecoder(DynamicObject, kind="EnginePool")
    whole._deferred = None
    read = _decoded(deferred, line)
    obj = getattr(read, "object", None)
    event(f"deferred: {isinstance(obj, DynamicObject) and _unread(obj)}")
    assert read == _decoded(whole, line)
