"""A process of the soak, sampled every few seconds: open file descriptors, asyncio tasks,
threads, RSS, glibc's heap (in use and free), Python objects and collections, and `tracemalloc`'s
traced bytes and top allocations, with each one's growth per hour fitted at the end. Go
counterpart: none (a pprof heap profile plays it).

`rss_anon_mib` is RSS less mapped files (glibc's heap, pymalloc's arenas, thread stacks);
`heap_used_mib` and `heap_free_mib` are glibc's `mallinfo2()` over all arenas (mmapped blocks
counted as used); `pymalloc_arenas_mib` and `pymalloc_used_mib` are Python's small-object
allocator's arenas (mmapped, outside glibc's heap) and the bytes in use in them (NaN while
tracemalloc traces: its hooks hide pymalloc from `sys._debugmallocstats`), and
`anon_off_heap_mib` the anonymous RSS outside glibc's heap (pymalloc's arenas, stacks);
`tracemalloc_own_mib` is tracemalloc's own bookkeeping, itself on that heap.

Every sample goes to a TSV file as it is taken, so a run that is stopped early still leaves them.
RSS is read before the tracemalloc snapshot, whose own transient memory would otherwise show in it.
At the end the report says how much RSS `malloc_trim(0)` gives back (heap glibc holds free) and
which Python types grew in number since the warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import itertools
import os
import re
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

_MIB = 1024 * 1024
_ARENA = 1024 * 1024
"""pymalloc's arena size since Python 3.10."""
_TOP = 10


@dataclass(frozen=True)
class Sample:
    at: float
    rss_mib: float
    rss_anon_mib: float
    rss_less_pods_mib: float
    heap_used_mib: float
    heap_free_mib: float
    anon_off_heap_mib: float
    pymalloc_arenas_mib: float
    pymalloc_used_mib: float
    fds: int
    tasks: int
    threads: int
    gc_objects: int
    gc_collections: int
    traced_mib: float
    tracemalloc_own_mib: float
    stored_pods: int
    lists: int


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallinfo2") or not hasattr(libc, "malloc_trim"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def heap_mib(libc: ctypes.CDLL | None) -> tuple[float, float]:
    """glibc's heap over all arenas: bytes in use (mmapped blocks included) and bytes free but
    kept; (nan, nan) without glibc 2.33's `mallinfo2`."""
    if libc is None:
        return float("nan"), float("nan")
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / _MIB, info.fordblks / _MIB


def pymalloc_mib() -> tuple[float, float]:
    """pymalloc's arenas (1 MiB each, outside glibc's heap) and the bytes in their allocated
    blocks, from `sys._debugmallocstats()`, which writes to file descriptor 2."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    pattern = r"^# (arenas allocated current|bytes in allocated blocks)\s*=\s*([\d,]+)"
    found = dict(re.findall(pattern, text, re.MULTILINE))
    if len(found) < 2:
        return float("nan"), float("nan")
    arenas = int(found["arenas allocated current"].replace(",", ""))
    used = int(found["bytes in allocated blocks"].replace(",", ""))
    return arenas * _ARENA / _MIB, used / _MIB


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    return status_mib("VmRSS")


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


@dataclass(kw_only=True, eq=False)
class ResourceSampler:
    """`async with ResourceSampler(period=10, warmup=60, log_path=...) as sampler:` samples
    until the block ends; `report()` prints the table. Growth is fitted from `warmup` seconds on,
    and tracemalloc's top allocations are compared with its snapshot at the end of the warm-up.
    `rss_less_pods_mib` is RSS minus `pod_kib` per stored pod: the growth the pool does not
    explain."""

    period: float
    warmup: float
    log_path: Path
    stored_pods: Callable[[], int]
    lists: Callable[[], int] = lambda: 0
    trace_allocations: bool = True
    title: str = "the soak process"
    pod_kib: float = 0.0
    glibc: ctypes.CDLL | None = field(default_factory=glibc, init=False)
    samples: list[Sample] = field(default_factory=list, init=False)
    _types_at_warmup: Counter[str] | None = field(default=None, init=False)
    _types_growth: list[str] = field(default_factory=list, init=False)
    _trimmed: tuple[float, float] | None = field(default=None, init=False)
    _started: float = field(default=0.0, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _baseline: tracemalloc.Snapshot | None = field(default=None, init=False)
    _latest: tracemalloc.Snapshot | None = field(default=None, init=False)

    async def __aenter__(self) -> ResourceSampler:
        if self.trace_allocations:
            tracemalloc.start(1)
        self._started = time.monotonic()
        self.log_path.write_text("\t".join(f.name for f in fields(Sample)) + "\n")
        self._take()
        self._task = asyncio.create_task(self._run(), name="soak-resource-sampler")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._take()
        self._types_growth = self._type_growth()
        self._trimmed = self._trim()
        if self.trace_allocations:
            tracemalloc.stop()

    def _trim(self) -> tuple[float, float] | None:
        """RSS before and after `malloc_trim(0)`: what glibc held free and now gives back."""
        if self.glibc is None:
            return None
        before = rss_mib()
        self.glibc.malloc_trim(0)
        return before, rss_mib()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self._take()

    def _take(self) -> None:
        at = time.monotonic() - self._started
        rss, anon = rss_mib(), status_mib("RssAnon")
        used, free = heap_mib(self.glibc)
        arenas, in_arenas = pymalloc_mib()
        traced = tracemalloc.get_traced_memory()[0] / _MIB if self.trace_allocations else 0.0
        pods = self.stored_pods()
        sample = Sample(
            at=round(at, 1),
            rss_mib=round(rss, 2),
            rss_anon_mib=round(anon, 2),
            rss_less_pods_mib=round(rss - pods * self.pod_kib / 1024, 2),
            heap_used_mib=round(used, 2),
            heap_free_mib=round(free, 2),
            anon_off_heap_mib=round(anon - used - free, 2),
            pymalloc_arenas_mib=round(arenas, 2),
            pymalloc_used_mib=round(in_arenas, 2),
            fds=len(os.listdir("/proc/self/fd")),
            tasks=len(asyncio.all_tasks()),
            threads=_os_threads(),
            gc_objects=len(gc.get_objects()),
            gc_collections=sum(stat["collections"] for stat in gc.get_stats()),
            traced_mib=round(traced, 2),
            tracemalloc_own_mib=round(tracemalloc.get_tracemalloc_memory() / _MIB, 2),
            stored_pods=pods,
            lists=self.lists(),
        )
        if self._types_at_warmup is None and at >= self.warmup:
            self._types_at_warmup = _type_counts()
        self.samples.append(sample)
        with self.log_path.open("a") as log:
            log.write("\t".join(str(getattr(sample, f.name)) for f in fields(Sample)) + "\n")
        if self.trace_allocations:
            snapshot = tracemalloc.take_snapshot()
            if self._baseline is None and at >= self.warmup:
                self._baseline = snapshot
            self._latest = snapshot

    def report(self) -> str:
        lines = summarize(
            self.samples,
            title=f"{self.title} (pid {os.getpid()})",
            period=self.period,
            warmup=self.warmup,
            pod_kib=self.pod_kib,
        )
        if self._trimmed is not None:
            rss_before, rss_after = self._trimmed
            lines.append(
                f"malloc_trim(0) at the end: RSS {rss_before:.1f} -> {rss_after:.1f} MiB "
                f"({rss_after - rss_before:+.1f} MiB: heap glibc held free and gave back)"
            )
        lines += self._types_growth
        lines += self._top_growth()
        return "\n".join(lines)

    def _type_growth(self) -> list[str]:
        if self._types_at_warmup is None:
            return []
        growth = _type_counts()
        growth.subtract(self._types_at_warmup)
        top = [(name, n) for name, n in growth.most_common(_TOP) if n > 0]
        return [f"Python objects: top {_TOP} growths by type since the end of the warm-up"] + [
            f"  {n:+8d}  {name}" for name, n in top
        ]

    def _top_growth(self) -> list[str]:
        if not self.trace_allocations:
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


def summarize(
    samples: list[Sample], *, title: str, period: float, warmup: float, pod_kib: float
) -> list[str]:
    """The table of every column's first, last, min, max and growth per hour after `warmup`,
    and RSS against the pods stored."""
    after = [s for s in samples if s.at >= warmup]
    lines = [
        f"resources of {title}, sampled every {period:.0f}s "
        f"({len(samples)} samples, {samples[-1].at:.0f}s); growth per hour is a "
        f"least-squares fit from {warmup:.0f}s on ({len(after)} samples)",
        f"  {'what':<17} {'first':>10} {'last':>10} {'min':>10} {'max':>10} {'per hour':>10}",
    ]
    for name in (f.name for f in fields(Sample) if f.name != "at"):
        values = [float(getattr(s, name)) for s in samples]
        slope = slope_per_hour([(s.at, float(getattr(s, name))) for s in after])
        per_hour = "n/a" if slope is None else f"{slope:+.1f}"
        lines.append(
            f"  {name:<17} {values[0]:>10.1f} {values[-1]:>10.1f} {min(values):>10.1f} "
            f"{max(values):>10.1f} {per_hour:>10}"
        )
    per_pod = slope_per_hour([(float(s.stored_pods), s.rss_mib) for s in after])
    if per_pod is not None:
        lines.append(
            f"RSS against the pods stored: {per_pod / 3600 * 1024:+.1f} KiB per pod "
            "(least-squares slope over the same samples; growth that tracks the pool is data)"
        )
    peak = list(itertools.accumulate((s.stored_pods for s in samples), max))[-len(after) :]
    for pods, what in (
        ([s.stored_pods for s in after], "the pods stored"),
        (peak, "the most pods stored so far"),
    ):
        fit = pods_and_time_fit(after, pods)
        if fit is not None:
            lines.append(
                f"RSS fitted to {what} and the time together: {fit[0]:+.1f} KiB per pod, "
                f"{fit[1]:+.1f} MiB per hour (the growth the pool does not explain)"
            )
    if any(s.traced_mib > 0 for s in after):
        lines += _untraced(after)
    first, last = after[0] if after else samples[0], samples[-1]
    if first.stored_pods and last.stored_pods:
        lines.append(
            f"RSS per stored pod: {first.rss_mib * 1024 / first.stored_pods:.0f} KiB at "
            f"{first.at:.0f}s ({first.stored_pods} pods), "
            f"{last.rss_mib * 1024 / last.stored_pods:.0f} KiB at {last.at:.0f}s "
            f"({last.stored_pods} pods)"
        )
    if pod_kib:
        lines.append(
            f"rss_less_pods_mib is RSS minus {pod_kib:.1f} KiB per stored pod "
            "(bench/apiserver.py's RSS per pod for ours)"
        )
    return lines


def pods_and_time_fit(samples: list[Sample], counts: list[int]) -> tuple[float, float] | None:
    """RSS as `a + b * counts + c * hours` by least squares (`counts` a pod count per sample):
    (b in KiB per pod, c in MiB per hour), or None when the pods and the time do not vary
    independently enough to tell them apart."""
    fit = two_term_fit(
        [float(count) for count in counts],
        [s.at / 3600 for s in samples],
        [s.rss_mib for s in samples],
    )
    return None if fit is None else (fit[0] * 1024, fit[1])


def two_term_fit(
    first: list[float], second: list[float], values: list[float]
) -> tuple[float, float] | None:
    """`values` as `a + b * first + c * second` by least squares: (b, c), or None under 4 points
    or when `first` and `second` are (nearly) proportional."""
    n = len(values)
    if n < 4:
        return None
    m1, m2, mv = sum(first) / n, sum(second) / n, sum(values) / n
    s11 = sum((x - m1) ** 2 for x in first)
    s22 = sum((y - m2) ** 2 for y in second)
    s12 = sum((x - m1) * (y - m2) for x, y in zip(first, second, strict=True))
    s1v = sum((x - m1) * (v - mv) for x, v in zip(first, values, strict=True))
    s2v = sum((y - m2) * (v - mv) for y, v in zip(second, values, strict=True))
    det = s11 * s22 - s12**2
    if s11 == 0 or s22 == 0 or det <= 1e-9 * s11 * s22:
        return None
    return (s1v * s22 - s2v * s12) / det, (s2v * s11 - s1v * s12) / det


def read_samples(path: Path) -> list[Sample]:
    """The samples of a TSV this sampler wrote (a column it did not write yet reads as NaN)."""
    rows = path.read_text().splitlines()
    header = rows[0].split("\t")
    samples = []
    for row in rows[1:]:
        raw = dict(zip(header, row.split("\t"), strict=True))
        values: dict[str, Any] = {}
        for f in fields(Sample):
            text = raw.get(f.name, "nan")
            values[f.name] = int(float(text)) if f.type == "int" and text != "nan" else float(text)
        samples.append(Sample(**values))
    return samples


def main() -> int:
    """`python -m bench.soak_sampler FILE.tsv [--warmup S]`: the summary of a run's samples."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("tsv", type=Path)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--pod-kib", type=float, default=0.0)
    args = parser.parse_args()
    samples = read_samples(args.tsv)
    period = samples[1].at - samples[0].at if len(samples) > 1 else 0.0
    lines = summarize(
        samples, title=str(args.tsv), period=period, warmup=args.warmup, pod_kib=args.pod_kib
    )
    print("\n".join(lines))
    return 0


def _untraced(after: list[Sample]) -> list[str]:
    """Live Python memory per stored pod, and the RSS growth tracemalloc does not see: what the
    allocators hold beyond live objects, and native allocations of C libraries."""
    lines = []
    traced_per_pod = slope_per_hour([(float(s.stored_pods), s.traced_mib) for s in after])
    if traced_per_pod is not None:
        lines.append(
            f"tracemalloc's traced bytes against the pods stored: "
            f"{traced_per_pod / 3600 * 1024:+.1f} KiB per pod (live Python memory per pod)"
        )
    untraced = slope_per_hour(
        [(s.at, s.rss_mib - s.traced_mib - s.tracemalloc_own_mib) for s in after]
    )
    if untraced is not None:
        lines.append(
            f"RSS less traced bytes and tracemalloc's own: {untraced:+.1f} MiB per hour "
            "(held by the allocators beyond live objects, or allocated natively)"
        )
    return lines


def _type_counts() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


if __name__ == "__main__":
    sys.exit(main())
