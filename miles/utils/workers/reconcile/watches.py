"""Several watched sources feeding one loop, each with its own key map and cache.
Go: controller-runtime's ``Controller.Watch`` (builder ``For``/``Owns``/``Watches``).

A ``Watch`` names one source of a ``ReconcileLoop(sources=[...])``: the ``SourceWatchFn`` whose
events fill its own ``ObjectStore``, the ``key_map`` naming the parents its objects belong to,
and a ``name`` its cache and status are read by. ``SourceSet`` keeps one
``SourceStreamDriver`` per watch running; every watch's affected parents go to the one queue.
Each driver applies its own events to its own store, so a ``key_map`` that raises for one source
costs that object alone (one error line, as in a single-source loop) and never stalls the others.

Parent keys are plain strings that every watch's ``key_map`` must agree on: a loop whose sources
span namespaces keys parents ``namespace/name`` (the reflector's keys across namespaces,
``owner_key_map``'s default), one within a namespace by the name alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any, Protocol

from miles.utils.workers.reconcile.clock import Clock
from miles.utils.workers.reconcile.object_store import KeyMapFn, ObjectStore
from miles.utils.workers.reconcile.source_event import ObjectKey, ParentKey, SourceWatchFn
from miles.utils.workers.reconcile.source_stream_driver import SourceStreamDriver
from miles.utils.workers.reconcile.status import SourceStatus, StatusReporter, WatchStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class Watch:
    """One source of a loop: ``source`` (e.g. ``KubernetesReflector(...).watch``), ``key_map``
    (``None``: each object is its own parent; ``owner_key_map(...)`` for owned children) and
    ``name`` (``None``: the source's ``.name``, else ``source-N`` by its place), which
    ``ReconcileLoop.cache(name)`` and ``WatchStatus.name`` read."""

    source: SourceWatchFn
    key_map: KeyMapFn | None = None
    name: str | None = None


class CacheReader(Protocol):
    """What a loop's cache answers (an ``ObjectStore`` read-only)."""

    def get(self, key: ObjectKey) -> Any | None: ...

    def get_by_parent(self, parent: ParentKey) -> list[Any]: ...

    def parent_keys(self) -> set[ParentKey]: ...

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class _Watched:
    name: str
    store: ObjectStore
    driver: SourceStreamDriver
    reporter: StatusReporter | None


class SourceSet:
    """Runs one ``SourceStreamDriver`` per ``Watch``, each into its own store; the loop reads it
    as it reads a single driver (``run``, ``wait_for_sync`` once every source synced, the first
    source's counts), plus ``cache(name)`` and ``statuses()`` for each."""

    def __init__(
        self,
        *,
        watches: Sequence[Watch],
        on_affected: Callable[[AbstractSet[ParentKey]], None],
        retry_delay: float,
        clock: Clock,
        name: str,
        reporter_of: Callable[[object], StatusReporter | None],
    ) -> None:
        self._clock = clock
        self._watched: list[_Watched] = []
        for index, watch in enumerate(watches):
            self._watched.append(
                self._build(watch, index, on_affected, retry_delay, name, reporter_of)
            )

    def _build(
        self,
        watch: Watch,
        index: int,
        on_affected: Callable[[AbstractSet[ParentKey]], None],
        retry_delay: float,
        loop_name: str,
        reporter_of: Callable[[object], StatusReporter | None],
    ) -> _Watched:
        name = watch_name(watch, index)
        if any(other.name == name for other in self._watched):
            raise ValueError(f"two watches of loop {loop_name!r} are named {name!r}")
        log_name = f"{loop_name}/{name}"
        store = ObjectStore(key_map=watch.key_map, name=log_name)
        driver = SourceStreamDriver(
            source=watch.source,
            store=store,
            on_affected=on_affected,
            retry_delay=retry_delay,
            clock=self._clock,
            name=log_name,
        )
        return _Watched(name, store, driver, reporter_of(watch.source))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(watched.name for watched in self._watched)

    def cache(self, name: str | None = None) -> ObjectStore:
        if name is None:
            return self._watched[0].store
        for watched in self._watched:
            if watched.name == name:
                return watched.store
        raise KeyError(f"no watch named {name!r}; the watches are {list(self.names)}")

    def stores(self) -> Iterable[ObjectStore]:
        return (watched.store for watched in self._watched)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for watched in self._watched:
                group.create_task(watched.driver.run(), name=f"source-driver-{watched.name}")

    async def wait_for_sync(self) -> None:
        for watched in self._watched:
            await watched.driver.wait_for_sync()

    @property
    def synced(self) -> bool:
        return all(watched.driver.synced for watched in self._watched)

    @property
    def _first(self) -> SourceStreamDriver:
        return self._watched[0].driver

    @property
    def events_applied(self) -> int:
        return self._first.events_applied

    @property
    def listings_applied(self) -> int:
        return self._first.listings_applied

    @property
    def watch_events_applied(self) -> int:
        return self._first.watch_events_applied

    def source_status(self) -> SourceStatus:
        return self._first.source_status()

    def sample(self, now: float) -> None:
        for watched in self._watched:
            watched.driver.sample(now)

    async def aclose(self) -> None:
        for watched in self._watched:
            await watched.driver.aclose()

    def statuses(self) -> tuple[WatchStatus, ...]:
        return tuple(_status_of(watched, self._clock) for watched in self._watched)


def watch_name(watch: Watch, index: int) -> str:
    if watch.name is not None:
        if not isinstance(watch.name, str) or not watch.name:
            raise ValueError(f"a Watch's name must be a non-empty str, got {watch.name!r}")
        return watch.name
    for candidate in (watch.source, getattr(watch.source, "__self__", None)):
        found = getattr(candidate, "name", None)
        if isinstance(found, str) and found:
            return found
    return f"source-{index}"


def watch_status(
    name: str,
    driver: SourceStreamDriver,
    store: ObjectStore,
    reporter: StatusReporter | None,
    clock: Clock,
) -> WatchStatus:
    """One source's line of ``LoopStatus.sources``: its own report if it gives one (one that
    raises reads as the driver's, with the error), else what its driver saw."""
    source = driver.source_status()
    if reporter is not None:
        try:
            source = reporter.source_status()
        except Exception as exc:
            source = replace(
                source, last_error=f"source_status() raised {exc!r}", last_error_at=clock.time()
            )
    return WatchStatus(
        name=name,
        synced=driver.synced,
        source=source,
        listings_applied=driver.listings_applied,
        watch_events_applied=driver.watch_events_applied,
        objects_stored=len(store),
    )


def _status_of(watched: _Watched, clock: Clock) -> WatchStatus:
    return watch_status(watched.name, watched.driver, watched.store, watched.reporter, clock)
