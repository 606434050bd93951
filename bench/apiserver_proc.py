"""What the processes of ``bench/apiserver.py`` share: names, the JSON-line protocol, /proc reads.

Go counterpart: none (benchmark plumbing). Every child process talks to the orchestrator in JSON
lines on stdout and reads one-word commands on stdin; times are ``time.monotonic()``, which is one
system-wide clock (CLOCK_MONOTONIC) on Linux, so stamps taken in different processes compare.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from array import array
from pathlib import Path
from typing import Any

PARENT_LABEL = "miles.io/cell"
SELECTOR = PARENT_LABEL
NAMESPACE = "miles-bench-apiserver"
WRITER_ANNOTATION = "bench.miles.io/seq"
WRITER_LABEL = "bench.miles.io/gen"
REPO_ROOT = Path(__file__).resolve().parent.parent
_RV_PREFIX = re.compile(rb'"resourceVersion":"(\d+)"')
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size (``VmRSS``) of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def cpu_seconds(pid: int | str = "self") -> float:
    """CPU time of a process, all its threads, to the nanosecond where the kernel keeps it.

    The sum of each live thread's ``schedstat`` run time: ``stat``'s user plus system time counts
    in 10 ms clock ticks, too coarse for a phase of a few hundred milliseconds. Falls back to the
    ticks where the kernel keeps no ``schedstat``.
    """
    total = 0
    for thread in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((thread / "schedstat").read_text().split()[0])
        except FileNotFoundError:
            if (thread / "stat").exists():
                return sum(user_and_system_seconds(pid))
    return total / 1e9


def user_and_system_seconds(pid: int | str = "self") -> tuple[float, float]:
    """``stat``'s user and system time of a process, all its threads, in clock ticks (10 ms)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


class KernelShare:
    """The share of a process's CPU spent in the kernel over a window, from ``stat``'s ticks."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._start = user_and_system_seconds(pid)

    def share(self) -> float | None:
        user, system = (
            now - then
            for now, then in zip(user_and_system_seconds(self._pid), self._start, strict=True)
        )
        return system / (user + system) if user + system > 0 else None


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def read_body(resp: Any) -> bytes:
    """The whole body of a response asked for with ``_preload_content=False``; its connection
    goes back to the pool whether or not the read succeeds."""
    try:
        body: bytes = await resp.read()
        return body
    finally:
        resp.release()


def first_resource_version(body: bytes) -> int:
    """``metadata.resourceVersion`` of one object's JSON: Go writes it before any nested one."""
    match = _RV_PREFIX.search(body, 0, 1024)
    if match is not None:
        return int(match.group(1))
    return int(json.loads(body)["metadata"]["resourceVersion"])


async def read_command() -> str:
    """One line of this process's stdin, without blocking the event loop."""
    line: str = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line:
        raise EOFError("the orchestrator closed stdin")
    return line.strip()


class AppliedEvents:
    """The resourceVersions a contender has applied, each with its stamp, and a wait for one.

    The record is two arrays, not a list of tuples: a tuple is an object the cyclic collector
    tracks, and one kept per event made CPython run young collections that walked every pod
    decoded since the last one, twice, as measured CPU of the contender. Arrays of machine numbers
    allocate nothing the collector tracks."""

    def __init__(self) -> None:
        self._rvs = array("q")
        self._stamps = array("d")
        self.dispatch = array("d")
        self.max_rv = 0
        self.progress = asyncio.Event()

    @property
    def applied(self) -> list[tuple[int, float]]:
        return list(zip(self._rvs, self._stamps, strict=True))

    def note(self, rv: int, stamp: float) -> None:
        self._rvs.append(rv)
        self._stamps.append(stamp)
        if rv > self.max_rv:
            self.max_rv = rv
        self.progress.set()

    def reset(self) -> None:
        for record in (self._rvs, self._stamps, self.dispatch):
            del record[:]

    async def wait_for_rv(self, rv: int, within: float) -> None:
        deadline = time.monotonic() + within
        while self.max_rv < rv and (left := deadline - time.monotonic()) > 0:
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), left)
            except TimeoutError:
                return


async def close_child(process: asyncio.subprocess.Process, *, within: float) -> None:
    """Closes the child's stdin (no more commands) and waits ``within`` seconds for it to exit,
    then kills it."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), within)
    except TimeoutError:
        process.kill()
        await process.wait()


def child_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"bench.{module}", *args]
