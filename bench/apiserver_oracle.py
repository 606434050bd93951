"""The client-go contender of ``bench/apiserver.py``: ``tools/k8s/oracle`` driven over its pipes.

Go counterpart: client-go's ``Reflector`` and ``Store`` themselves (the oracle). The oracle
answers a ``progress`` line with its ``LastSyncResourceVersion``, its listings, the watch events
its store has applied and the pods it holds, without the pods themselves, and that is the signal
read here: sync is the first answer holding every pod (polled every ``SYNC_POLL_SECONDS``);
ingestion is read from the ``LastSyncResourceVersion``, which client-go sets after each event is in
the store, polled every few milliseconds during the WATCH phase. A lag read that way is an upper
bound, late by up to one poll interval; the CPU the polls cost the oracle is measured after the
phase and subtracted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.apiserver_proc import NAMESPACE, SELECTOR, cpu_seconds, rss_bytes

SYNC_POLL_SECONDS = 0.005
EMPTY_SELECTOR = "miles.io/cell=bench-matches-nothing"
LINE_LIMIT = 256 * 2**20
COST_PROBES = 100


@dataclass(frozen=True)
class Snapshot:
    stamp: float
    resource_version: int
    lists: int
    pods: int
    events: int


class Oracle:
    """One oracle process; ``snapshot()`` asks it for its progress (not its pods)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def snapshot(self) -> Snapshot:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(b"progress\n")
        await stdin.drain()
        line = await stdout.readline()
        stamp = time.monotonic()
        try:
            progress = json.loads(line)
            return Snapshot(
                stamp=stamp,
                resource_version=int(progress["resourceVersion"] or 0),
                lists=int(progress["lists"]),
                pods=int(progress["size"]),
                events=int(progress["events"]),
            )
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"the oracle printed no progress: {line[:200]!r}") from None

    async def wait_until(self, *, pods: int = 0, rv: int = 0, within: float) -> Snapshot:
        deadline = time.monotonic() + within
        while True:
            snap = await self.snapshot()
            synced = snap.lists > 0 and snap.resource_version > 0
            if synced and snap.pods >= pods and snap.resource_version >= rv:
                return snap
            if snap.stamp > deadline:
                raise TimeoutError(f"oracle: {snap} after {within}s")
            await asyncio.sleep(SYNC_POLL_SECONDS)

    async def snapshot_cost(self) -> float:
        """CPU seconds one progress poll costs the oracle, at its current store size."""
        before = cpu_seconds(self.pid)
        for _ in range(COST_PROBES):
            await self.snapshot()
        return (cpu_seconds(self.pid) - before) / COST_PROBES


@contextlib.asynccontextmanager
async def oracle_process(
    binary: Path, kubeconfig: Path, *, selector: str = SELECTOR, log: Path
) -> AsyncIterator[Oracle]:
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--selector={selector}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=LINE_LIMIT,
        )
    try:
        yield Oracle(process)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError:
            process.kill()
            await process.wait()


async def baseline_rss(binary: Path, kubeconfig: Path, *, log: Path) -> int:
    """RSS of an oracle synced to an empty selection: what it holds before any pod."""
    async with oracle_process(binary, kubeconfig, selector=EMPTY_SELECTOR, log=log) as oracle:
        await oracle.wait_until(within=60.0)
        return rss_bytes(oracle.pid)
