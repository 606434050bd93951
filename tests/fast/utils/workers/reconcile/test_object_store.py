"""Fast layer: ``object_store.py`` rows (Store, Replace() on relist, parent index, key_map)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles.utils.k8s_testenv.testing.k8s_fakes import pod as k8s_pod
from miles.utils.workers.reconcile.object_store import ObjectStore
from miles.utils.workers.reconcile.source_event import DeleteEvent, ReplaceEvent, UpsertEvent
from tests.fast.utils.workers.reconcile.fakes import Pod, delete, parent_of, replace, upsert


def _store() -> ObjectStore:
    return ObjectStore(key_map=parent_of)


def test_row_store_kept_upsert_then_read_back_by_key_and_parent() -> None:
    """Row "Store: Kept, a plain dict": what was upserted is read back without a source."""
    store = _store()
    a, b = Pod("b-pod", "cell-0"), Pod("a-pod", "cell-0")
    assert store.handle_event(upsert(a)) == {"cell-0"}
    assert store.handle_event(upsert(b)) == {"cell-0"}
    assert store.get("b-pod") is a
    assert "a-pod" in store
    assert "missing" not in store
    assert store.get("missing") is None
    assert len(store) == 2
    assert store.get_by_parent("cell-0") == [b, a], "ordered by object key"
    assert store.get_by_parent("cell-1") == []
    assert store.parent_keys() == {"cell-0"}


def test_update_in_place_replaces_the_object_and_drives_its_parent() -> None:
    store = _store()
    store.handle_event(upsert(Pod("p", "cell-0")))
    newer = Pod("p", "cell-0", version=1)
    assert store.handle_event(upsert(newer)) == {"cell-0"}
    assert store.get_by_parent("cell-0") == [newer]
    assert len(store) == 1


def test_key_map_none_makes_every_object_its_own_parent() -> None:
    store = ObjectStore(key_map=None)
    pod = Pod("engine-3")
    assert store.handle_event(upsert(pod)) == {"engine-3"}
    assert store.get_by_parent("engine-3") == [pod]
    assert store.handle_event(delete(pod)) == {"engine-3"}
    assert store.parent_keys() == set()


def test_move_re_drives_both_parents() -> None:
    """Row "EnqueueRequestForOwner": an object whose parent changes drives the old and the new."""
    store = _store()
    store.handle_event(upsert(Pod("p", "cell-0")))
    moved = Pod("p", "cell-1")
    assert store.handle_event(upsert(moved)) == {"cell-0", "cell-1"}
    assert store.get_by_parent("cell-0") == []
    assert store.get_by_parent("cell-1") == [moved]
    assert store.parent_keys() == {"cell-1"}


def test_delete_of_held_key_drives_its_stored_parent() -> None:
    store = _store()
    store.handle_event(upsert(Pod("p", "cell-0")))
    store.handle_event(upsert(Pod("q", "cell-0")))
    assert store.handle_event(delete(Pod("p", "cell-0"))) == {"cell-0"}
    assert "p" not in store
    assert store.parent_keys() == {"cell-0"}
    assert store.handle_event(delete(Pod("q", "cell-0"))) == {"cell-0"}
    assert store.parent_keys() == set(), "a parent with no members left is not listed"


def test_delete_of_unknown_key_drives_the_parent_key_map_names() -> None:
    """Go still calls OnDelete for a key the cache does not hold; the handler maps last_obj."""
    store = _store()
    assert store.handle_event(delete(Pod("ghost", "cell-7"))) == {"cell-7"}
    assert store.handle_event(delete(Pod("orphan", None))) == set()
    assert len(store) == 0


def test_row_key_map_none_evicts_a_stored_copy_and_re_drives_its_old_parent() -> None:
    """Row "EnqueueRequestForOwner ... evicted, not stored": labels that stop mapping evict."""
    store = _store()
    store.handle_event(upsert(Pod("p", "cell-0")))
    store.handle_event(upsert(Pod("q", "cell-0")))
    assert store.handle_event(upsert(Pod("p", None))) == {"cell-0"}
    assert "p" not in store
    assert [pod.name for pod in store.get_by_parent("cell-0")] == ["q"]
    assert store.handle_event(upsert(Pod("never-stored", None))) == set()
    assert "never-stored" not in store


def test_row_key_map_raising_evicts_logs_the_key_and_keeps_every_other_object(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "EnqueueRequestForOwner": a raising key_map evicts with one error naming the key."""

    def picky(pod: Pod) -> str | None:
        if pod.version == 13:
            raise ValueError("unlucky label")
        return pod.parent

    store = ObjectStore(key_map=picky)
    store.handle_event(upsert(Pod("p", "cell-0")))
    store.handle_event(upsert(Pod("q", "cell-1")))
    with caplog.at_level(logging.ERROR):
        assert store.handle_event(upsert(Pod("p", "cell-0", version=13))) == {"cell-0"}
    assert "p" not in store
    assert store.get("q") == Pod("q", "cell-1"), "nothing else is lost"
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert "'p'" in record.getMessage()
    assert "unlucky label" in record.getMessage()


def test_row_replace_on_relist_synthesizes_deletions_and_drives_emptied_parents() -> None:
    """Row "Replace() on relist: Kept, store-side" (AtomicFIFO ReplacedAll): a parent emptied by
    a relist is re-driven, and every parent with a member afterwards is driven too."""
    store = _store()
    for pod in (Pod("a", "cell-0"), Pod("b", "cell-1"), Pod("c", "cell-2"), Pod("d", "cell-3")):
        store.handle_event(upsert(pod))
    fresh_a, moved_c, new_e = Pod("a", "cell-0", 1), Pod("c", "cell-4"), Pod("e", "cell-5")
    affected = store.handle_event(replace(fresh_a, moved_c, new_e))
    assert affected == {"cell-0", "cell-1", "cell-2", "cell-3", "cell-4", "cell-5"}
    assert store.parent_keys() == {"cell-0", "cell-4", "cell-5"}
    assert sorted(store.parent_keys()) == ["cell-0", "cell-4", "cell-5"]
    assert store.get("a") is fresh_a
    assert "b" not in store
    assert "d" not in store
    assert len(store) == 3


def test_replace_with_unmappable_objects_evicts_them_and_drives_their_old_parent() -> None:
    store = _store()
    store.handle_event(upsert(Pod("a", "cell-0")))
    assert store.handle_event(replace(Pod("a", None), Pod("b", None))) == {"cell-0"}
    assert len(store) == 0
    assert store.parent_keys() == set()


def test_empty_replace_clears_the_store_and_drives_every_old_parent() -> None:
    store = _store()
    store.handle_event(upsert(Pod("a", "cell-0")))
    store.handle_event(upsert(Pod("b", "cell-1")))
    assert store.handle_event(ReplaceEvent(objects={})) == {"cell-0", "cell-1"}
    assert len(store) == 0


def test_replace_copies_no_more_than_the_removed_keys() -> None:
    """Replace is O(N) in place: it neither rebuilds the index nor keeps the caller's mapping."""
    store = _store()
    world = {f"p{i}": Pod(f"p{i}", f"cell-{i % 10}") for i in range(1000)}
    store.handle_event(ReplaceEvent(objects=world))
    index_before = store._members
    world.pop("p0")
    store.handle_event(ReplaceEvent(objects=world))
    assert store._members is index_before
    assert len(store) == 999
    assert sys.getrefcount(world) == 2, "the store keeps no reference to the listing"


def test_row_indexer_replaced_get_by_parent_reads_only_that_parents_members() -> None:
    """Row "Indexer: Replaced by a parent index": get_by_parent costs O(members), not O(store)."""
    sorted_inputs: list[int] = []

    class CountingKey(str):
        __slots__ = ()

        def __lt__(self, other: Any) -> bool:
            sorted_inputs.append(1)
            return str.__lt__(self, other)

    store = _store()
    for i in range(5000):
        store.handle_event(UpsertEvent(key=CountingKey(f"bulk-{i:05}"), obj=Pod("x", "bulk")))
    for i in range(3):
        key = CountingKey(f"small-{i}")
        store.handle_event(UpsertEvent(key=key, obj=Pod(key, "small")))
    sorted_inputs.clear()
    assert [pod.name for pod in store.get_by_parent("small")] == ["small-0", "small-1", "small-2"]
    assert len(sorted_inputs) <= 3


def test_handle_event_rejects_what_is_not_a_source_event() -> None:
    with pytest.raises(TypeError, match="not a source event"):
        _store().handle_event("garbage")  # type: ignore[arg-type]


def test_delete_event_for_a_moved_object_is_keyed_by_what_the_store_holds() -> None:
    store = _store()
    store.handle_event(upsert(Pod("p", "cell-0")))
    assert store.handle_event(DeleteEvent(key="p", last_obj=Pod("p", "cell-9"))) == {"cell-0"}


_names = st.sampled_from([f"p{i}" for i in range(6)])
_parents = st.sampled_from([None, "cell-0", "cell-1", "cell-2"])
_pods = st.builds(Pod, name=_names, parent=_parents, version=st.integers(0, 3))
_events = st.one_of(
    st.builds(upsert, _pods),
    st.builds(delete, _pods),
    st.lists(_pods, max_size=6).map(lambda pods: replace(*pods)),
)


def _membership(model: dict[str, Pod]) -> dict[str, dict[str, Pod]]:
    members: dict[str, dict[str, Pod]] = {}
    for key, pod in model.items():
        if pod.parent is not None:
            members.setdefault(pod.parent, {})[key] = pod
    return members


@settings(max_examples=200, deadline=None)
@given(st.lists(_events, max_size=25))
def test_store_matches_a_dict_model_and_reports_every_changed_parent(events: list[Any]) -> None:
    """Property: after any event sequence the store and its parent index equal a plain dict
    model, and the returned parents cover every parent whose members changed."""
    store, model = _store(), dict[str, Pod]()
    for event in events:
        before = _membership(model)
        if isinstance(event, UpsertEvent):
            model[event.key] = event.obj
        elif isinstance(event, DeleteEvent):
            model.pop(event.key, None)
        else:
            model = dict(event.objects)
        model = {key: pod for key, pod in model.items() if pod.parent is not None}
        after = _membership(model)
        affected = store.handle_event(event)
        changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
        assert changed <= affected
        if isinstance(event, ReplaceEvent):
            assert affected == before.keys() | after.keys()
        assert len(store) == len(model)
        assert store.parent_keys() == after.keys()
        for parent, members in after.items():
            assert store.get_by_parent(parent) == [members[key] for key in sorted(members)]


class _Label(str):
    """A ``str`` subclass whose hash and equality a user overrode."""

    def __hash__(self) -> int:
        raise TypeError("no hashing here")


@pytest.mark.parametrize(
    ("bad_parent", "named"),
    [(["cell", 0], "list"), ({"cell": 0}, "dict"), (7, "int"), (("cell", 0), "tuple")],
)
def test_one_object_with_a_bad_parent_key_is_evicted_alone_from_a_replace(
    bad_parent: object, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One unhashable or non-str key used to make the store reject the whole replace,
    so ``start()`` never returned. Now that object alone is left out with one line naming it."""

    def key_map(pod: Pod) -> Any:
        return bad_parent if pod.parent is None else pod.parent

    store = ObjectStore(key_map=key_map)
    store.handle_event(upsert(Pod("bad", "cell-9")))
    with caplog.at_level(logging.ERROR):
        affected = store.handle_event(replace(Pod("a", "cell-0"), Pod("bad"), Pod("b", "cell-1")))
    assert list(affected) == ["cell-9", "cell-0", "cell-1"], "its old parent is re-driven first"
    assert "bad" not in store
    assert store.parent_keys() == {"cell-0", "cell-1"}
    [record] = caplog.records
    assert "'bad'" in record.getMessage()
    assert named in record.getMessage()
    store.handle_event(replace(Pod("a", "cell-0"), Pod("bad"), Pod("b", "cell-1")))
    assert len(caplog.records) == 1, "the same failure is not logged again at the next relist"


def test_a_str_subclass_parent_is_stored_as_a_plain_str() -> None:
    store = ObjectStore(key_map=lambda pod: _Label(pod.parent))
    assert list(store.handle_event(upsert(Pod("p", "cell-0")))) == ["cell-0"]
    assert type(next(iter(store.parent_keys()))) is str


def test_handle_event_still_answers_as_a_set_for_callers_of_the_contract() -> None:
    """The contract's ``set[ParentKey]`` became an ordered ``AbstractSet``: it compares, tests
    membership and combines as a set does."""
    store = _store()
    affected = store.handle_event(replace(Pod("a", "cell-1"), Pod("b", "cell-0")))
    assert affected == {"cell-0", "cell-1"}
    assert "cell-1" in affected
    assert affected | {"x"} == {"cell-0", "cell-1", "x"}
    assert set(affected) - {"cell-0"} == {"cell-1"}
    assert list(affected) == ["cell-1", "cell-0"]
    assert store.handle_event(delete(Pod("nobody", None))) == set()


def test_a_consistency_check_applies_only_the_difference_with_one_warning_of_its_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "consistency check": a check's listing equal to the store by uid and resourceVersion
    wakes no parent and logs nothing; one that differs (a ghost the watch never heard deleted, a
    pod it never heard created, a stale copy) applies only those, with one warning naming the
    counts, and wakes only their parents."""
    store = ObjectStore(key_map=None)
    kept, ghost, old = k8s_pod("kept", "a"), k8s_pod("ghost", "b"), k8s_pod("old", "c")
    store.handle_event(ReplaceEvent({p.metadata.name: p for p in (kept, ghost, old)}))
    caplog.set_level(logging.WARNING)
    same = {p.metadata.name: p for p in (kept, ghost, old)}
    assert not store.handle_event(ReplaceEvent(same, check=True))
    assert caplog.records == []
    missed, fresh = k8s_pod("missed", "d"), k8s_pod("old", "c", resource_version="2000")
    affected = store.handle_event(
        ReplaceEvent({"kept": kept, "missed": missed, "old": fresh}, check=True)
    )
    assert set(affected) == {"ghost", "missed", "old"}
    assert sorted(store.parent_keys()) == ["kept", "missed", "old"]
    assert store.get("old") is fresh
    (line,) = [r.getMessage() for r in caplog.records]
    assert "1 ghosts (e.g. ['ghost'])" in line
    assert "1 missing (e.g. ['missed'])" in line
    assert "1 stale" in line
    assert store.replaces == 1, "a check is not counted as a relist's replace"
