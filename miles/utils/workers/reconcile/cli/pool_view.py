"""A pool rendered as a table that fits a screen, or as JSON. Go: ``kubectl get pods`` printers
(``printers.NewTablePrinter``'s columns, ``-o wide``, ``-o json``).

Everything here is pure: rows, marks, a screen size and a time go in, lines come out, so the view
can be tested without a terminal or a cluster.

Fitting a width: every column is as wide as its widest cell, three spaces apart as kubectl's
tabwriter pads them. When the table is wider than the screen, columns are dropped in
:data:`DROP_ORDER` (the ``-o wide`` ones first); NAME, the widest, is shrunk last, and any line
still too long is cut. Fitting a height: the title, status line and column header always show;
parents follow in order while they fit, then one line says how many are hidden.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from miles.utils.workers.reconcile.cli.pod_columns import (
    NONE,
    PodColumns,
    age_cell,
    pod_columns,
    restarts_cell,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.source_event import ParentKey

BOLD = "\x1b[1m"
DIM = "\x1b[2m"
RESET = "\x1b[0m"
GAP = "   "
ELLIPSIS = "~"
COLUMNS = ("NAME", "READY", "STATUS", "RESTARTS", "AGE")
WIDE_COLUMNS = (*COLUMNS, "IP", "NODE")
DROP_ORDER = ("NODE", "IP", "AGE", "RESTARTS", "READY")
MIN_NAME = 8


class Mark(enum.StrEnum):
    """What happened to a row in the last few seconds."""

    NONE = " "
    CHANGED = "*"
    GONE = "-"


@dataclass(frozen=True, slots=True)
class MemberRow:
    """What the view shows of one pod. Two rows are the same change-wise when :attr:`shown` is."""

    columns: PodColumns
    resource_version: str
    uid: str

    @property
    def name(self) -> str:
        return self.columns.name

    @property
    def shown(self) -> tuple[Any, ...]:
        c = self.columns
        return (c.name, c.ready, c.status, c.restarts, c.last_restart, c.ip, c.node)

    def cells(self, now: datetime, *, wide: bool) -> tuple[str, ...]:
        c = self.columns
        cells = (
            c.name,
            c.ready,
            c.status,
            restarts_cell(c.restarts, c.last_restart, now),
            age_cell(c.created, now),
        )
        return (*cells, c.ip, c.node) if wide else cells


def member_row(pod: Pod) -> MemberRow:
    return MemberRow(
        columns=pod_columns(pod),
        resource_version=pod.metadata.resource_version or "",
        uid=pod.metadata.uid or "",
    )


@dataclass(frozen=True, slots=True)
class ShownRow:
    row: MemberRow
    mark: Mark = Mark.NONE


@dataclass(frozen=True, slots=True)
class ParentBlock:
    """A parent and the rows to show under it (members, then members gone for a few seconds)."""

    parent: ParentKey
    rows: tuple[ShownRow, ...]
    members: int

    @property
    def marked(self) -> bool:
        return any(r.mark is not Mark.NONE for r in self.rows)


@dataclass(frozen=True, slots=True)
class Screen:
    """Where the lines go: ``width``/``height`` of ``None`` mean unbounded (not a terminal)."""

    width: int | None = None
    height: int | None = None
    styled: bool = False


def render_screen(
    blocks: Sequence[ParentBlock],
    *,
    now: datetime,
    screen: Screen,
    header: Sequence[str] = (),
    footer: Sequence[str] = (),
    wide: bool = False,
) -> list[str]:
    """The whole screen: header lines, the column header, one block per parent, footer lines."""
    names = WIDE_COLUMNS if wide else COLUMNS
    table = [tuple(r.row.cells(now, wide=wide)) for b in blocks for r in b.rows]
    layout = fit_columns(names, table, screen.width)
    top = [*header, layout.format(names, Mark.NONE)]
    body: list[list[str]] = [_block_lines(b, layout, now, wide, screen.styled) for b in blocks]
    if not blocks:
        body = [["(no pods)"]]
    fitted = _fit_height(body, blocks, screen, len(top) + len(footer))
    lines = top + fitted + list(footer)
    if screen.height is not None:
        lines = lines[: screen.height]
    return [clip(line, screen.width) for line in lines]


def _block_lines(
    block: ParentBlock, layout: ColumnLayout, now: datetime, wide: bool, styled: bool
) -> list[str]:
    count = f"{block.members} member" + ("" if block.members == 1 else "s")
    title = f"{block.parent}  ({count if block.members else 'gone'})"
    lines = [_style(title, BOLD, styled and block.marked)]
    for shown in block.rows:
        text = layout.format(shown.row.cells(now, wide=wide), shown.mark)
        code = BOLD if shown.mark is Mark.CHANGED else DIM
        lines.append(_style(text, code, styled and shown.mark is not Mark.NONE))
    return lines


def _fit_height(
    body: list[list[str]], blocks: Sequence[ParentBlock], screen: Screen, fixed: int
) -> list[str]:
    height = screen.height
    if height is None or sum(len(b) for b in body) + fixed <= height:
        return [line for block in body for line in block]
    room = max(0, height - fixed - 1)
    shown: list[str] = []
    hidden_from = len(body)
    cut_rows = 0
    for index, block in enumerate(body):
        if len(shown) + len(block) > room:
            if not shown:
                shown, index = block[:room], index + 1
                cut_rows = len(block) - max(1, room)
            hidden_from = index
            break
        shown.extend(block)
    hidden = blocks[hidden_from:]
    pods = sum(b.members for b in hidden) + cut_rows
    return [*shown, hidden_line(len(hidden), pods, screen.width, partial=cut_rows > 0)]


def hidden_line(parents: int, pods: int, width: int | None = None, *, partial: bool = False) -> str:
    """``... 8 more parents (24 pods) hidden``; when the first parent itself is cut,
    ``... 26 more pods hidden (8 more parents)``."""
    more_parents = f"{parents} more {'parent' if parents == 1 else 'parents'}"
    more_pods = f"{pods} {'pod' if pods == 1 else 'pods'}"
    line = (
        f"... {pods} more {'pod' if pods == 1 else 'pods'} hidden ({more_parents})"
        if partial
        else f"... {more_parents} ({more_pods}) hidden"
    )
    hinted = f"{line}: enlarge the terminal or narrow -l"
    return hinted if width is None or len(hinted) <= width else line


@dataclass(frozen=True, slots=True)
class ColumnLayout:
    """Which columns show (by index) and how wide each is."""

    keep: tuple[int, ...]
    widths: tuple[int, ...]

    def format(self, cells: Sequence[str], mark: Mark) -> str:
        parts = [
            _cut(cells[i], w).ljust(w) if n < len(self.keep) - 1 else _cut(cells[i], w)
            for n, (i, w) in enumerate(zip(self.keep, self.widths, strict=True))
        ]
        return f"{mark.value} {GAP.join(parts)}".rstrip()


def fit_columns(
    names: Sequence[str], rows: Iterable[Sequence[str]], width: int | None
) -> ColumnLayout:
    """Columns that fit ``width``: drop by :data:`DROP_ORDER`, then shrink NAME to fit."""
    table = [tuple(names), *(tuple(r) for r in rows)]
    natural = [max(len(row[i]) for row in table) for i in range(len(names))]
    keep = list(range(len(names)))

    def total(indices: Sequence[int]) -> int:
        return 2 + sum(natural[i] for i in indices) + len(GAP) * (len(indices) - 1)

    for name in DROP_ORDER:
        if width is None or total(keep) <= width:
            break
        if name in names:
            keep.remove(names.index(name))
    widths = [natural[i] for i in keep]
    if width is not None and total(keep) > width:
        widths[0] = max(MIN_NAME, widths[0] - (total(keep) - width))
    return ColumnLayout(tuple(keep), tuple(widths))


def clip(line: str, width: int | None) -> str:
    """``line`` cut to ``width`` visible characters (SGR codes kept out of the count)."""
    if width is None or _visible_length(line) <= width:
        return line
    styled = line.startswith("\x1b[")
    text = line.split("m", 1)[1].removesuffix(RESET) if styled else line
    cut = _cut(text, width)
    return f"{line.split('m', 1)[0]}m{cut}{RESET}" if styled else cut


def _visible_length(line: str) -> int:
    if not line.startswith("\x1b["):
        return len(line)
    return len(line.split("m", 1)[1].removesuffix(RESET))


def _cut(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def _style(text: str, code: str, enabled: bool) -> str:
    return f"{code}{text}{RESET}" if enabled else text


def change_line(parent: ParentKey, shown: ShownRow, now: datetime, *, wide: bool) -> str:
    """One row changed since the last print, for output that is not a terminal: the parent, then
    the row as the table shows it."""
    cells = shown.row.cells(now, wide=wide)
    return f"{shown.mark.value} {parent}{GAP}{GAP.join(cells)}"


def member_record(row: MemberRow) -> dict[str, Any]:
    c = row.columns
    return {
        "name": c.name,
        "ready": c.ready,
        "status": c.status,
        "restarts": c.restarts,
        "lastRestart": c.last_restart.isoformat() if c.last_restart else None,
        "created": c.created.isoformat() if c.created else None,
        "ip": None if c.ip == NONE else c.ip,
        "node": None if c.node == NONE else c.node,
        "resourceVersion": row.resource_version,
        "uid": row.uid,
    }


def reconcile_record(
    parent: ParentKey, rows: Iterable[MemberRow], *, now: datetime
) -> dict[str, Any]:
    """One reconcile as a JSON-ready object: the parent and every member it holds now."""
    return {
        "time": now.isoformat(),
        "parent": parent,
        "members": [member_record(row) for row in rows],
    }
