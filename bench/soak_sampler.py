"""The soak's own process, sampled every few seconds: open file descriptors, asyncio tasks,
threads, RSS, Python objects and `tracemalloc`'s traced bytes and top allocations, with each
one's growth per hour fitted at the end. Go counterpart: none (a pprof heap profile plays it).

Every sample goes to a TSV file as it is taken, so a run that is stopped early still leaves them.
RSS is read before the tracemalloc snapshot, whose own transient memory would otherwise show in it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType

_MIB = 1024 * 1024
_TOP = 10


@dataclass(frozen=True)
class Sample:
    at: float
    rss_mib: float
    fds: int
    tasks: int
    threads: int
    gc_objects: int
    traced_mib: float
    stored_pods: int


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of `(seconds, value)` points, per hour; None under 3 points."""
    if len(points) < 3:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return 3600 * sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


class ResourceSampler:
    """`async with ResourceSampler(period=10, warmup=60, log_path=...) as sampler:` samples
    until the block ends; `report()` prints the table. Growth is fitted from `warmup` seconds on,
    and tracemalloc's top allocations are compared with its snapshot at the end of the warm-up."""

    def __init__(
        self,
        *,
        period: float,
        warmup: float,
        log_path: Path,
        stored_pods: Callable[[], int],
        trace_allocations: bool = True,
    ) -> None:
        self._stored_pods = stored_pods
        self._period = period
        self._warmup = warmup
        self._log_path = log_path
        self._trace = trace_allocations
        self._started = 0.0
        self._task: asyncio.Task[None] | None = None
        self.samples: list[Sample] = []
        self._baseline: tracemalloc.Snapshot | None = None
        self._latest: tracemalloc.Snapshot | None = None

    async def __aenter__(self) -> ResourceSampler:
        if self._trace:
            tracemalloc.start(1)
        self._started = time.monotonic()
        self._log_path.write_text("\t".join(f.name for f in fields(Sample)) + "\n")
        self._take()
        self._task = asyncio.create_task(self._run(), name="soak-resource-sampler")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._take()
        if self._trace:
            tracemalloc.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            self._take()

    def _take(self) -> None:
        at = time.monotonic() - self._started
        rss = _rss_mib()
        traced = tracemalloc.get_traced_memory()[0] / _MIB if self._trace else 0.0
        sample = Sample(
            at=round(at, 1),
            rss_mib=round(rss, 2),
            fds=len(os.listdir("/proc/self/fd")),
            tasks=len(asyncio.all_tasks()),
            threads=threading.active_count(),
            gc_objects=len(gc.get_objects()),
            traced_mib=round(traced, 2),
            stored_pods=self._stored_pods(),
        )
        self.samples.append(sample)
        with self._log_path.open("a") as log:
            log.write("\t".join(str(getattr(sample, f.name)) for f in fields(Sample)) + "\n")
        if self._trace:
            snapshot = tracemalloc.take_snapshot()
            if self._baseline is None and at >= self._warmup:
                self._baseline = snapshot
            self._latest = snapshot

    def report(self) -> str:
        after = [s for s in self.samples if s.at >= self._warmup]
        lines = [
            f"resources of the soak process, sampled every {self._period:.0f}s "
            f"({len(self.samples)} samples, {self.samples[-1].at:.0f}s); growth per hour is a "
            f"least-squares fit from {self._warmup:.0f}s on ({len(after)} samples)",
            f"  {'what':<12} {'first':>10} {'last':>10} {'min':>10} {'max':>10} {'per hour':>10}",
        ]
        for name in (
            "rss_mib",
            "fds",
            "tasks",
            "threads",
            "gc_objects",
            "traced_mib",
            "stored_pods",
        ):
            values = [float(getattr(s, name)) for s in self.samples]
            slope = slope_per_hour([(s.at, float(getattr(s, name))) for s in after])
            per_hour = "n/a" if slope is None else f"{slope:+.1f}"
            lines.append(
                f"  {name:<12} {values[0]:>10.1f} {values[-1]:>10.1f} {min(values):>10.1f} "
                f"{max(values):>10.1f} {per_hour:>10}"
            )
        per_pod = slope_per_hour([(float(s.stored_pods), s.rss_mib) for s in after])
        if per_pod is not None:
            lines.append(
                f"RSS against the pods stored: {per_pod / 3600 * 1024:+.1f} KiB per pod "
                "(least-squares slope over the same samples; growth that tracks the pool is data)"
            )
        lines += self._top_growth()
        return "\n".join(lines)

    def _top_growth(self) -> list[str]:
        if not self._trace:
            return ["tracemalloc: off"]
        if self._baseline is None or self._latest is None or self._baseline is self._latest:
            return ["tracemalloc: the run ended before the warm-up did, no growth to compare"]
        lines = [f"tracemalloc: top {_TOP} growths by line since the end of the warm-up"]
        for stat in self._latest.compare_to(self._baseline, "lineno")[:_TOP]:
            frame = stat.traceback[0]
            lines.append(
                f"  {stat.size_diff / _MIB:+8.2f} MiB {stat.count_diff:+8d} blocks  "
                f"{frame.filename}:{frame.lineno}"
            )
        return lines
