"""A progress display for the binary builds of ``k8s_testenv``. Go: none (kwokctl's download log).

The builds are synchronous ``go build`` runs reporting through a ``log(line)`` callback, so they run
in a worker thread while the event loop redraws one status line (on a terminal) or echoes each
build line as it comes (otherwise).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TextIO, TypeVar

T = TypeVar("T")
LogFn = Callable[[str], None]
SPINNER = "|/-\\"
REDRAW_SECONDS = 0.25


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_line(current: str, started: float, now: float, frame: int) -> str:
    return f"{SPINNER[frame % len(SPINNER)]} {current} ({format_elapsed(now - started)})"


async def run_with_progress(work: Callable[[LogFn], T], *, stream: TextIO, tty: bool) -> T:
    """Run ``work(log)`` in a thread; show its latest log line with a spinner and elapsed time."""
    loop = asyncio.get_running_loop()
    current = ["preparing"]
    started = [time.monotonic()]

    def on_line(line: str) -> None:
        current[0] = line.removeprefix("k8s_testenv: ")
        started[0] = time.monotonic()
        if tty:
            stream.write("\r\x1b[K")
            if current[0].endswith("..."):
                return
        stream.write(current[0] + "\n")
        stream.flush()

    def log(line: str) -> None:
        loop.call_soon_threadsafe(on_line, line)

    job = asyncio.ensure_future(asyncio.to_thread(work, log))
    frame = 0
    while not job.done():
        if tty:
            stream.write(
                "\r\x1b[K" + progress_line(current[0], started[0], time.monotonic(), frame)
            )
            stream.flush()
        frame += 1
        await asyncio.wait({job}, timeout=REDRAW_SECONDS)
    if tty:
        stream.write("\r\x1b[K")
        stream.flush()
    return job.result()
