"""A pool snapshot rendered as a table, or as one JSON record. Go: ``kubectl get pods`` printers.

Everything here is pure: a snapshot (and the previous one, to mark what changed) goes in, text
comes out, so the view can be tested without a terminal or a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.source_event import ParentKey

BOLD = "\x1b[1m"
DIM = "\x1b[2m"
RESET = "\x1b[0m"
CHANGED_MARK = "*"
REMOVED_MARK = "-"
COLUMNS = ("NAME", "PHASE", "READY", "RESTARTS", "IP", "NODE", "AGE")


@dataclass(frozen=True, slots=True)
class MemberRow:
    """What the view shows of one pod; ``created`` feeds the age column and is not compared."""

    name: str
    phase: str
    ready: str
    restarts: int
    ip: str
    node: str
    resource_version: str
    uid: str
    created: datetime | None = field(default=None, compare=False)

    @property
    def shown(self) -> tuple[str, str, str, int, str, str]:
        return (self.name, self.phase, self.ready, self.restarts, self.ip, self.node)


PoolSnapshot = Mapping[ParentKey, Sequence[MemberRow]]


def member_row(pod: Pod, *, first_seen: datetime | None = None) -> MemberRow:
    """One pod as a row; ``first_seen`` stands in for a creation time the pod does not carry."""
    statuses = pod.status.container_statuses
    return MemberRow(
        name=pod.metadata.name,
        phase=_phase(pod),
        ready=f"{sum(1 for c in statuses if c.ready)}/{len(statuses)}" if statuses else "-",
        restarts=sum(c.restart_count for c in statuses),
        ip=pod.status.pod_ip or "-",
        node=pod.spec.node_name or "-",
        resource_version=pod.metadata.resource_version or "",
        uid=pod.metadata.uid or "",
        created=_creation_time(pod) or first_seen,
    )


def _phase(pod: Pod) -> str:
    if pod.metadata.deletion_timestamp is not None:
        return "Terminating"
    return pod.status.phase or "Unknown"


def _creation_time(pod: Pod) -> datetime | None:
    created = pod.metadata.creation_timestamp
    if created is None or created.tzinfo is not None:
        return created
    return created.replace(tzinfo=UTC)


def format_age(created: datetime | None, now: datetime) -> str:
    """kubectl's short age: ``42s``, ``5m``, ``3h``, ``2d``."""
    if created is None:
        return "-"
    seconds = max(0, int((now - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def changed_members(
    parent: ParentKey, snapshot: PoolSnapshot, previous: PoolSnapshot
) -> tuple[set[str], list[MemberRow]]:
    """Names of rows added or changed since ``previous``, and the rows it had that are now gone."""
    before = {row.name: row for row in previous.get(parent, ())}
    now_rows = snapshot.get(parent, ())
    changed = {
        row.name
        for row in now_rows
        if row.name not in before or before[row.name].shown != row.shown
    }
    names = {row.name for row in now_rows}
    removed = [row for name, row in before.items() if name not in names]
    return changed, removed


def render_pool(
    snapshot: PoolSnapshot,
    previous: PoolSnapshot,
    *,
    now: datetime,
    header: Sequence[str] = (),
    footer: Sequence[str] = (),
    styled: bool = False,
) -> list[str]:
    """The whole screen: header, one block per parent, footer. Changed rows carry ``*`` (and bold
    when ``styled``); rows gone since ``previous`` are shown once more, marked ``-`` (dim)."""
    lines = list(header)
    parents = sorted(set(snapshot) | set(previous))
    if not parents:
        lines.append("(no pods)")
    for parent in parents:
        lines.extend(_render_parent(parent, snapshot, previous, now=now, styled=styled))
    lines.extend(footer)
    return lines


def _render_parent(
    parent: ParentKey,
    snapshot: PoolSnapshot,
    previous: PoolSnapshot,
    *,
    now: datetime,
    styled: bool,
) -> list[str]:
    rows = list(snapshot.get(parent, ()))
    changed, removed = changed_members(parent, snapshot, previous)
    title = f"{parent}  ({_member_count(len(rows)) if parent in snapshot else 'gone'})"
    table: list[tuple[str, tuple[str, ...]]] = [(" ", COLUMNS)]
    table.extend((CHANGED_MARK if row.name in changed else " ", _cells(row, now)) for row in rows)
    table.extend((REMOVED_MARK, _cells(row, now)) for row in removed)
    widths = [max(len(cells[i]) for _, cells in table) for i in range(len(COLUMNS))]
    lines = ["", _style(title, BOLD, styled and bool(changed or removed))]
    for mark, cells in table:
        text = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        line = f"{mark} {text}".rstrip()
        lines.append(_style(line, BOLD if mark == CHANGED_MARK else DIM, styled and mark != " "))
    return lines


def _member_count(count: int) -> str:
    return f"{count} member" if count == 1 else f"{count} members"


def _cells(row: MemberRow, now: datetime) -> tuple[str, ...]:
    return (
        row.name,
        row.phase,
        row.ready,
        str(row.restarts),
        row.ip,
        row.node,
        format_age(row.created, now),
    )


def _style(text: str, code: str, enabled: bool) -> str:
    return f"{code}{text}{RESET}" if enabled else text


def reconcile_record(
    parent: ParentKey, rows: Iterable[MemberRow], *, now: datetime
) -> dict[str, Any]:
    """One reconcile as a JSON-ready object: the parent and every member it holds now."""
    return {
        "time": now.isoformat(),
        "parent": parent,
        "members": [
            {
                "name": row.name,
                "phase": row.phase,
                "ready": row.ready,
                "restarts": row.restarts,
                "ip": row.ip if row.ip != "-" else None,
                "node": row.node if row.node != "-" else None,
                "resourceVersion": row.resource_version,
                "uid": row.uid,
            }
            for row in rows
        ],
    }
