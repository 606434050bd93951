"""``miles-reconcile watch``: a ReconcileLoop whose reconcile draws the pool. Go: ``kubectl get -w``
(the printer side); the loop side is ``loop.py``.

The reconcile function reads ``loop.get_by_parent(parent)`` and hands the rows to a
:class:`LiveView`, which keeps the snapshot and its marks and draws through :mod:`pool_view`: in
place and fitted to the screen on a terminal; off one (a pipe, a file, ``TERM=dumb``) the first
snapshot and then only the rows that changed; or JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TextIO

from miles.utils.workers.reconcile.cli.failures import CliError
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
from miles.utils.workers.reconcile.cli.status_view import ConnectionTracker, loop_status
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.source_event import ParentKey

OutputFormat = Literal["table", "wide", "json", "jsonl"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("table", "wide", "json", "jsonl")
MARK_SECONDS = 5.0
TICK_SECONDS = 1.0
PREFLIGHT_TIMEOUT = 15.0
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
CLEAR_SCREEN = "\x1b[2J"
HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"
NOTES_KEPT = 4
INTERRUPTED_EXIT = 130
SIGNAL_EXIT_BASE = 128


def wall_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    namespace: str
    selector: str
    parent_label: str
    output: OutputFormat = "table"


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


class PodLister(Protocol):
    async def list_pods(self, *, namespace: str, label_selector: str) -> Any: ...


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


class NotesHandler(logging.Handler):
    """Routes the runtime's log lines into the view's footer while it owns the terminal."""

    def __init__(self, view: LiveView) -> None:
        super().__init__(level=logging.WARNING)
        self._view = view

    def emit(self, record: logging.LogRecord) -> None:
        first_line = record.getMessage().splitlines()[0] if record.getMessage() else ""
        self._view.notes.append(f"{record.levelname.lower()}: {first_line}")


@contextlib.contextmanager
def logs_into(view: LiveView, *, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    root = logging.getLogger()
    handler = NotesHandler(view)
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        yield
    finally:
        root.handlers = saved


def parent_label_map(label: str) -> Callable[[Any], ParentKey | None]:
    """The loop's ``key_map``: a pod's parent is the value of ``label``; no label, no parent."""

    def key_map(pod: Any) -> ParentKey | None:
        value: str | None = pod.metadata.labels.get(label)
        return value or None

    return key_map


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` instead of raising, so teardown runs as ordinary code."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        yield
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


class SignalCancel:
    """SIGINT and SIGTERM cancel the task that installed this, at whatever it awaits (connecting,
    listing, watching), so ``finally`` blocks restore the terminal; :attr:`exit_code` is then
    ``128 + signal`` (130, 143), as a shell reports a process killed by it. A second signal
    cancels the teardown too."""

    def __init__(self) -> None:
        self.received: int | None = None

    @property
    def exit_code(self) -> int | None:
        return None if self.received is None else SIGNAL_EXIT_BASE + self.received

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            if self.received is None:
                self.received = signum
            task.cancel()

        signals = (signal.SIGINT, signal.SIGTERM)
        for signum in signals:
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            yield
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)

    async def run(self, work: Any) -> int | None:
        """Await ``work``; on a signal, its exit code instead of the cancellation."""
        task = asyncio.current_task()
        assert task is not None
        with self.installed():
            try:
                await work
            except asyncio.CancelledError:
                if self.received is None:
                    raise
                task.uncancel()
        return self.exit_code


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


def synced_pool(loop: Any) -> dict[ParentKey, list[Any]]:
    return {parent: loop.get_by_parent(parent) for parent in loop.parent_keys()}


def empty_selection_note(options: WatchOptions, pods_listed: int) -> str:
    if pods_listed == 0:
        return (
            f"no pods in namespace {options.namespace!r} match selector {options.selector!r}; "
            "watching for them"
        )
    return (
        f"{pods_listed} pods match selector {options.selector!r} but none carries label "
        f"{options.parent_label!r}; watching for them"
    )


async def preflight(pod_api: PodLister, options: WatchOptions) -> int:
    """One LIST before the loop starts, so a bad address, a bad selector or a missing permission
    fails at once (the reflector would retry it forever). Returns how many pods it listed."""
    try:
        async with asyncio.timeout(PREFLIGHT_TIMEOUT):
            page = await pod_api.list_pods(
                namespace=options.namespace, label_selector=options.selector
            )
    except KubernetesApiError as err:
        if err.code == 400:
            raise CliError(
                f"selector {options.selector!r} rejected by the apiserver: "
                f"{err.message or err.reason}; fix --selector (e.g. app=engine)"
            ) from None
        raise
    return len(page.pods)


def make_loop(options: WatchOptions, *, pod_api: Any, reconcile: Any) -> Any:
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.loop import ReconcileLoop

    reflector = KubernetesReflector(
        kube_client=pod_api, namespace=options.namespace, label_selector=options.selector
    )
    return ReconcileLoop(
        source=reflector.watch, reconcile=reconcile, key_map=parent_label_map(options.parent_label)
    )


async def watch_pool(
    options: WatchOptions,
    *,
    pod_api: Any,
    view: LiveView,
    stop: asyncio.Event,
    err: TextIO,
    tick: bool,
) -> None:
    """Run the loop with ``view`` as its reconcile until ``stop`` is set."""
    listed = await preflight(pod_api, options)

    async def reconcile(parent: ParentKey) -> None:
        view.show_parent(parent, loop.get_by_parent(parent))

    loop = make_loop(options, pod_api=pod_api, reconcile=reconcile)
    async with loop:
        view.observe(loop_status(loop))
        view.start_marking(synced_pool(loop))
        if not loop.parent_keys():
            note = empty_selection_note(options, listed)
            err.write(f"miles-reconcile: {note}\n")
            err.flush()
            view.notes.append(note)
        view.draw()
        await wait_redrawing(view, stop, tick=tick, status=lambda: loop_status(loop))


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


def view_title(options: WatchOptions, *, command: str = "watch") -> str:
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


async def run_watch(
    options: WatchOptions,
    *,
    target: Any,
    environ: Mapping[str, str],
    out: TextIO,
    err: TextIO,
) -> int:
    """The ``watch`` command; returns its exit code (130 after Ctrl-C, 143 after SIGTERM)."""
    from miles.utils.workers.reconcile.cli.kube_session import kube_session
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi

    stop = asyncio.Event()
    signals = SignalCancel()

    async def watch() -> None:
        async with kube_session(target, environ) as session:
            resolved = WatchOptions(
                namespace=session.namespace,
                selector=options.selector,
                parent_label=options.parent_label,
                output=options.output,
            )
            view = LiveView(
                stream=out,
                output=options.output,
                tty=False,
                title=view_title(resolved),
                on_output_closed=stop.set,
                terminal=Terminal.of(out, environ),
            )
            pod_api = KubernetesAsyncioPodApi(core_v1_api=session.core_v1_api)
            with (
                owning_terminal(view, out),
                redraw_on_resize(view),
                logs_into(view, enabled=view.live),
            ):
                await watch_pool(
                    resolved, pod_api=pod_api, view=view, stop=stop, err=err, tick=view.live
                )
            if view.output_closed:
                raise BrokenPipeError

    code = await signals.run(watch())
    err.write("miles-reconcile: stopped\n" if code is None else "miles-reconcile: interrupted\n")
    return code or 0
