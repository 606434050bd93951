"""The reflector-to-loop wire format. Go: ``watch.Event`` plus ``cache.Store``'s write methods."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

ObjectKey = str
ParentKey = str


@dataclass(frozen=True, slots=True)
class UpsertEvent:
    """An object was added or changed: ``Store.Add`` / ``Store.Update``."""

    key: ObjectKey
    obj: Any


@dataclass(frozen=True, slots=True)
class DeleteEvent:
    """An object is gone; ``last_obj`` is its final state as the source last saw it."""

    key: ObjectKey
    last_obj: Any


@dataclass(frozen=True, slots=True)
class ReplaceEvent:
    """The whole world as of one consistent listing: ``Store.Replace`` / ``ReplacedAll``.

    Keys absent from ``objects`` are gone; the store synthesizes their deletions.
    ``check``: the listing is a consistency check (``KubernetesReflector``'s
    ``consistency_check_period``): a store that can compares it by uid and resourceVersion and
    applies only the difference; replacing the whole world is also correct.
    """

    objects: Mapping[ObjectKey, Any]
    check: bool = False


SourceEvent = UpsertEvent | DeleteEvent | ReplaceEvent
SOURCE_EVENT_TYPES = (UpsertEvent, DeleteEvent, ReplaceEvent)

SourceWatchFn = Callable[[], AsyncIterator[SourceEvent]]
"""Each call opens a new stream, which must open with a ``ReplaceEvent`` of the whole world."""
