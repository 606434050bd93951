"""The pool as the loop last reconciled it, drawn after every reconcile. Go: ``kubectl get -w``'s
printing side (``pkg/cmd/get``: a table, then the rows that change; ``-o json``).

:class:`LiveView` keeps the snapshot and its marks and draws through :mod:`pool_view`: in place
and fitted to the screen on a terminal; off one (a pipe, a file, ``TERM=dumb``) the first
snapshot and then only the rows that changed; or JSON. The terminal around it (clearing, the
cursor, SIGWINCH, the redraw tick) is here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TextIO

from miles.utils.workers.reconcile.cli.pool_view import (
    Mark,
    MemberRow,
    ParentBlock,
    Screen,
    ShownRow,
    change_line,
    clip,
    member_row,
    reconcile_record,
    render_screen,
)
from miles.utils.workers.reconcile.cli.status_view import ConnectionTracker
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.source_event import ParentKey

if TYPE_CHECKING:
    from miles.utils.workers.reconcile.cli.pool_loop import PoolOptions

OutputFormat = Literal["table", "wide", "json", "jsonl"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("table", "wide", "json", "jsonl")
MARK_SECONDS = 5.0
TICK_SECONDS = 1.0
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
CLEAR_SCREEN = "\x1b[2J"
HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"
NOTES_KEPT = 4


def wall_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Terminal:
    """How the view may draw: ``live`` redraws in place (a terminal that is not ``TERM=dumb``);
    ``styled`` adds bold and dim (not with ``NO_COLOR``); ``size`` reads the screen, or ``None``
    when unbounded."""

    live: bool
    styled: bool
    size: Callable[[], tuple[int, int] | None] = lambda: None

    @classmethod
    def of(cls, stream: TextIO, environ: Mapping[str, str]) -> Terminal:
        tty = _isatty(stream)
        dumb = environ.get("TERM", "") in ("dumb", "")
        if not tty:
            return cls(live=False, styled=False)
        return cls(
            live=not dumb,
            styled=not dumb and not environ.get("NO_COLOR"),
            size=lambda: _terminal_size(stream),
        )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:
        return False


def _terminal_size(stream: TextIO) -> tuple[int, int] | None:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):
        return None
    return (size.columns, size.lines) if size.columns > 0 and size.lines > 0 else None


@dataclass(frozen=True, slots=True)
class _RowMark:
    mark: Mark
    at: datetime
    row: MemberRow


class LiveView:
    """The pool as the loop last reconciled it, drawn after every reconcile.

    A row that changed is marked ``*``, and a pod that left stays shown, marked ``-``, for
    :data:`MARK_SECONDS` from the reconcile that saw it, whatever reconciles follow. Reconciles
    before :meth:`start_marking` (the initial sync) are drawn unmarked.
    """

    def __init__(
        self,
        *,
        stream: TextIO,
        output: OutputFormat,
        tty: bool,
        title: str,
        now: Callable[[], datetime] = wall_now,
        on_output_closed: Callable[[], None] = lambda: None,
        terminal: Terminal | None = None,
    ) -> None:
        self._stream = stream
        self._output = output
        self._terminal = terminal or Terminal(live=tty, styled=tty)
        self._title = title
        self._now = now
        self._on_output_closed = on_output_closed
        self._rows: dict[ParentKey, dict[str, MemberRow]] = {}
        self._marks: dict[tuple[ParentKey, str], _RowMark] = {}
        self._marking = False
        self._printed_snapshot = False
        self._reconciles = 0
        self._last_parent: ParentKey | None = None
        self._last_at = now()
        self.connection = ConnectionTracker()
        self.caption: list[str] = []
        self._printed_caption: list[str] = []
        self.output_closed = False
        """The reader went away (``| head``); ``on_output_closed`` was called once."""
        self.notes: deque[str] = deque(maxlen=NOTES_KEPT)

    @property
    def live(self) -> bool:
        return self._terminal.live and self._output in ("table", "wide")

    def start_marking(self, synced: Mapping[ParentKey, Sequence[Pod]]) -> None:
        """Take the synced store as the unmarked baseline; from now on reconciles mark changes.
        Off a terminal, the baseline is printed once as a table."""
        self._rows = {
            parent: {row.name: row for row in map(member_row, pods)}
            for parent, pods in synced.items()
            if pods
        }
        self._marks.clear()
        self._marking = True
        if self._output in ("table", "wide") and not self.live:
            self._print_snapshot()

    def show_parent(self, parent: ParentKey, pods: Sequence[Pod]) -> None:
        """Record ``parent``'s members as the loop holds them now, then draw."""
        now = self._now()
        rows = {row.name: row for row in map(member_row, pods)}
        before = self._rows.get(parent, {})
        changed = self._note_changes(parent, before, rows, now) if self._marking else []
        if rows:
            self._rows[parent] = rows
        else:
            self._rows.pop(parent, None)
        self._reconciles += 1
        self._last_parent = parent
        self._last_at = now
        if self._output in ("json", "jsonl"):
            record = reconcile_record(parent, rows.values(), now=now)
            indent = 2 if self._output == "json" else None
            self._write(json.dumps(record, indent=indent) + "\n")
        elif self.live:
            self.draw()
        elif not self._marking:
            return
        else:
            wide = self._output == "wide"
            width = self._width()
            lines = [change_line(parent, shown, now, wide=wide) for shown in changed]
            self._write("".join(f"{clip(line, width)}\n" for line in lines))

    def _note_changes(
        self,
        parent: ParentKey,
        before: Mapping[str, MemberRow],
        after: Mapping[str, MemberRow],
        now: datetime,
    ) -> list[ShownRow]:
        changed: list[ShownRow] = []
        for name, row in after.items():
            if name not in before or before[name].shown != row.shown:
                self._marks[(parent, name)] = _RowMark(Mark.CHANGED, now, row)
                changed.append(ShownRow(row, Mark.CHANGED))
        for name, row in before.items():
            if name not in after:
                self._marks[(parent, name)] = _RowMark(Mark.GONE, now, row)
                changed.append(ShownRow(row, Mark.GONE))
        return changed

    def draw(self) -> None:
        """Redraw the screen in place on a live terminal; elsewhere only print caption lines that
        were not printed yet (nothing else is redrawn)."""
        if self.output_closed:
            return
        if not self.live:
            self._print_new_caption()
            return
        now = self._now()
        size = self._terminal.size()
        width, height = size if size is not None else (None, None)
        lines = render_screen(
            self.blocks(now),
            now=now,
            screen=Screen(width=width, height=height, styled=self._terminal.styled),
            header=self._header(width),
            footer=[*self.caption, *(f"log: {note}" for note in self.notes)],
            wide=self._output == "wide",
        )
        body = f"{CLEAR_LINE}\n".join(lines)
        self._write(f"{HOME}{body}{CLEAR_LINE}{CLEAR_BELOW}")

    def blocks(self, now: datetime) -> list[ParentBlock]:
        """Every parent with its rows and their marks as of ``now``; expired marks are dropped."""
        self._marks = {
            key: m for key, m in self._marks.items() if (now - m.at).total_seconds() < MARK_SECONDS
        }
        parents = sorted(set(self._rows) | {parent for parent, _ in self._marks})
        blocks = []
        for parent in parents:
            rows = self._rows.get(parent, {})
            shown = [ShownRow(row, self._mark_of(parent, name)) for name, row in rows.items()]
            shown += [
                ShownRow(m.row, Mark.GONE)
                for (p, name), m in sorted(self._marks.items())
                if p == parent and m.mark is Mark.GONE and name not in rows
            ]
            blocks.append(ParentBlock(parent, tuple(shown), len(rows)))
        return blocks

    def _mark_of(self, parent: ParentKey, name: str) -> Mark:
        mark = self._marks.get((parent, name))
        return Mark.CHANGED if mark is not None and mark.mark is Mark.CHANGED else Mark.NONE

    def _print_new_caption(self) -> None:
        if self._output not in ("table", "wide"):
            return
        fresh = [line for line in self.caption if line not in self._printed_caption]
        self._printed_caption = list(self.caption)
        self._write("".join(f"{line}\n" for line in fresh))

    def _print_snapshot(self) -> None:
        if self._printed_snapshot:
            return
        self._printed_snapshot = True
        now = self._now()
        lines = render_screen(
            self.blocks(now),
            now=now,
            screen=Screen(width=self._width()),
            header=[self._title],
            wide=self._output == "wide",
        )
        self._write("\n".join(lines) + "\n")

    def _width(self) -> int | None:
        size = self._terminal.size()
        return size[0] if size is not None else None

    def _header(self, width: int | None) -> list[str]:
        """The title (with the marks' legend where it fits) and the status line."""
        legend = f"{self._title}   (* changed, - gone: {MARK_SECONDS:.0f}s)"
        last = (
            f"last reconcile {self._last_parent} at "
            f"{self._last_at.astimezone():%H:%M:%S} local (#{self._reconciles})"
            if self._last_parent is not None
            else "waiting for the first reconcile"
        )
        members = sum(len(rows) for rows in self._rows.values())
        counts = f"{len(self._rows)} parents, {members} pods; {last}"
        status = self.connection.line()
        return [
            legend if width is None or len(legend) <= width else self._title,
            f"{status} | {counts}" if status else counts,
        ]

    def observe(self, status: Any) -> None:
        """Take a ``LoopStatus``; once the stream is healthy again, connection warnings clear."""
        if self.connection.observe(status):
            self.notes.clear()

    def _write(self, text: str) -> None:
        if self.output_closed or not text:
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except BrokenPipeError:
            self.output_closed = True
            self._on_output_closed()


def view_title(options: PoolOptions, *, command: str = "watch") -> str:
    return (
        f"miles-reconcile {command}  namespace={options.namespace}  selector={options.selector}  "
        f"parent-label={options.parent_label}"
    )


@contextlib.contextmanager
def owning_terminal(view: LiveView, out: TextIO) -> Iterator[None]:
    """Clear the screen and hide the cursor while the live view draws; on the way out, whatever
    ends it, show the cursor again and leave the last frame above the prompt."""
    if not view.live:
        yield
        return
    out.write(CLEAR_SCREEN + HIDE_CURSOR)
    out.flush()
    try:
        yield
    finally:
        with contextlib.suppress(BrokenPipeError, ValueError):
            out.write(SHOW_CURSOR + "\n")
            out.flush()


@contextlib.contextmanager
def redraw_on_resize(view: LiveView) -> Iterator[None]:
    """SIGWINCH redraws at the new size at once."""
    if not view.live:
        yield
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGWINCH, view.draw)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGWINCH)


async def wait_redrawing(
    view: LiveView,
    stop: asyncio.Event,
    *,
    tick: bool,
    status: Callable[[], Any] = lambda: None,
) -> None:
    """Wait for ``stop``; with ``tick``, read the loop's status and redraw every
    :data:`TICK_SECONDS` meanwhile (ages move, marks fade, the status line follows)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TICK_SECONDS if tick else None):
                await stop.wait()
        if tick and not stop.is_set():
            view.observe(status())
            view.draw()
