"""The loop's own state as a frozen snapshot. Go: none in client-go or controller-runtime, which
answer the same questions with metrics and logs; this is what a person or the command line reads.

Every time in a snapshot is a reading of the loop's ``Clock`` (monotonic seconds, a ``FakeClock``'s
in tests), never wall time: ``LoopStatus.taken_at`` is the same clock's reading when the snapshot
was taken, so an age is ``taken_at - t`` and wall time is ``time.time() - (taken_at - t)``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from miles.utils.workers.reconcile.source_event import ParentKey


class SourcePhase(enum.StrEnum):
    """What the source is doing. A Kubernetes reflector moves LISTING → WATCHING, and on
    failure to BACKING_OFF (``SourceStatus.backoff_until``) or RELISTING (``relist_reason``)."""

    STARTING = "starting"
    LISTING = "listing"
    WATCHING = "watching"
    BACKING_OFF = "backing off"
    RELISTING = "relisting"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What a source reports about itself; a source that knows less leaves the rest at defaults.

    ``suspect`` is set by a source that expected to hear from its server (an event or a bookmark)
    within a stated bound and did not: the stream may be silently dead.
    """

    phase: SourcePhase = SourcePhase.STARTING
    phase_since: float | None = None
    cursor: str | None = None
    backoff_until: float | None = None
    relist_reason: str | None = None
    last_event_at: float | None = None
    last_bookmark_at: float | None = None
    events: int = 0
    """Watch events received: the objects' changes the stream delivered after its listings (not
    the listings, not bookmarks), whether or not the store could apply them."""
    lists: int = 0
    """Listings requested (a LIST or a streaming list), the first and every relist, failed ones
    included; a source that reports nothing counts the listings its stream delivered."""
    watches: int = 0
    watch_restarts: int = 0
    relists: Mapping[str, int] = field(default_factory=dict)
    """Relists after the first LIST, by reason (e.g. ``"expired"``, ``"watch failed"``)."""
    last_error: str | None = None
    last_error_at: float | None = None
    suspect: bool = False

    @property
    def watch_events_received(self) -> int:
        """``events`` by what it counts."""
        return self.events

    @property
    def listings_requested(self) -> int:
        """``lists`` by what it counts."""
        return self.lists


@runtime_checkable
class StatusReporter(Protocol):
    """Optional capability of a source: ``ReconcileLoop`` finds it on the ``source`` callable or,
    for a bound method such as ``reflector.watch``, on the object it is bound to."""

    def source_status(self) -> SourceStatus: ...


@dataclass(frozen=True, slots=True)
class RetryStatus:
    """A parent waiting for a retry after ``failures`` failed reconciles in a row."""

    parent: ParentKey
    failures: int
    next_attempt_at: float
    last_error: str


@dataclass(frozen=True, slots=True)
class ReconcileInFlight:
    """A reconcile a worker is running now, since ``started_at``; ``slow`` once it has run
    longer than the loop's ``slow_reconcile_after`` (and been logged for it, once)."""

    parent: ParentKey
    started_at: float
    slow: bool = False


@dataclass(frozen=True, slots=True)
class WatchStatus:
    """One watched source of a loop (``LoopStatus.sources``): its ``name``, whether its cache
    synced, its ``SourceStatus``, and what its store applied and holds."""

    name: str
    synced: bool
    source: SourceStatus
    listings_applied: int = 0
    watch_events_applied: int = 0
    objects_stored: int = 0


@dataclass(frozen=True, slots=True)
class LoopStatus:
    """One snapshot of a ``ReconcileLoop``: ``ReconcileLoop.status()``.

    What the store applied is counted by kind, so no two counts read as a contradiction (a fresh
    loop has applied one listing and no watch event): ``listings_applied`` (each ``ReplaceEvent``
    counts one, however many objects it holds), ``watch_events_applied`` (upserts and deletes),
    and ``objects_stored``, the objects the store holds. ``events_applied``, the older name, is
    the first two together.

    A loop with several sources (``sources=[Watch(...), ...]``) reports each in ``sources``, in
    the order given; ``source`` and the counts above are then its first source's, and ``synced``
    is true once every source has synced. A one-source loop's ``sources`` holds that one.
    """

    name: str
    taken_at: float
    synced: bool
    source: SourceStatus
    events_applied: int = 0
    """Source events the store applied, listings included: ``listings_applied`` plus
    ``watch_events_applied`` (kept under its first name)."""
    reconciles: int = 0
    reconcile_failures: int = 0
    queue_depth: int = 0
    retries: tuple[RetryStatus, ...] = ()
    in_flight: ReconcileInFlight | None = None
    """The oldest reconcile in flight (with one worker, the one), ``None`` between them."""
    reconcile_timeouts: int = 0
    stopped: bool = False
    error: str | None = None
    """Why the loop stopped on its own (a task of it died), one line; ``None`` while it serves."""
    listings_applied: int = 0
    """Listings the store applied (``ReplaceEvent``s: the first and every relist)."""
    watch_events_applied: int = 0
    """Watch events the store applied (upserts and deletes); ``source.events`` were received."""
    objects_stored: int = 0
    """Objects the store holds when the snapshot is taken."""
    in_flight_all: tuple[ReconcileInFlight, ...] = ()
    """Every reconcile in flight, oldest first: one per busy worker."""
    max_concurrent_reconciles: int = 1
    """The loop's workers."""
    terminal_failures: int = 0
    """Reconciles that raised ``TerminalError``: counted in ``reconcile_failures`` too, and not
    retried."""
    sources: tuple[WatchStatus, ...] = ()
    """Each watched source, in the order given (the one source of a one-source loop)."""
