"""The local cache with a parent index. Go: ``cache.Store`` plus AtomicFIFO's ``ReplacedAll``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from miles.utils.workers.reconcile.log import NamedLogger, describe
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ObjectKey,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

logger = logging.getLogger(__name__)

KeyMapFn = Callable[[Any], ParentKey | Collection[ParentKey] | None]
"""Names the parent an object belongs to, or ``None`` for an object no parent owns; or several
parents (a set, tuple or list of keys, as controller-runtime's ``MapFunc`` returns several
requests): the object is then a member of each, and an event on it affects each."""

_Parents = ParentKey | tuple[ParentKey, ...]
"""Where the store holds one object: a key, or a sorted tuple of two or more."""

Affected = AbstractSet[ParentKey]
"""The parents one event affected: a set that iterates in a fixed order (a ``set`` of one, else
a dict's keys view)."""

_NONE: Affected = frozenset()


class ObjectStore:
    """Objects by key, indexed by the parent ``key_map`` names; ``None`` makes each its own parent.

    ``handle_event`` applies one source event and returns every parent whose members it changed,
    as a set whose iteration order is fixed: a move yields the old parent before the new; a
    replace yields the parents that lost an object first (to a deletion, in the order the store
    held those objects, then to a move, in listing order), then every parent with a member, in
    the order the store's parent index holds them (the order in which each last gained a first
    member): all of it a function of the events applied, never of hashing.
    An object ``key_map`` cannot attribute is not stored, and a stored copy of it is evicted so
    that it is never served under the parent it left: ``None`` (or no key at all) silently, and a
    raise or anything but a ``str`` or a collection of them with one error line naming the object
    (once until its reason changes). An object with several parents is a member of each (held in
    key order); an update affects the parents it left, then every parent it has.
    """

    def __init__(self, *, key_map: KeyMapFn | None, name: str = "reconcile") -> None:
        self._key_map = key_map
        self._log = NamedLogger(logger, name)
        self._parent_of: dict[ObjectKey, _Parents] = {}
        self._members: dict[ParentKey, dict[ObjectKey, Any]] = {}
        self._unmappable: dict[ObjectKey, str] = {}
        self.replaces = 0
        """Whole-world replaces applied so far."""

    def handle_event(self, event: SourceEvent) -> Affected:
        if isinstance(event, UpsertEvent):
            return self._upsert(event.key, event.obj)
        if isinstance(event, DeleteEvent):
            return self._delete(event.key, event.last_obj)
        if isinstance(event, ReplaceEvent):
            return self._check(event.objects) if event.check else self._replace(event.objects)
        raise TypeError(f"not a source event: {type(event).__name__}")

    def get(self, key: ObjectKey) -> Any | None:
        parent = self._parent_of.get(key)
        if parent is None:
            return None
        return self._members[parent if parent.__class__ is str else parent[0]][key]

    def get_by_parent(self, parent: ParentKey) -> list[Any]:
        members = self._members.get(parent)
        if not members:
            return []
        return [members[key] for key in sorted(members)]

    def parent_keys(self) -> set[ParentKey]:
        return set(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._parent_of

    def __len__(self) -> int:
        return len(self._parent_of)

    def _upsert(self, key: ObjectKey, obj: Any) -> Affected:
        parent = self._parent_for(key, obj)
        if parent is None:
            return _affected(self._evict(key))
        previous = self._parent_of.get(key)
        if parent.__class__ is not str or previous.__class__ is tuple:
            return self._upsert_several(key, obj, previous, parent)
        assert isinstance(parent, str)
        if previous == parent:
            self._members[parent][key] = obj
            return {parent}
        self._parent_of[key] = parent
        members = self._members.get(parent)
        if members is None:
            self._members[parent] = {key: obj}
        else:
            members[key] = obj
        if previous is None:
            return {parent}
        assert isinstance(previous, str)
        self._members_remove(key, previous)
        return {previous: None, parent: None}.keys()

    def _upsert_several(
        self, key: ObjectKey, obj: Any, previous: _Parents | None, parents: _Parents
    ) -> Affected:
        """An upsert where the object has, or had, several parents: the parents it left, then
        every parent it has."""
        affected = dict.fromkeys(self._place(key, obj, previous, parents))
        affected.update(dict.fromkeys(_each(parents)))
        return affected.keys()

    def _place(
        self, key: ObjectKey, obj: Any, previous: _Parents | None, parents: _Parents
    ) -> list[ParentKey]:
        """Holds ``obj`` under each of ``parents``; returns the parents of ``previous`` it left."""
        self._parent_of[key] = parents
        members_of = self._members
        for parent in _each(parents):
            members = members_of.get(parent)
            if members is None:
                members_of[parent] = {key: obj}
            else:
                members[key] = obj
        if previous is None or previous == parents:
            return []
        kept = _each(parents)
        return [
            self._members_remove(key, parent) for parent in _each(previous) if parent not in kept
        ]

    def _delete(self, key: ObjectKey, last_obj: Any) -> Affected:
        left = self._evict(key)
        parent = left if left is not None else self._parent_for(key, last_obj)
        if self._unmappable:
            self._unmappable.pop(key, None)
        return _affected(parent)

    def _replace(self, objects: Mapping[ObjectKey, Any]) -> Affected:
        affected: dict[ParentKey, None] = {}
        for key in [key for key in self._parent_of if key not in objects]:
            affected.update(dict.fromkeys(self._remove_all(key, self._parent_of.pop(key))))
        for key in [key for key in self._unmappable if key not in objects]:
            del self._unmappable[key]
        parent_for, parent_of, members_of = self._parent_for, self._parent_of, self._members
        for key, obj in objects.items():
            parent = parent_for(key, obj)
            if parent is None:
                affected.update(dict.fromkeys(_affected(self._evict(key))))
                continue
            previous = parent_of.get(key)
            if parent.__class__ is not str or previous.__class__ is tuple:
                affected.update(dict.fromkeys(self._place(key, obj, previous, parent)))
                continue
            assert isinstance(parent, str)
            parent_of[key] = parent
            members = members_of.get(parent)
            if members is None:
                members_of[parent] = {key: obj}
            else:
                members[key] = obj
            if previous is not None and previous != parent:
                assert isinstance(previous, str)
                affected[self._members_remove(key, previous)] = None
        affected.update(dict.fromkeys(self._members))
        self.replaces += 1
        return affected.keys()

    def _check(self, objects: Mapping[ObjectKey, Any]) -> Affected:
        """A consistency check's listing: compared with the store by uid and resourceVersion, and
        only the difference applied, with one warning naming its counts; nothing when equal, so
        a check wakes no parent of a store that was right."""
        ghosts = [key for key in self._parent_of if key not in objects]
        missing: list[ObjectKey] = []
        stale: list[ObjectKey] = []
        for key, obj in objects.items():
            held = self.get(key)
            if held is None:
                if key not in self._unmappable and self._parent_for(key, obj) is not None:
                    missing.append(key)
            elif _version(held) != _version(obj):
                stale.append(key)
        if not (ghosts or missing or stale):
            return _NONE
        self._log.warning(
            "consistency check: the store differed from a fresh LIST: %d ghosts (e.g. %s), "
            "%d missing (e.g. %s), %d stale; applying the LIST's",
            len(ghosts),
            ghosts[:3],
            len(missing),
            missing[:3],
            len(stale),
        )
        affected: dict[ParentKey, None] = {}
        for key in ghosts:
            affected.update(dict.fromkeys(self._delete(key, self.get(key))))
        for key in missing + stale:
            affected.update(dict.fromkeys(self._upsert(key, objects[key])))
        return affected.keys()

    def _parent_for(self, key: ObjectKey, obj: Any) -> _Parents | None:
        """The one parent resolution: ``key_map``'s answer checked, the object's own key without
        one; a raise or an answer neither a ``str`` nor a collection of them is logged once and
        reads as ``None``."""
        if self._key_map is None:
            return key
        try:
            parent = self._key_map(obj)
        except Exception as exc:
            return self._unmapped(key, f"key_map raised {exc!r}")
        if parent.__class__ is not str:
            return self._checked(key, parent)
        if self._unmappable:
            self._unmappable.pop(key, None)
        return parent

    def _checked(self, key: ObjectKey, parent: object) -> _Parents | None:
        """A ``key_map`` result that is not exactly a ``str``: ``None``, ``str`` subclasses and
        collections of ``str`` are fine (none, one or several parents), anything else cannot be a
        parent key."""
        if parent is None:
            if self._unmappable:
                self._unmappable.pop(key, None)
            return None
        if isinstance(parent, str):
            return str.__str__(parent)
        if isinstance(parent, Collection) and not isinstance(parent, (bytes, Mapping)):
            keys = list(parent)
            if all(isinstance(one, str) for one in keys):
                if self._unmappable:
                    self._unmappable.pop(key, None)
                return _normalized(sorted({str.__str__(one) for one in keys}))
        return self._unmapped(
            key, f"key_map returned {describe(parent, 80)}, not a str or a collection of str"
        )

    def _unmapped(self, key: ObjectKey, reason: str) -> ParentKey | None:
        self._reject(key, reason)
        return None

    def _reject(self, key: ObjectKey, reason: str) -> None:
        if self._unmappable.get(key) != reason:
            self._unmappable[key] = reason
            self._log.error("object %r is not stored (evicted if held): %s", key, reason)

    def _evict(self, key: ObjectKey) -> _Parents | None:
        parents = self._parent_of.pop(key, None)
        if parents is None:
            return None
        self._remove_all(key, parents)
        return parents

    def _remove_all(self, key: ObjectKey, parents: _Parents) -> tuple[ParentKey, ...]:
        return tuple(self._members_remove(key, parent) for parent in _each(parents))

    def _members_remove(self, key: ObjectKey, parent: ParentKey) -> ParentKey:
        members = self._members[parent]
        del members[key]
        if not members:
            del self._members[parent]
        return parent


def _each(parents: _Parents) -> tuple[ParentKey, ...]:
    return (parents,) if isinstance(parents, str) else parents


def _affected(parents: _Parents | None) -> Affected:
    if parents is None:
        return _NONE
    if isinstance(parents, str):
        return {parents}
    return dict.fromkeys(parents).keys()


def _normalized(keys: list[ParentKey]) -> _Parents | None:
    if not keys:
        return None
    return keys[0] if len(keys) == 1 else tuple(keys)


def _version(obj: Any) -> tuple[Any, Any]:
    """An object's uid and resourceVersion, what a consistency check compares."""
    meta = getattr(obj, "metadata", None)
    return getattr(meta, "uid", None), getattr(meta, "resource_version", None)
