"""The compiled contenders of ``bench/apiserver.py``, driven over their pipes.

Go counterpart: client-go's ``Reflector`` and ``Store`` themselves (``tools/k8s/oracle``); the
kube-rs contender (``tools/kube-rs-oracle``) speaks the same protocol. Each answers a ``progress``
line with its resourceVersion, its listings, the watch events its store has applied and the pods
it holds, without the pods themselves: sync is the first answer holding every pod (polled every
``SYNC_POLL_SECONDS``). client-go's resourceVersion is its ``LastSyncResourceVersion``, set after
each event is in the store; kube-rs's the highest one its store applied, plus ``synced`` once its
first listing is done. The kube-rs contender also answers ``wait <rv>`` once its store holds that
resourceVersion and ``applied`` with every watch event it applied, stamped in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.apiserver_proc import SELECTOR, close_child, cpu_seconds, rss_bytes

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
    synced: bool


class Oracle:
    """One oracle process; ``snapshot()`` asks it for its progress (not its pods)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    async def snapshot(self) -> Snapshot:
        return await self._progress(b"progress")

    async def wait_for_rv(self, rv: int, within: float) -> Snapshot:
        """One request, answered once the store holds ``rv`` (kube-rs contender only)."""
        return await asyncio.wait_for(self._progress(f"wait {rv}".encode()), within)

    async def applied(self) -> list[tuple[int, float]]:
        """Every watch event applied since the last call, as (resourceVersion, monotonic stamp)."""
        line = await self._ask(b"applied")
        try:
            return [(int(rv), float(stamp)) for rv, stamp in json.loads(line)["applied"]]
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"the oracle printed no applied list: {line[:200]!r}") from None

    async def _ask(self, request: bytes) -> bytes:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(request + b"\n")
        await stdin.drain()
        line = await stdout.readline()
        if not line:
            code = await self._process.wait()
            raise RuntimeError(f"the oracle exited with {code}; see its log")
        return line

    async def _progress(self, request: bytes) -> Snapshot:
        line = await self._ask(request)
        stamp = time.monotonic()
        try:
            progress = json.loads(line)
            resource_version = int(progress["resourceVersion"] or 0)
            lists = int(progress["lists"])
            return Snapshot(
                stamp=stamp,
                resource_version=resource_version,
                lists=lists,
                pods=int(progress["size"]),
                events=int(progress["events"]),
                synced=bool(progress.get("synced", lists > 0 and resource_version > 0)),
            )
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"the oracle printed no progress: {line[:200]!r}") from None

    async def wait_until(self, *, pods: int = 0, rv: int = 0, within: float) -> Snapshot:
        deadline = time.monotonic() + within
        while True:
            snap = await self.snapshot()
            if snap.synced and snap.pods >= pods and snap.resource_version >= rv:
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
    binary: Path,
    kubeconfig: Path,
    *,
    namespace: str,
    selector: str = SELECTOR,
    log: Path,
    flags: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> AsyncIterator[Oracle]:
    """``wrapper``: a command the oracle runs under (``bench/apiserver_callgrind.py``)."""
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            *wrapper,
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--selector={selector}",
            *flags,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=LINE_LIMIT,
        )
    try:
        yield Oracle(process)
    finally:
        await close_child(process, within=5.0)


async def baseline_rss(
    binary: Path, kubeconfig: Path, *, namespace: str, log: Path, flags: Sequence[str] = ()
) -> int:
    """RSS of an oracle synced to an empty selection: what it holds before any pod."""
    async with oracle_process(
        binary, kubeconfig, namespace=namespace, selector=EMPTY_SELECTOR, log=log, flags=flags
    ) as oracle:
        await oracle.wait_until(within=60.0)
        return rss_bytes(oracle.pid)
