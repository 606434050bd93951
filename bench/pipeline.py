"""In-memory benchmark of the runtime core (driver, store, queue, worker) against a floor.

Run from the repository root::

    .venv/bin/python bench/pipeline.py            # 10k and 100k pods over 1k parents
    .venv/bin/python bench/pipeline.py --quick    # 10k pods only (CI smoke)
    .venv/bin/python bench/pipeline.py --json     # machine-readable output

Every figure is measured twice in the same process, once through ``ReconcileLoop`` ("ours") and
once through ``FloorLoop``, the simplest correct hand-written code doing the same work: a dict store
with a parent index, an insertion-ordered dedup queue and one consumer. Both read the same source
and call the same reconcile. The cost ratio is ours/floor for times and bytes and floor/ours for
rates, so above 1 always means ours is slower or bigger.

The machine is shared and noisy, so: times are this thread's CPU time unless ``--clock wall``;
each figure is the median over ``--rounds`` rounds, each pass of a round runs ours and the floor
back to back (alternating which goes first), and the cost ratio is the median of those paired
ratios. The best ratio, best sample against best sample, is printed beside it: interference only
ever slows a run down, so it estimates the cost without the noise. Memory is measured in its own
pass under tracemalloc, once per implementation (it is deterministic). The exit status is 1 when
a cost ratio at 100k pods misses its target: 1.3 for every median, 1.5 for the p99 latency.

A third implementation, ``metrics``, is ours with a Prometheus registry (``prometheus_client``,
the ``metrics`` extra; skipped with one line without it, or with ``--no-metrics``); the
``overhead`` column is its paired ratio against ours, whose target is at most 1.05.

Workloads, over ``--parents`` parents (pods are spread round-robin):
- start: ``start()`` until every parent has been reconciled once, reconcile reading its members;
- burst / streamed: 100k mixed events (40% updates, 20% moves to another parent, 20% deletes,
  20% re-adds of deleted pods) until the last one is reconciled, the source yielding them with no
  await in between (burst) or awaiting ``asyncio.sleep(0)`` after each, as a network stream does;
- latency: one update at a time on an idle loop, from the source yielding it to the reconcile of
  its parent starting;
- memory: traced bytes per stored pod at the peak of start and retained after it, the pods' own
  bytes excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from miles.utils.workers.reconcile.clock import RealClock
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ObjectKey,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
    UpsertEvent,
)

logger = logging.getLogger("bench.pipeline")

ReconcileFn = Callable[[ParentKey], Awaitable[None]]
KeyMapFn = Callable[[Any], ParentKey | None]
Now = Callable[[], float]
CLOCKS: dict[str, Now] = {"cpu": time.thread_time, "wall": time.perf_counter}
TARGET_RATIO = 1.3
TARGET_P99_RATIO = 1.5
TARGET_METRICS_OVERHEAD = 1.05
TARGET_PODS = 100_000
DRAIN_MARKER_PARENT = "~drained"


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    parent: ParentKey
    version: int


def parent_of(pod: Pod) -> ParentKey:
    return pod.parent


# --- the floor ------------------------------------------------------------------------------------


class FloorLoop:
    """The same work as ``ReconcileLoop`` by the simplest correct hand-written code.

    Same semantics: the store is written before the parent is queued; a queued parent keeps its
    place; a move queues both parents; a delete of an unknown key queues ``key_map(last_obj)``; a
    replace queues every parent with members afterwards plus every parent left empty; a stream
    that does not open with a replace is reopened; a failed reconcile is retried.
    """

    def __init__(
        self,
        *,
        source: SourceWatchFn,
        reconcile: ReconcileFn,
        key_map: KeyMapFn,
        retry_delay: float = 1.0,
    ) -> None:
        self._source = source
        self._reconcile = reconcile
        self._key_map = key_map
        self._retry_delay = retry_delay
        self._parent_of: dict[ObjectKey, ParentKey] = {}
        self._members: dict[ParentKey, dict[ObjectKey, Any]] = {}
        self._queue: deque[ParentKey] = deque()
        self._queued: set[ParentKey] = set()
        self._wakeup = asyncio.Event()
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def get_by_parent(self, parent: ParentKey) -> list[Any]:
        members = self._members.get(parent)
        if not members:
            return []
        return [members[key] for key in sorted(members)]

    def parent_keys(self) -> set[ParentKey]:
        return set(self._members)

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._work())]
        await self._synced.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _pump(self) -> None:
        while True:
            stream = self._source()
            try:
                first = await anext(stream)
                if isinstance(first, ReplaceEvent):
                    self._replace(first.objects)
                    async for event in stream:
                        self._apply(event)
            except Exception:
                logger.exception("floor: source stream failed")
            finally:
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()
            await asyncio.sleep(self._retry_delay)

    async def _work(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            parent = self._queue.popleft()
            self._queued.discard(parent)
            try:
                await self._reconcile(parent)
            except Exception:
                logger.exception("floor: reconcile of %r failed", parent)
                asyncio.get_running_loop().call_later(self._retry_delay, self._enqueue, parent)

    def _enqueue(self, parent: ParentKey) -> None:
        if parent in self._queued:
            return
        self._queued.add(parent)
        self._queue.append(parent)
        self._wakeup.set()

    def _apply(self, event: SourceEvent) -> None:
        if isinstance(event, UpsertEvent):
            self._upsert(event.key, event.obj)
        elif isinstance(event, DeleteEvent):
            self._delete(event.key, event.last_obj)
        else:
            self._replace(event.objects)

    def _upsert(self, key: ObjectKey, obj: Any) -> None:
        parent = self._parent_for(key, obj)
        previous = self._parent_of.get(key)
        if previous is not None and previous != parent:
            self._unlink(key, previous)
            self._enqueue(previous)
        if parent is None:
            self._parent_of.pop(key, None)
            return
        self._parent_of[key] = parent
        members = self._members.get(parent)
        if members is None:
            self._members[parent] = {key: obj}
        else:
            members[key] = obj
        self._enqueue(parent)

    def _delete(self, key: ObjectKey, last_obj: Any) -> None:
        parent = self._parent_of.pop(key, None)
        if parent is None:
            parent = self._parent_for(key, last_obj)
        else:
            self._unlink(key, parent)
        if parent is not None:
            self._enqueue(parent)

    def _replace(self, objects: Mapping[ObjectKey, Any]) -> None:
        before = self._members
        self._parent_of = {}
        self._members = {}
        for key, obj in objects.items():
            parent = self._parent_for(key, obj)
            if parent is None:
                continue
            self._parent_of[key] = parent
            members = self._members.get(parent)
            if members is None:
                self._members[parent] = {key: obj}
            else:
                members[key] = obj
        for parent in self._members.keys() | before.keys():
            self._enqueue(parent)
        self._synced.set()

    def _parent_for(self, key: ObjectKey, obj: Any) -> ParentKey | None:
        try:
            return self._key_map(obj)
        except Exception as exc:
            logger.error("floor: key_map raised for %r: %r", key, exc)
            return None

    def _unlink(self, key: ObjectKey, parent: ParentKey) -> None:
        members = self._members[parent]
        del members[key]
        if not members:
            del self._members[parent]


# --- what both pipelines are driven by ------------------------------------------------------------


class Pipeline(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def get_by_parent(self, parent: ParentKey) -> list[Any]: ...


PipelineFactory = Callable[[SourceWatchFn, ReconcileFn], Pipeline]


def ours(source: SourceWatchFn, reconcile: ReconcileFn) -> Pipeline:
    return ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of, clock=RealClock())


def ours_with_metrics(source: SourceWatchFn, reconcile: ReconcileFn) -> Pipeline:
    from prometheus_client import CollectorRegistry

    return ReconcileLoop(
        source=source,
        reconcile=reconcile,
        key_map=parent_of,
        clock=RealClock(),
        metrics=CollectorRegistry(),
    )


def floor(source: SourceWatchFn, reconcile: ReconcileFn) -> Pipeline:
    return FloorLoop(source=source, reconcile=reconcile, key_map=parent_of)


IMPLEMENTATIONS: dict[str, PipelineFactory] = {
    "ours": ours,
    "floor": floor,
    "metrics": ours_with_metrics,
}
"""``metrics`` is ours with a Prometheus registry: its cost against ``ours`` is the overhead."""


class Feed:
    """The source: a whole-world listing, then every batch the bench emits, in order."""

    def __init__(self, world: Mapping[ObjectKey, Pod], *, streamed: bool, now: Now) -> None:
        self._world = world
        self._streamed = streamed
        self._now = now
        self._batches: asyncio.Queue[Sequence[SourceEvent]] = asyncio.Queue()
        self.emitted_at = 0.0

    def emit(self, batch: Sequence[SourceEvent]) -> None:
        self._batches.put_nowait(batch)

    async def watch(self) -> AsyncIterator[SourceEvent]:
        yield ReplaceEvent(self._world)
        while True:
            batch = await self._batches.get()
            if len(batch) == 1:
                self.emitted_at = self._now()
                yield batch[0]
            elif self._streamed:
                for event in batch:
                    yield event
                    await asyncio.sleep(0)
            else:
                for event in batch:
                    yield event


class Probe:
    """The reconcile both pipelines call: reads a parent's members, signals the bench."""

    def __init__(self, *, now: Now) -> None:
        self.read: Callable[[ParentKey], list[Any]] = lambda parent: []
        self.reconciles = 0
        self.objects_read = 0
        self._now = now
        self._pending: set[ParentKey] = set()
        self._target: ParentKey | None = None
        self._reached: asyncio.Future[float] | None = None

    def expect_all(self, parents: set[ParentKey]) -> asyncio.Future[float]:
        """Resolves, with the time it started, once each of ``parents`` has been reconciled."""
        self._pending = set(parents)
        self._target = None
        return self._arm()

    def expect(self, parent: ParentKey) -> asyncio.Future[float]:
        """Resolves with the time the next reconcile of ``parent`` started."""
        self._pending = set()
        self._target = parent
        return self._arm()

    def _arm(self) -> asyncio.Future[float]:
        self._reached = asyncio.get_running_loop().create_future()
        return self._reached

    async def reconcile(self, parent: ParentKey) -> None:
        started = self._now()
        self.reconciles += 1
        self.objects_read += len(self.read(parent))
        reached = self._reached
        if reached is None:
            return
        if self._pending:
            self._pending.discard(parent)
            if self._pending:
                return
        elif parent != self._target:
            return
        self._reached = None
        reached.set_result(started)


# --- the workload ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    world: dict[ObjectKey, Pod]
    parents: set[ParentKey]
    mixed: list[SourceEvent]
    """The mixed events, then one upsert moving the drain marker under ``DRAIN_MARKER_PARENT``."""
    mixed_events: int
    latency: list[UpsertEvent]
    """Updates to pods alive after ``mixed``, one parent each."""


class _Population:
    """Live pods with O(1) random choice and removal."""

    def __init__(self, pods: Mapping[ObjectKey, Pod]) -> None:
        self.pods = dict(pods)
        self._names = list(pods)
        self._slot = {name: i for i, name in enumerate(self._names)}

    def __len__(self) -> int:
        return len(self._names)

    def pick(self, rng: random.Random) -> Pod:
        return self.pods[self._names[rng.randrange(len(self._names))]]

    def put(self, pod: Pod) -> None:
        if pod.name not in self._slot:
            self._slot[pod.name] = len(self._names)
            self._names.append(pod.name)
        self.pods[pod.name] = pod

    def remove(self, name: ObjectKey) -> Pod:
        slot = self._slot.pop(name)
        last = self._names.pop()
        if last != name:
            self._names[slot] = last
            self._slot[last] = slot
        return self.pods.pop(name)


def build_workload(*, pods: int, parents: int, events: int, samples: int, seed: int) -> Workload:
    rng = random.Random(seed)
    parent_names = [f"cell-{i:05d}" for i in range(parents)]
    world = {
        name: Pod(name, parent_names[i % parents], 0)
        for i, name in ((i, f"pod-{i:07d}") for i in range(pods))
    }
    live = _Population(world)
    deleted: list[Pod] = []
    mixed: list[SourceEvent] = []
    for _ in range(events):
        roll = rng.random()
        if (roll < 0.2 and deleted) or not live:
            slot = rng.randrange(len(deleted))
            gone = deleted[slot]
            deleted[slot] = deleted[-1]
            deleted.pop()
            pod = Pod(gone.name, rng.choice(parent_names), gone.version + 1)
            live.put(pod)
            mixed.append(UpsertEvent(pod.name, pod))
        elif roll < 0.4:
            gone = live.remove(live.pick(rng).name)
            deleted.append(gone)
            mixed.append(DeleteEvent(gone.name, gone))
        elif roll < 0.6:
            old = live.pick(rng)
            parent = rng.choice(parent_names)
            while parent == old.parent and parents > 1:
                parent = rng.choice(parent_names)
            pod = Pod(old.name, parent, old.version + 1)
            live.put(pod)
            mixed.append(UpsertEvent(pod.name, pod))
        else:
            old = live.pick(rng)
            pod = Pod(old.name, old.parent, old.version + 1)
            live.put(pod)
            mixed.append(UpsertEvent(pod.name, pod))
    marker = Pod("~marker", DRAIN_MARKER_PARENT, 0)
    mixed.append(UpsertEvent(marker.name, marker))
    latency: list[UpsertEvent] = []
    for _ in range(samples):
        old = live.pick(rng)
        pod = Pod(old.name, old.parent, old.version + 1)
        live.put(pod)
        latency.append(UpsertEvent(pod.name, pod))
    return Workload(
        world=world,
        parents=set(parent_names[: min(pods, parents)]),
        mixed=mixed,
        mixed_events=events,
        latency=latency,
    )


# --- measurements ---------------------------------------------------------------------------------


@dataclass
class Memory:
    peak_bytes_per_pod: float
    retained_bytes_per_pod: float


class RunningPipeline:
    """A pipeline on its own feed and probe: the timed phases start it, ``async with`` stops it."""

    def __init__(
        self, factory: PipelineFactory, workload: Workload, *, streamed: bool, now: Now
    ) -> None:
        self.workload = workload
        self.now = now
        self.feed = Feed(workload.world, streamed=streamed, now=now)
        self.probe = Probe(now=now)
        self.pipeline = factory(self.feed.watch, self.probe.reconcile)
        self.probe.read = self.pipeline.get_by_parent

    async def __aenter__(self) -> RunningPipeline:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.pipeline.stop()

    async def start(self) -> float:
        reached = self.probe.expect_all(self.workload.parents)
        began = self.now()
        await self.pipeline.start()
        await reached
        return self.now() - began

    async def drain_mixed(self) -> tuple[float, int]:
        """Events per second until the last one is reconciled, and the reconciles it took."""
        reached = self.probe.expect(DRAIN_MARKER_PARENT)
        reconciles = self.probe.reconciles
        began = self.now()
        self.feed.emit(self.workload.mixed)
        await reached
        elapsed = self.now() - began
        return self.workload.mixed_events / elapsed, self.probe.reconciles - reconciles

    async def latencies(self) -> list[float]:
        samples: list[float] = []
        for event in self.workload.latency:
            reached = self.probe.expect(parent_of(event.obj))
            self.feed.emit((event,))
            started = await reached
            samples.append(started - self.feed.emitted_at)
        return samples


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def measure_pass(
    factory: PipelineFactory, workload: Workload, *, streamed: bool, phase_timeout: float, now: Now
) -> dict[str, float | None]:
    """One pipeline: start, then the mixed events, then (burst only) the latency samples."""
    mode = "streamed" if streamed else "burst"
    measured: dict[str, float | None] = {}
    async with RunningPipeline(factory, workload, streamed=streamed, now=now) as running:
        try:
            async with asyncio.timeout(phase_timeout):
                measured["start_s"] = await running.start()
            async with asyncio.timeout(phase_timeout):
                rate, reconciles = await running.drain_mixed()
            measured[f"{mode}_events_per_s"] = rate
            measured[f"{mode}_reconciles"] = reconciles
            if not streamed and workload.latency:
                async with asyncio.timeout(phase_timeout):
                    samples = await running.latencies()
                measured["latency_median_s"] = statistics.median(samples)
                measured["latency_p99_s"] = _p99(samples)
        except TimeoutError:
            print(f"{mode}: timed out after {phase_timeout:.0f}s: {measured}", file=sys.stderr)
    return measured


async def measure_memory(factory: PipelineFactory, workload: Workload) -> Memory:
    """Traced bytes the pipeline adds per pod: at the peak of start, and retained after it."""
    async with RunningPipeline(factory, workload, streamed=False, now=time.perf_counter) as running:
        gc.collect()
        baseline, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        await running.start()
        _, peak = tracemalloc.get_traced_memory()
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    pods = len(workload.world)
    return Memory((peak - baseline) / pods, (retained - baseline) / pods)


def run_memory(factory: PipelineFactory, workload: Workload) -> Memory:
    tracemalloc.start()
    try:
        return asyncio.run(measure_memory(factory, workload))
    finally:
        tracemalloc.stop()


# --- report ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    scale: float
    higher_is_better: bool
    targeted: bool = True


METRICS: dict[str, Metric] = {
    "start_s": Metric("start until every parent reconciled", "ms", 1e3, False),
    "burst_events_per_s": Metric("mixed events, burst", "kev/s", 1e-3, True),
    "streamed_events_per_s": Metric("mixed events, streamed", "kev/s", 1e-3, True),
    "latency_median_s": Metric("event-to-reconcile latency, median", "us", 1e6, False),
    "latency_p99_s": Metric("event-to-reconcile latency, p99", "us", 1e6, False),
    "burst_reconciles": Metric("reconciles per mixed drain, burst", "n", 1.0, False, False),
    "streamed_reconciles": Metric("reconciles per mixed drain, streamed", "n", 1.0, False, False),
    "peak_bytes_per_pod": Metric("peak memory per pod (start)", "B", 1.0, False),
    "retained_bytes_per_pod": Metric("retained memory per pod", "B", 1.0, False),
}


@dataclass
class Row:
    metric: str
    description: str
    unit: str
    pods: int
    parents: int
    ours: float | None
    floor: float | None
    cost_ratio: float | None
    """The median of the ratios of samples taken back to back, not the ratio of the medians."""
    best_ratio: float | None
    """The best sample of ours against the best of the floor: what is left once noise only slows."""
    ours_samples: list[float | None]
    floor_samples: list[float | None]
    metrics: float | None = None
    metrics_overhead: float | None = None
    """Ours with metrics against ours, the median of paired ratios (>1 = metrics cost)."""
    metrics_samples: list[float | None] | None = None


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    if len(present) < len(values) or not present:
        return None
    return statistics.median(present)


def _cost_ratio(
    metric: Metric, ours_value: float | None, floor_value: float | None
) -> float | None:
    if ours_value is None or floor_value is None or min(ours_value, floor_value) <= 0:
        return None
    return floor_value / ours_value if metric.higher_is_better else ours_value / floor_value


def _best(metric: Metric, values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    if not present:
        return None
    return max(present) if metric.higher_is_better else min(present)


def make_rows(
    pods: int, parents: int, values: dict[str, dict[str, list[float | None]]]
) -> list[Row]:
    rows = []
    for key, metric in METRICS.items():
        ours_samples, floor_samples = values["ours"][key], values["floor"][key]
        metrics_samples = values["metrics"][key]
        paired = _paired(metric, ours_samples, floor_samples)
        rows.append(
            Row(
                metric=key,
                description=metric.name,
                unit=metric.unit,
                pods=pods,
                parents=parents,
                ours=_median(ours_samples),
                floor=_median(floor_samples),
                cost_ratio=_median(paired),
                best_ratio=_cost_ratio(
                    metric, _best(metric, ours_samples), _best(metric, floor_samples)
                ),
                ours_samples=ours_samples,
                floor_samples=floor_samples,
                metrics=_median(metrics_samples) if metrics_samples else None,
                metrics_overhead=_median(_paired(metric, metrics_samples, ours_samples))
                if metrics_samples
                else None,
                metrics_samples=metrics_samples,
            )
        )
    return rows


def _paired(
    metric: Metric, mine: list[float | None], against: list[float | None]
) -> list[float | None]:
    return [_cost_ratio(metric, one, other) for one, other in zip(mine, against, strict=False)]


def _fmt(value: float | None, scale: float) -> str:
    if value is None:
        return "-"
    scaled = value * scale
    return f"{scaled:,.0f}" if abs(scaled) >= 100 else f"{scaled:,.2f}"


def target_of(metric: str) -> float:
    return TARGET_P99_RATIO if metric.endswith("_p99_s") else TARGET_RATIO


def _misses_target(row: Row) -> bool:
    if not METRICS[row.metric].targeted or row.pods < TARGET_PODS:
        return False
    return row.cost_ratio is None or row.cost_ratio > target_of(row.metric)


def _misses_metrics_target(row: Row) -> bool:
    if not METRICS[row.metric].targeted or row.pods < TARGET_PODS or row.metrics_samples is None:
        return False
    return row.metrics_overhead is None or row.metrics_overhead > TARGET_METRICS_OVERHEAD


def print_table(rows: list[Row]) -> None:
    header = f"{'metric':38} {'pods':>7} {'parents':>7} {'unit':>5} {'ours':>10} {'floor':>10}"
    print(f"{header} {'cost ratio':>10} {'best ratio':>10} {'+metrics':>10} {'overhead':>8}")
    for row in rows:
        scale = METRICS[row.metric].scale
        flag = " !" if _misses_target(row) else ""
        flag += " m!" if _misses_metrics_target(row) else ""
        print(
            f"{row.description:38} {row.pods:>7} {row.parents:>7} {row.unit:>5}"
            f" {_fmt(row.ours, scale):>10} {_fmt(row.floor, scale):>10}"
            f" {_fmt_ratio(row.cost_ratio):>10} {_fmt_ratio(row.best_ratio):>10}"
            f" {_fmt(row.metrics, scale):>10} {_fmt_ratio(row.metrics_overhead):>8}{flag}"
        )


def _fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


# --- driver ---------------------------------------------------------------------------------------


PASS_METRICS = {
    False: (
        "start_s",
        "burst_events_per_s",
        "burst_reconciles",
        "latency_median_s",
        "latency_p99_s",
    ),
    True: ("start_s", "streamed_events_per_s", "streamed_reconciles"),
}


def run_size(
    *, pods: int, args: argparse.Namespace, impls: list[str]
) -> dict[str, dict[str, list[float | None]]]:
    """Samples per implementation and metric; the i-th samples of each were taken back to back."""
    workload = build_workload(
        pods=pods,
        parents=args.parents,
        events=args.events,
        samples=args.samples,
        seed=args.seed,
    )
    values: dict[str, dict[str, list[float | None]]] = {
        name: {key: [] for key in METRICS} for name in IMPLEMENTATIONS
    }
    gc.collect()
    gc.freeze()
    try:
        for round_index in range(args.rounds):
            order = impls if round_index % 2 == 0 else impls[::-1]
            for streamed, keys in PASS_METRICS.items():
                for name in order:
                    gc.collect()
                    measured = asyncio.run(
                        measure_pass(
                            IMPLEMENTATIONS[name],
                            workload,
                            streamed=streamed,
                            phase_timeout=args.timeout,
                            now=CLOCKS[args.clock],
                        )
                    )
                    for key in keys:
                        values[name][key].append(measured.get(key))
                    _progress(f"{pods} pods, round {round_index + 1}, {name}: {measured}", args)
        for name in impls:
            gc.collect()
            memory = run_memory(IMPLEMENTATIONS[name], workload)
            for key, value in asdict(memory).items():
                values[name][key].append(value)
            _progress(f"{pods} pods, memory, {name}: {memory}", args)
    finally:
        gc.unfreeze()
    return values


def _progress(message: str, args: argparse.Namespace) -> None:
    if args.verbose:
        print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10k pods only (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000, help="mixed events per run")
    parser.add_argument("--samples", type=int, default=2000, help="latency samples per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="cpu",
        help="cpu: this thread's CPU time (default; immune to other processes on a shared"
        " machine), wall: perf_counter",
    )
    parser.add_argument(
        "--impl",
        choices=["all", "both", *IMPLEMENTATIONS],
        default="all",
        help="all (default), both (ours and floor), or one implementation",
    )
    parser.add_argument("--no-metrics", action="store_true", help="skip the metrics pass")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = [10_000]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    impls = _implementations(args)
    rows: list[Row] = []
    for pods in args.sizes:
        rows.extend(make_rows(pods, args.parents, run_size(pods=pods, args=args, impls=impls)))
    if args.json:
        report = {
            "rounds": args.rounds,
            "clock": args.clock,
            "events": args.events,
            "latency_samples": args.samples,
            "cost_ratio": "ours/floor for times and bytes, floor/ours for rates; >1 = ours worse;"
            " median of paired per-round ratios (best_ratio: best sample against best sample)",
            "target": {
                "max_cost_ratio": TARGET_RATIO,
                "max_p99_cost_ratio": TARGET_P99_RATIO,
                "max_metrics_overhead": TARGET_METRICS_OVERHEAD,
                "at_pods": TARGET_PODS,
            },
            "rows": [asdict(row) for row in rows],
        }
        print(json.dumps(report, indent=2))
    else:
        print(
            f"ours and floor: medians of {args.rounds} rounds, {args.clock} clock; memory: one"
            " traced pass.\ncost ratio: ours/floor for times and bytes, floor/ours for rates"
            " (>1 = ours worse), the median of the paired per-round ratios; best ratio: best"
            f" sample against best sample; overhead: ours with metrics against ours.\n! = cost"
            f" ratio over {TARGET_RATIO} ({TARGET_P99_RATIO} for p99) at {TARGET_PODS} pods;"
            f" m! = metrics overhead over {TARGET_METRICS_OVERHEAD}."
        )
        print_table(rows)
    misses = any(_misses_target(row) or _misses_metrics_target(row) for row in rows)
    return 1 if misses and args.impl in ("all", "both") else 0


def _implementations(args: argparse.Namespace) -> list[str]:
    if args.impl not in ("all", "both"):
        return [args.impl]
    impls = ["ours", "floor"]
    if args.impl == "all" and not args.no_metrics:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            print("metrics pass skipped: prometheus_client is not installed", file=sys.stderr)
        else:
            impls.append("metrics")
    return impls


if __name__ == "__main__":
    sys.exit(main())
