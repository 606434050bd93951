"""Prometheus metrics of a ``ReconcileLoop``, by controller-runtime's names: the ``MetricsProvider``
the loop reports to. Go: CR ``pkg/internal/controller/metrics`` and
``pkg/internal/metrics/workqueue.go``.

Nothing is exported per event: a report adds to a plain counter, and one custom collector reads
the counters when the registry is scraped. Only the three histograms are observed as they happen,
once per reconcile, by appending to a list that is counted into buckets a thousand at a time.
``prometheus_client`` (the ``metrics`` extra) is imported here only, and this module only when a
loop is given a registry, so the runtime imports without it. It imports nothing of the loop's.

Series, with CR's labels (``controller`` and, for the workqueue, ``name``, both the loop's name):
``FAMILIES`` below, each once; the source's with ``name`` (the old ``reflector_*`` names of
Kubernetes' component-base), read from the loop's ``source_status()`` at scrape.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from miles.utils.workers.reconcile.clock import Clock, time_function
from miles.utils.workers.reconcile.log import NamedLogger
from miles.utils.workers.reconcile.metrics_provider import ReconcileResult
from miles.utils.workers.reconcile.status import SourceStatus

logger = logging.getLogger(__name__)

WORKQUEUE_BUCKETS: tuple[float, ...] = tuple(10e-9 * 10**i for i in range(12))
"""client-go's ``ExponentialBuckets(10e-9, 10, 12)``, as CR's workqueue histograms use."""
RECONCILE_TIME_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0),
    *(6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
)
"""CR's ``controller_runtime_reconcile_time_seconds`` buckets."""


class Buckets:
    """A histogram's counts and sum, with the observations not yet counted.

    ``observe`` only appends; every ``FOLD_EVERY`` observations the loop's own thread counts them
    into a new state and swaps it in with one assignment, so a scrape on another thread reads one
    consistent state (``snapshot``) and never writes.
    """

    FOLD_EVERY = 1024

    __slots__ = ("bounds", "pending", "state")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.pending: list[float] = []
        self.state: tuple[list[int], float, list[float]] = (
            [0] * (len(self.bounds) + 1),
            0.0,
            self.pending,
        )

    def observe(self, value: float) -> None:
        pending = self.pending
        pending.append(value)
        if len(pending) >= self.FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        counts, total, pending = self.state
        counts = list(counts)
        for value in pending:
            counts[bisect.bisect_left(self.bounds, value)] += 1
        self.pending = []
        self.state = (counts, total + math.fsum(pending), self.pending)

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` buckets and the sum, pending observations included."""
        counts, total, pending = self.state
        counts = list(counts)
        seen = list(pending)
        for value in seen:
            counts[bisect.bisect_left(self.bounds, value)] += 1
        buckets, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == math.inf else repr(bound), float(running)))
        return buckets, total + math.fsum(seen)


class LoopSeries:
    """One loop's series: what the loop reported (``LoopMetrics``), and its source's status,
    read at scrape. Once a report raises, the histograms stop with one log line; counts go on."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        source_status: Callable[[], SourceStatus],
        max_concurrent_reconciles: int = 1,
    ) -> None:
        self.name = name
        self.max_concurrent_reconciles = max_concurrent_reconciles
        self.source_status = source_status
        self.now = time_function(clock)
        self.taken = 0
        self.retries = 0
        self.succeeded = 0
        self.failed = 0
        self.timeouts = 0
        self.terminal = 0
        self.running: list[float] = []
        """When each reconcile in flight started, on the loop's clock."""
        self.queue_duration = Buckets(WORKQUEUE_BUCKETS)
        self.work_duration = Buckets(WORKQUEUE_BUCKETS)
        self.reconcile_time = Buckets(RECONCILE_TIME_BUCKETS)
        self._added_at: deque[float] = deque()
        self._log = NamedLogger(logger, name)
        self._broken = False

    @property
    def depth(self) -> int:
        return len(self._added_at)

    @property
    def adds(self) -> int:
        """Keys that entered the queue: taken plus still queued, as ``WorkQueue.adds``."""
        return self.taken + len(self._added_at)

    def added(self, count: int) -> None:
        self._added_at.extend((self.now(),) * count)

    def started(self, at: float) -> None:
        self.taken += 1
        self.running.append(at)
        try:
            waited = at - self._added_at.popleft()
            if not self._broken:
                self.queue_duration.pending.append(waited)
        except Exception as exc:
            self._stop_observing(exc)

    @property
    def running_since(self) -> float | None:
        """When the oldest reconcile in flight started; ``None`` with none."""
        return min(self.running) if self.running else None

    def finished(self, result: ReconcileResult, started_at: float | None = None) -> None:
        since = self._end(started_at)
        if result == "success":
            self.succeeded += 1
        elif result == "stopped":
            return
        else:
            self.failed += 1
            if result == "timeout":
                self.timeouts += 1
            elif result == "terminal":
                self.terminal += 1
        if self._broken or since is None:
            return
        try:
            elapsed = self.now() - since
            work, reconcile = self.work_duration, self.reconcile_time
            work.pending.append(elapsed)
            reconcile.pending.append(elapsed)
            if len(reconcile.pending) >= Buckets.FOLD_EVERY:
                self.queue_duration.fold()
                work.fold()
                reconcile.fold()
        except Exception as exc:
            self._stop_observing(exc)

    def retried(self) -> None:
        self.retries += 1

    def _end(self, started_at: float | None) -> float | None:
        running = self.running
        if not running:
            return None
        if started_at is None or started_at not in running:
            return running.pop()
        running.remove(started_at)
        return started_at

    def _stop_observing(self, exc: Exception) -> None:
        if not self._broken:
            self._broken = True
            self._log.error("metrics stopped observing reconciles: %r", exc)


class ReconcileMetrics:
    """The Prometheus ``MetricsProvider``: one collector on ``registry`` for every loop given it,
    by the loop's name.

    Registering is the one place a registry can refuse (a name already taken, e.g. a second
    ``ReconcileMetrics`` on it): ``ValueError`` at construction. Loops that share a registry
    share one ``ReconcileMetrics``. A scrape that fails for one loop skips that loop's series
    with one log line; it never reaches the loop.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._loops: dict[str, LoopSeries] = {}
        try:
            registry.register(self)
        except ValueError as exc:
            raise ValueError(
                f"the metrics registry refused the reconcile loop's series ({exc}); loops that"
                " share a registry must share one ReconcileMetrics(registry)"
            ) from exc

    def loop_metrics(self, name: str, **series: Any) -> LoopSeries:
        """The ``LoopSeries`` of the loop ``name``, made from the keywords
        ``MetricsProvider.loop_metrics`` names (``clock``, ``source_status``,
        ``max_concurrent_reconciles``)."""
        if name in self._loops:
            raise ValueError(
                f"a reconcile loop named {name!r} already reports to these metrics;"
                " give each loop its own name= (controller-runtime: controller names are unique)"
            )
        self._loops[name] = made = LoopSeries(name, **series)
        return made

    def describe(self) -> Iterator[Metric]:
        return _families({})

    def collect(self) -> Iterator[Metric]:
        samples: dict[Family, list[_Sample]] = {}
        for name, series in list(self._loops.items()):
            try:
                rows = _read(series)
            except Exception as exc:
                NamedLogger(logger, name).error("metrics scrape skipped this loop: %r", exc)
                continue
            for family, labels, value in rows:
                samples.setdefault(family, []).append((labels, value))
        return _families(samples)


MetricsTarget = CollectorRegistry | ReconcileMetrics
"""What ``ReconcileLoop(metrics=...)`` takes besides any ``MetricsProvider``: a registry, or the
metrics of one shared."""


@dataclass(frozen=True)
class Family:
    """One metric family by CR's name (``_total`` is added by ``prometheus_client``)."""

    kind: Literal["counter", "gauge", "histogram"]
    name: str
    documentation: str
    labels: tuple[str, ...]


_LOOP = ("controller",)
_QUEUE = ("name", "controller")
_SOURCE = ("name",)

DEPTH = Family(
    "gauge", "workqueue_depth", "Current depth of workqueue", ("name", "controller", "priority")
)
ADDS = Family("counter", "workqueue_adds", "Total number of adds handled by workqueue", _QUEUE)
RETRIES = Family(
    "counter", "workqueue_retries", "Total number of retries handled by workqueue", _QUEUE
)
UNFINISHED_WORK = Family(
    "gauge",
    "workqueue_unfinished_work_seconds",
    "How many seconds of work has been done that is in progress and hasn't been observed"
    " by work_duration",
    _QUEUE,
)
LONGEST_RUNNING = Family(
    "gauge",
    "workqueue_longest_running_processor_seconds",
    "How many seconds has the longest running processor for workqueue been running",
    _QUEUE,
)
QUEUE_DURATION = Family(
    "histogram",
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    _QUEUE,
)
WORK_DURATION = Family(
    "histogram",
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes",
    _QUEUE,
)
RECONCILES = Family(
    "counter",
    "controller_runtime_reconcile",
    "Total number of reconciliations per controller",
    ("controller", "result"),
)
RECONCILE_ERRORS = Family(
    "counter",
    "controller_runtime_reconcile_errors",
    "Total number of reconciliation errors per controller",
    _LOOP,
)
RECONCILE_TIMEOUTS = Family(
    "counter",
    "controller_runtime_reconcile_timeouts",
    "Total number of reconciliation timeouts per controller",
    _LOOP,
)
TERMINAL_ERRORS = Family(
    "counter",
    "controller_runtime_terminal_reconcile_errors",
    "Total number of terminal reconciliation errors per controller",
    _LOOP,
)
RECONCILE_TIME = Family(
    "histogram",
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    _LOOP,
)
ACTIVE_WORKERS = Family(
    "gauge",
    "controller_runtime_active_workers",
    "Number of currently used workers per controller",
    _LOOP,
)
MAX_CONCURRENT = Family(
    "gauge",
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    _LOOP,
)
LISTS = Family(
    "counter", "reflector_lists", "Total number of API lists done by the reflectors", _SOURCE
)
WATCHES = Family(
    "counter", "reflector_watches", "Total number of API watches done by the reflectors", _SOURCE
)
RELISTS = Family(
    "counter",
    "reflector_relists",
    "Total number of relists after the first list, by reason",
    ("name", "reason"),
)
EVENTS = Family(
    "counter", "reflector_events", "Total number of watch events the source delivered", _SOURCE
)
LAST_RESOURCE_VERSION = Family(
    "gauge",
    "reflector_last_resource_version",
    "Last resource version seen for the reflectors",
    _SOURCE,
)
FAMILIES = (
    *(DEPTH, ADDS, RETRIES, UNFINISHED_WORK, LONGEST_RUNNING, QUEUE_DURATION, WORK_DURATION),
    *(RECONCILES, RECONCILE_ERRORS, RECONCILE_TIMEOUTS, TERMINAL_ERRORS, RECONCILE_TIME),
    *(ACTIVE_WORKERS, MAX_CONCURRENT),
    *(LISTS, WATCHES, RELISTS, EVENTS, LAST_RESOURCE_VERSION),
)
"""Every family, in the order a scrape lists them: the one table of names."""

_Sample = tuple[Sequence[str], float | Buckets]


def _read(series: LoopSeries) -> list[tuple[Family, Sequence[str], float | Buckets]]:
    """Every sample of one loop, by family; the reflector's from its source's status."""
    name = series.name
    loop, queue = (name,), (name, name)
    now = series.now()
    ages = [max(0.0, now - since) for since in series.running]
    unfinished, longest = math.fsum(ages), max(ages, default=0.0)
    source = series.source_status()
    rows: list[tuple[Family, Sequence[str], float | Buckets]] = [
        (DEPTH, (name, name, ""), series.depth),
        (ADDS, queue, series.adds),
        (RETRIES, queue, series.retries),
        (UNFINISHED_WORK, queue, unfinished),
        (LONGEST_RUNNING, queue, longest),
        (QUEUE_DURATION, queue, series.queue_duration),
        (WORK_DURATION, queue, series.work_duration),
        (RECONCILES, (name, "success"), series.succeeded),
        (RECONCILES, (name, "error"), series.failed),
        (RECONCILE_ERRORS, loop, series.failed),
        (RECONCILE_TIMEOUTS, loop, series.timeouts),
        (TERMINAL_ERRORS, loop, series.terminal),
        (RECONCILE_TIME, loop, series.reconcile_time),
        (ACTIVE_WORKERS, loop, len(series.running)),
        (MAX_CONCURRENT, loop, series.max_concurrent_reconciles),
        (LISTS, (name,), source.lists),
        (WATCHES, (name,), source.watches),
        (EVENTS, (name,), source.events),
    ]
    rows.extend((RELISTS, (name, reason), count) for reason, count in source.relists.items())
    if source.cursor is not None and source.cursor.isdigit():
        rows.append((LAST_RESOURCE_VERSION, (name,), float(source.cursor)))
    return rows


def _families(samples: dict[Family, list[_Sample]]) -> Iterator[Metric]:
    for family in FAMILIES:
        rows = samples.get(family, ())
        name, documentation, labels = family.name, family.documentation, family.labels
        if family.kind == "histogram":
            histogram = HistogramMetricFamily(name, documentation, labels=labels)
            for label_values, buckets in rows:
                assert isinstance(buckets, Buckets)
                cumulative, total = buckets.snapshot()
                histogram.add_metric(list(label_values), cumulative, total)
            yield histogram
            continue
        family_type = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
        metric = family_type(name, documentation, labels=labels)
        for label_values, value in rows:
            assert isinstance(value, int | float)
            metric.add_metric(list(label_values), float(value))
        yield metric
