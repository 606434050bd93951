"""The loop's ``LoopStatus`` as a person reads it: the watch view's status line, and the ``status``
command's text and JSON. Go: none (client-go answers with metrics and klog lines).

Times in a ``LoopStatus`` are readings of the loop's clock; they are shown as local wall time
(``HH:MM:SS local``), converted through the snapshot's own ``taken_at``.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from miles.utils.workers.reconcile.log import one_line
from miles.utils.workers.reconcile.status import (
    LoopStatus,
    SourcePhase,
    SourceStatus,
    WatchStatus,
)


def wall_time(
    status: LoopStatus, reading: float, *, now: Callable[[], float] = time.time
) -> datetime:
    """A loop-clock ``reading`` of ``status`` as a local wall-clock time."""
    return datetime.fromtimestamp(now() - (status.taken_at - reading)).astimezone()


def local_clock(moment: datetime) -> str:
    return f"{moment.astimezone():%H:%M:%S} local"


class ConnectionTracker:
    """Follows successive snapshots to say how the stream is: connected, reconnecting since when
    (the first snapshot that saw the trouble), relisting and why."""

    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._status: LoopStatus | None = None
        self._trouble_since: datetime | None = None

    def observe(self, status: LoopStatus | None) -> bool:
        """Take a snapshot; ``True`` when it shows the stream healthy after it was not."""
        if status is None:
            return False
        self._status = status
        source = status.source
        if source.phase is SourcePhase.WATCHING and not source.suspect:
            recovered = self._trouble_since is not None
            self._trouble_since = None
            return recovered
        if self._trouble_since is None and source.phase is not SourcePhase.STARTING:
            since = source.phase_since if source.phase_since is not None else status.taken_at
            self._trouble_since = wall_time(status, since, now=self._now)
        return False

    def line(self) -> str:
        """The status line's connection part; empty when no snapshot was seen."""
        if self._status is None:
            return ""
        stopped = _stopped(self._status)
        if stopped is not None:
            return stopped
        return connection_text(self._status.source, self._trouble_since, self._status)


def connection_text(
    source: SourceStatus, trouble_since: datetime | None, status: LoopStatus
) -> str:
    phase = source.phase
    if phase is SourcePhase.WATCHING:
        if source.suspect:
            return "connected, but no event or bookmark lately (watch suspect)"
        return "connected"
    if phase is SourcePhase.RELISTING:
        return f"relisting ({source.relist_reason or 'reason unknown'})"
    if phase is SourcePhase.STARTING:
        return "connecting"
    if phase is SourcePhase.STOPPED:
        return "stopped"
    since = f" since {local_clock(trouble_since)}" if trouble_since is not None else ""
    if phase is SourcePhase.LISTING and trouble_since is None:
        return "listing"
    error = f": {one_line(source.last_error)}" if source.last_error else ""
    return f"reconnecting{since}{error}"


def _stopped(status: LoopStatus) -> str | None:
    """``loop stopped: <why>`` for a loop that stopped on its own."""
    if not status.stopped:
        return None
    return f"loop stopped: {one_line(status.error)}" if status.error else "loop stopped"


def status_record(status: LoopStatus, *, now: Callable[[], float] = time.time) -> dict[str, Any]:
    """The snapshot as JSON-ready data: every field (and each count under the name of what it
    counts, where its field's name does not say), loop-clock times as ISO local wall times."""

    def convert(value: Any, key: str = "") -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, float) and (key.endswith("_at") or key.endswith("_since")):
            if key == "taken_at":
                return datetime.fromtimestamp(now()).astimezone().isoformat()
            return wall_time(status, value, now=now).isoformat()
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = [f.name for f in dataclasses.fields(value)]
            names += _named_counts(value)
            return {name: convert(getattr(value, name), name) for name in names}
        if isinstance(value, tuple | list):
            return [convert(v) for v in value]
        if isinstance(value, dict):
            return {str(k): convert(v) for k, v in value.items()}
        return value

    record: dict[str, Any] = convert(status)
    return record


def _named_counts(value: object) -> tuple[str, ...]:
    """Counts a record also carries under the name of what they count, beside their first key."""
    if isinstance(value, SourceStatus):
        return ("watch_events_received", "listings_requested")
    return ()


def _watch_line(watch: WatchStatus) -> str:
    """One source of a loop over several: name, phase, sync, objects, its last error."""
    synced = "synced" if watch.synced else "not synced"
    line = (
        f"  {watch.name}: {watch.source.phase.value}, {synced}, {watch.objects_stored} objects,"
        f" {watch.source.events} watch events"
    )
    if watch.source.last_error:
        line += f"; last error: {one_line(watch.source.last_error)}"
    return line


def status_text(status: LoopStatus, *, now: Callable[[], float] = time.time) -> list[str]:
    """The snapshot as ``key: value`` lines, as ``kubectl describe`` lays a resource out."""
    source = status.source

    def at(reading: float | None) -> str:
        if reading is None:
            return "never"
        ago = status.taken_at - reading
        relative = f"{ago:.0f}s ago" if ago >= 0 else f"in {-ago:.0f}s"
        return f"{local_clock(wall_time(status, reading, now=now))} ({relative})"

    relists = ", ".join(f"{k}={v}" for k, v in sorted(source.relists.items())) or "none"
    lines = [
        f"Name:               {status.name}",
        f"Synced:             {'yes' if status.synced else 'no'}",
        f"Source:             {source.phase.value}, since {at(source.phase_since)}",
        f"Cursor:             {source.cursor or '-'}",
        f"Last event:         {at(source.last_event_at)}",
        f"Last bookmark:      {at(source.last_bookmark_at)}",
        f"Suspect:            {'yes: no event or bookmark lately' if source.suspect else 'no'}",
        f"Watch events:       {source.events} received, {status.watch_events_applied} applied",
        f"Listings:           {status.listings_applied} applied, {source.lists} requested"
        f" (relists: {relists})",
        f"Objects:            {status.objects_stored} in the store",
        f"Watches:            {source.watches} ({source.watch_restarts} restarts)",
        f"Reconciles:         {status.reconciles} ({status.reconcile_failures} failed)",
        f"Queue depth:        {status.queue_depth}",
    ]
    if source.backoff_until is not None:
        lines.append(f"Backing off until:  {at(source.backoff_until)}")
    if source.last_error:
        lines.append(
            f"Last error:         {one_line(source.last_error)} ({at(source.last_error_at)})"
        )
    if status.in_flight is not None:
        lines.append(
            f"Reconciling:        {status.in_flight.parent} since {at(status.in_flight.started_at)}"
        )
    if len(status.sources) > 1:
        lines.append(f"Sources:            {len(status.sources)}")
        lines.extend(_watch_line(watch) for watch in status.sources)
    stopped = _stopped(status)
    if stopped is not None:
        lines.append(
            f"Stopped:            {stopped.removeprefix('loop stopped').lstrip(': ') or 'yes'}"
        )
    lines.append(f"Retries:            {len(status.retries) or 'none'}")
    lines.extend(
        f"  {r.parent}: {r.failures} failures, next at {at(r.next_attempt_at)}: "
        f"{one_line(r.last_error)}"
        for r in status.retries
    )
    return lines
