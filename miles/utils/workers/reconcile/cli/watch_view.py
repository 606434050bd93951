"""``miles-reconcile watch``: a ReconcileLoop whose reconcile draws the pool. Go: ``kubectl get -w``
(the printer side); the loop side is ``loop.py``.

The reconcile function reads ``loop.get_by_parent(parent)`` and hands the rows to a
:class:`LiveView`, which keeps the snapshot and draws it through :mod:`pool_view`: in place on a
terminal, as appended snapshots or JSON lines otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TextIO

from miles.utils.workers.reconcile.cli.pool_view import (
    MemberRow,
    PoolSnapshot,
    member_row,
    reconcile_record,
    render_pool,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.source_event import ParentKey

OutputFormat = Literal["table", "jsonl"]
MARK_SECONDS = 5.0
TICK_SECONDS = 1.0
PREFLIGHT_TIMEOUT = 15.0
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
CLEAR_SCREEN = "\x1b[2J"
NOTES_KEPT = 4
FIRST_SEEN_SLACK = 64
INTERRUPTED_EXIT = 130


def wall_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    namespace: str
    selector: str
    parent_label: str
    output: OutputFormat = "table"


class PodLister(Protocol):
    async def list_pods(self, *, namespace: str, label_selector: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class _ParentChange:
    """A parent's rows before its latest reconcile, and when that reconcile ran."""

    before: tuple[MemberRow, ...]
    at: datetime


class LiveView:
    """The pool as the loop last reconciled it, drawn after every reconcile.

    Marks show what each parent's latest reconcile changed, for :data:`MARK_SECONDS` on a terminal
    and in the one snapshot it produced otherwise. Reconciles before :meth:`start_marking` (the
    initial sync) are drawn unmarked.
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
    ) -> None:
        self._stream = stream
        self._output = output
        self._tty = tty
        self._title = title
        self._now = now
        self._on_output_closed = on_output_closed
        self._rows: dict[ParentKey, tuple[MemberRow, ...]] = {}
        self._changes: dict[ParentKey, _ParentChange] = {}
        self._first_seen: dict[str, datetime] = {}
        self._marking = False
        self._reconciles = 0
        self._last_parent: ParentKey | None = None
        self._last_at = now()
        self.caption: list[str] = []
        self.output_closed = False
        """The reader went away (``| head``); ``on_output_closed`` was called once."""
        self.notes: deque[str] = deque(maxlen=NOTES_KEPT)

    def start_marking(self, synced: Mapping[ParentKey, Sequence[Pod]]) -> None:
        """Take the synced store as the unmarked baseline; from now on reconciles mark changes."""
        now = self._now()
        self._rows = {
            parent: tuple(member_row(pod, first_seen=self._seen(pod, now)) for pod in pods)
            for parent, pods in synced.items()
            if pods
        }
        self._marking = True

    def show_parent(self, parent: ParentKey, pods: Sequence[Pod]) -> None:
        """Record ``parent``'s members as the loop holds them now, then draw."""
        now = self._now()
        rows = tuple(member_row(pod, first_seen=self._seen(pod, now)) for pod in pods)
        if self._marking:
            self._changes[parent] = _ParentChange(self._rows.get(parent, ()), now)
        if rows:
            self._rows[parent] = rows
        else:
            self._rows.pop(parent, None)
        self._forget_gone_pods()
        self._reconciles += 1
        self._last_parent = parent
        self._last_at = now
        if self._output == "jsonl":
            self._write(json.dumps(reconcile_record(parent, rows, now=now)) + "\n")
        else:
            self.draw(only_changes_of=None if self._tty else parent)

    def draw(self, *, only_changes_of: ParentKey | None = None) -> None:
        """Draw the table; off a terminal, only ``only_changes_of``'s latest change is marked."""
        if self._output == "jsonl":
            return
        now = self._now()
        lines = render_pool(
            self._rows,
            self._previous(now, only_changes_of),
            now=now,
            header=self._header(now),
            footer=[*self.caption, *(f"log: {note}" for note in self.notes)],
            styled=self._tty,
        )
        if self._tty:
            body = "".join(f"{line}{CLEAR_LINE}\n" for line in lines)
            self._write(f"{HOME}{body}{CLEAR_BELOW}")
        else:
            self._write("\n".join(lines) + "\n\n")

    def _previous(self, now: datetime, only: ParentKey | None) -> PoolSnapshot:
        if only is not None:
            self._changes = {p: c for p, c in self._changes.items() if p == only}
        else:
            self._changes = {
                p: c
                for p, c in self._changes.items()
                if (now - c.at).total_seconds() < MARK_SECONDS
            }
        previous: dict[ParentKey, Sequence[MemberRow]] = dict(self._rows)
        for parent, change in self._changes.items():
            if change.before:
                previous[parent] = change.before
            else:
                previous.pop(parent, None)
        return previous

    def _header(self, now: datetime) -> list[str]:
        last = (
            f"last reconcile: {self._last_parent} at {self._last_at:%H:%M:%S} (#{self._reconciles})"
            if self._last_parent is not None
            else "waiting for the first reconcile"
        )
        members = sum(len(rows) for rows in self._rows.values())
        return [
            self._title,
            f"parents: {len(self._rows)}, members: {members}; {last}",
            "* changed by the latest reconcile   - gone since",
        ]

    def _seen(self, pod: Pod, now: datetime) -> datetime:
        return self._first_seen.setdefault(_identity(pod.metadata.uid, pod.metadata.name), now)

    def _forget_gone_pods(self) -> None:
        shown = sum(len(rows) for rows in self._rows.values())
        if len(self._first_seen) <= 2 * shown + FIRST_SEEN_SLACK:
            return
        live = {_identity(row.uid, row.name) for rows in self._rows.values() for row in rows}
        self._first_seen = {key: at for key, at in self._first_seen.items() if key in live}

    def _write(self, text: str) -> None:
        if self.output_closed:
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
        self._view.notes.append(f"{record.levelname.lower()}: {record.getMessage()}")


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
    """One LIST before the loop starts, so a bad address or a missing permission fails at once
    (the reflector would retry it forever). Returns how many pods it listed."""
    async with asyncio.timeout(PREFLIGHT_TIMEOUT):
        page = await pod_api.list_pods(namespace=options.namespace, label_selector=options.selector)
    return len(page.pods)


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
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.loop import ReconcileLoop

    listed = await preflight(pod_api, options)
    reflector = KubernetesReflector(
        kube_client=pod_api, namespace=options.namespace, label_selector=options.selector
    )

    async def reconcile(parent: ParentKey) -> None:
        view.show_parent(parent, loop.get_by_parent(parent))

    loop = ReconcileLoop(
        source=reflector.watch, reconcile=reconcile, key_map=parent_label_map(options.parent_label)
    )
    async with loop:
        view.start_marking(synced_pool(loop))
        if not loop.parent_keys():
            note = empty_selection_note(options, listed)
            err.write(f"miles-reconcile: {note}\n")
            err.flush()
            view.notes.append(note)
            view.draw()
        await wait_redrawing(view, stop, tick=tick)


async def wait_redrawing(view: LiveView, stop: asyncio.Event, *, tick: bool) -> None:
    """Wait for ``stop``; with ``tick``, redraw every :data:`TICK_SECONDS` meanwhile (ages move,
    marks fade)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TICK_SECONDS if tick else None):
                await stop.wait()
        if tick and not stop.is_set():
            view.draw()


def view_title(options: WatchOptions, *, command: str = "watch") -> str:
    return (
        f"miles-reconcile {command}  namespace={options.namespace}  selector={options.selector}  "
        f"parent-label={options.parent_label}"
    )


async def run_watch(
    options: WatchOptions,
    *,
    kubeconfig: str | None,
    environ: Mapping[str, str],
    out: TextIO,
    err: TextIO,
) -> None:
    from miles.utils.workers.reconcile.cli.kube_session import core_v1_api
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi

    tty = out.isatty() and options.output == "table"
    stop = asyncio.Event()
    view = LiveView(
        stream=out,
        output=options.output,
        tty=tty,
        title=view_title(options),
        on_output_closed=stop.set,
    )
    with stop_on_signals(stop):
        async with core_v1_api(kubeconfig, environ) as core:
            pod_api = KubernetesAsyncioPodApi(core_v1_api=core)
            if tty:
                out.write(CLEAR_SCREEN)
            with logs_into(view, enabled=tty):
                await watch_pool(options, pod_api=pod_api, view=view, stop=stop, err=err, tick=tty)
    if view.output_closed:
        raise BrokenPipeError
    if tty:
        out.write("\n")
    err.write("miles-reconcile: stopped\n")


def _identity(uid: str | None, name: str) -> str:
    return uid or name
