"""The runtime's log lines as notes under the live view while it owns the terminal. Go: klog's
``SetOutput`` (a writer in place of stderr)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, MutableSequence


class NotesHandler(logging.Handler):
    """Appends the first line of every warning or worse to ``notes``, level first."""

    def __init__(self, notes: MutableSequence[str]) -> None:
        super().__init__(level=logging.WARNING)
        self._notes = notes

    def emit(self, record: logging.LogRecord) -> None:
        first_line = (record.getMessage().splitlines() or [""])[0]
        self._notes.append(f"{record.levelname.lower()}: {first_line}")


@contextlib.contextmanager
def logs_into(notes: MutableSequence[str], *, enabled: bool) -> Iterator[None]:
    """While the block runs (if ``enabled``), the root logger writes to ``notes`` only."""
    if not enabled:
        yield
        return
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [NotesHandler(notes)]
    try:
        yield
    finally:
        root.handlers = saved
