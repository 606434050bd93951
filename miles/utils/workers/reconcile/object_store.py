"""The local cache with a parent index. Go: ``cache.Store`` plus AtomicFIFO's ``ReplacedAll``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ObjectKey,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

logger = logging.getLogger(__name__)

KeyMapFn = Callable[[Any], ParentKey | None]
"""Names the parent an object belongs to, or ``None`` for an object no parent owns."""


class ObjectStore:
    """Objects by key, indexed by the parent ``key_map`` names; ``None`` makes each its own parent.

    ``handle_event`` applies one source event and returns every parent whose members it changed.
    An object ``key_map`` cannot attribute (it returns ``None`` or raises) is not stored, and a
    stored copy of it is evicted so that it is never served under the parent it left.
    """

    def __init__(self, *, key_map: KeyMapFn | None) -> None:
        self._key_map = key_map
        self._parent_of: dict[ObjectKey, ParentKey] = {}
        self._members: dict[ParentKey, dict[ObjectKey, Any]] = {}

    def handle_event(self, event: SourceEvent) -> set[ParentKey]:
        if isinstance(event, UpsertEvent):
            return self._upsert(event.key, event.obj)
        if isinstance(event, DeleteEvent):
            return self._delete(event.key, event.last_obj)
        if isinstance(event, ReplaceEvent):
            return self._replace(event.objects)
        raise TypeError(f"not a source event: {type(event).__name__}")

    def get(self, key: ObjectKey) -> Any | None:
        parent = self._parent_of.get(key)
        return None if parent is None else self._members[parent][key]

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

    def _upsert(self, key: ObjectKey, obj: Any) -> set[ParentKey]:
        parent = self._parent_for(key, obj)
        if parent is None:
            left = self._evict(key)
            return set() if left is None else {left}
        if self._parent_of.get(key) == parent:
            self._members[parent][key] = obj
            return {parent}
        left = self._put(key, obj, parent)
        return {parent} if left is None else {parent, left}

    def _delete(self, key: ObjectKey, last_obj: Any) -> set[ParentKey]:
        left = self._evict(key)
        if left is not None:
            return {left}
        parent = self._parent_for(key, last_obj)
        return set() if parent is None else {parent}

    def _replace(self, objects: Mapping[ObjectKey, Any]) -> set[ParentKey]:
        lost: set[ParentKey] = set()
        for key in [key for key in self._parent_of if key not in objects]:
            lost.add(self._members_remove(key, self._parent_of.pop(key)))
        for key, obj in objects.items():
            parent = self._parent_for(key, obj)
            left = self._evict(key) if parent is None else self._put(key, obj, parent)
            if left is not None:
                lost.add(left)
        lost.update(self._members)
        return lost

    def _parent_for(self, key: ObjectKey, obj: Any) -> ParentKey | None:
        if self._key_map is None:
            return key
        try:
            return self._key_map(obj)
        except Exception as exc:
            logger.error("key_map raised for object %r, so it is not stored: %r", key, exc)
            return None

    def _put(self, key: ObjectKey, obj: Any, parent: ParentKey) -> ParentKey | None:
        """Stores ``obj`` under ``parent``; returns the parent it moved away from, if any."""
        previous = self._parent_of.get(key)
        if previous is not None and previous != parent:
            self._members_remove(key, previous)
        else:
            previous = None
        self._parent_of[key] = parent
        members = self._members.get(parent)
        if members is None:
            self._members[parent] = {key: obj}
        else:
            members[key] = obj
        return previous

    def _evict(self, key: ObjectKey) -> ParentKey | None:
        parent = self._parent_of.pop(key, None)
        return None if parent is None else self._members_remove(key, parent)

    def _members_remove(self, key: ObjectKey, parent: ParentKey) -> ParentKey:
        members = self._members[parent]
        del members[key]
        if not members:
            del self._members[parent]
        return parent
