"""Prometheus metrics of a ``ReconcileLoop``, by controller-runtime's names. Go: CR
``pkg/internal/controller/metrics`` and ``pkg/internal/metrics/workqueue.go``.

Nothing is exported per event: the loop keeps plain counters it needs for ``status()`` anyway,
and one custom collector reads them when the registry is scraped. Only the three histograms are
observed as they happen, once per reconcile, by appending to a list that is counted into buckets
a thousand at a time. ``prometheus_client``
(the ``metrics`` extra) is imported here only, and this module only when a loop is given a
registry, so the runtime imports without it.

Series, with CR's labels (``controller`` and, for the workqueue, ``name``, both the loop's name):
``workqueue_depth`` (also ``priority=""``, as CR's non-priority queue), ``workqueue_adds_total``,
``workqueue_queue_duration_seconds``, ``workqueue_work_duration_seconds``,
``workqueue_unfinished_work_seconds``, ``workqueue_longest_running_processor_seconds``,
``workqueue_retries_total``, ``controller_runtime_reconcile_total{result}`` (``success`` or
``error``), ``controller_runtime_reconcile_errors_total``,
``controller_runtime_reconcile_timeouts_total``, ``controller_runtime_reconcile_time_seconds``,
``controller_runtime_active_workers``, ``controller_runtime_max_concurrent_reconciles``; and the
source's, with ``name`` (the old ``reflector_*`` names of Kubernetes' component-base):
``reflector_lists_total``, ``reflector_watches_total``, ``reflector_relists_total{reason}``,
``reflector_events_total``, ``reflector_last_resource_version``.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from miles.utils.workers.reconcile.log import NamedLogger

if TYPE_CHECKING:
    from miles.utils.workers.reconcile.loop import ReconcileLoop

logger = logging.getLogger(__name__)

WORKQUEUE_BUCKETS: tuple[float, ...] = tuple(10e-9 * 10**i for i in range(12))
"""client-go's ``ExponentialBuckets(10e-9, 10, 12)``, as CR's workqueue histograms use."""
RECONCILE_TIME_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0),
    *(6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
)
"""CR's ``controller_runtime_reconcile_time_seconds`` buckets."""

_LOOP_LABELS = ("controller",)
_QUEUE_LABELS = ("name", "controller")


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
    """What one loop observes as it runs; everything else is read from the loop at scrape."""

    def __init__(self, loop: ReconcileLoop) -> None:
        self.loop = loop
        self.queue_duration = Buckets(WORKQUEUE_BUCKETS)
        self.work_duration = Buckets(WORKQUEUE_BUCKETS)
        self.reconcile_time = Buckets(RECONCILE_TIME_BUCKETS)
        self._log = NamedLogger(logger, loop.name)
        self._broken = False

    def observe(self, waited: float, elapsed: float) -> None:
        """One reconcile: how long its parent waited in the queue, how long it ran."""
        if self._broken:
            return
        try:
            queue, work, reconcile = self.queue_duration, self.work_duration, self.reconcile_time
            queue.pending.append(waited)
            work.pending.append(elapsed)
            reconcile.pending.append(elapsed)
            if len(reconcile.pending) >= Buckets.FOLD_EVERY:
                queue.fold()
                work.fold()
                reconcile.fold()
        except Exception as exc:
            self._broken = True
            self._log.error("metrics stopped observing reconciles: %r", exc)


class ReconcileMetrics:
    """One collector on ``registry`` for every loop attached to it, by the loop's name.

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

    def attach(self, loop: ReconcileLoop) -> LoopSeries:
        if loop.name in self._loops:
            raise ValueError(
                f"a reconcile loop named {loop.name!r} already reports to these metrics;"
                " give each loop its own name= (controller-runtime: controller names are unique)"
            )
        series = self._loops[loop.name] = LoopSeries(loop)
        return series

    def describe(self) -> Iterator[Metric]:
        return _families({})

    def collect(self) -> Iterator[Metric]:
        samples: dict[str, list[tuple[Sequence[str], object]]] = {}
        for name, series in list(self._loops.items()):
            try:
                rows = _read(series)
            except Exception as exc:
                NamedLogger(logger, name).error("metrics scrape skipped this loop: %r", exc)
                continue
            for family, row in rows:
                samples.setdefault(family, []).append(row)
        return _families(samples)


MetricsTarget = CollectorRegistry | ReconcileMetrics
"""What ``ReconcileLoop(metrics=...)`` accepts: a registry, or the metrics of one shared."""


def attach(target: MetricsTarget, loop: ReconcileLoop) -> LoopSeries:
    metrics = target if isinstance(target, ReconcileMetrics) else ReconcileMetrics(target)
    return metrics.attach(loop)


_Row = tuple[str, tuple[Sequence[str], object]]


def _read(series: LoopSeries) -> list[_Row]:
    loop = series.loop
    name = loop.name
    loop_labels, queue_labels = (name,), (name, name)
    since = loop.in_flight_since()
    running = 0.0 if since is None else max(0.0, loop.clock.time() - since)
    failures = loop.reconcile_failures
    source = loop.source_status()
    rows: list[_Row] = [
        ("workqueue_depth", ((name, name, ""), len(loop.queue))),
        ("workqueue_adds", (queue_labels, loop.queue.adds)),
        ("workqueue_retries", (queue_labels, loop.retry_scheduler.retries)),
        ("workqueue_unfinished_work_seconds", (queue_labels, running)),
        ("workqueue_longest_running_processor_seconds", (queue_labels, running)),
        ("workqueue_queue_duration_seconds", (queue_labels, series.queue_duration)),
        ("workqueue_work_duration_seconds", (queue_labels, series.work_duration)),
        ("controller_runtime_reconcile", ((name, "success"), loop.reconciles - failures)),
        ("controller_runtime_reconcile", ((name, "error"), failures)),
        ("controller_runtime_reconcile_errors", (loop_labels, failures)),
        ("controller_runtime_reconcile_timeouts", (loop_labels, loop.reconcile_timeouts)),
        ("controller_runtime_reconcile_time_seconds", (loop_labels, series.reconcile_time)),
        ("controller_runtime_active_workers", (loop_labels, 0 if since is None else 1)),
        ("controller_runtime_max_concurrent_reconciles", (loop_labels, 1)),
        ("reflector_lists", ((name,), source.lists)),
        ("reflector_watches", ((name,), source.watches)),
        ("reflector_events", ((name,), source.events)),
    ]
    rows.extend(
        ("reflector_relists", ((name, reason), count)) for reason, count in source.relists.items()
    )
    if source.cursor is not None and source.cursor.isdigit():
        rows.append(("reflector_last_resource_version", ((name,), float(source.cursor))))
    return rows


_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("gauge", "workqueue_depth", "Current depth of workqueue", ("name", "controller", "priority")),
    ("counter", "workqueue_adds", "Total number of adds handled by workqueue", _QUEUE_LABELS),
    (
        "counter",
        "workqueue_retries",
        "Total number of retries handled by workqueue",
        _QUEUE_LABELS,
    ),
    (
        "gauge",
        "workqueue_unfinished_work_seconds",
        "How many seconds of work has been done that is in progress and hasn't been observed"
        " by work_duration",
        _QUEUE_LABELS,
    ),
    (
        "gauge",
        "workqueue_longest_running_processor_seconds",
        "How many seconds has the longest running processor for workqueue been running",
        _QUEUE_LABELS,
    ),
    (
        "histogram",
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested",
        _QUEUE_LABELS,
    ),
    (
        "histogram",
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes",
        _QUEUE_LABELS,
    ),
    (
        "counter",
        "controller_runtime_reconcile",
        "Total number of reconciliations per controller",
        ("controller", "result"),
    ),
    (
        "counter",
        "controller_runtime_reconcile_errors",
        "Total number of reconciliation errors per controller",
        _LOOP_LABELS,
    ),
    (
        "counter",
        "controller_runtime_reconcile_timeouts",
        "Total number of reconciliation timeouts per controller",
        _LOOP_LABELS,
    ),
    (
        "histogram",
        "controller_runtime_reconcile_time_seconds",
        "Length of time per reconciliation per controller",
        _LOOP_LABELS,
    ),
    (
        "gauge",
        "controller_runtime_active_workers",
        "Number of currently used workers per controller",
        _LOOP_LABELS,
    ),
    (
        "gauge",
        "controller_runtime_max_concurrent_reconciles",
        "Maximum number of concurrent reconciles per controller",
        _LOOP_LABELS,
    ),
    ("counter", "reflector_lists", "Total number of API lists done by the reflectors", ("name",)),
    (
        "counter",
        "reflector_watches",
        "Total number of API watches done by the reflectors",
        ("name",),
    ),
    (
        "counter",
        "reflector_relists",
        "Total number of relists after the first list, by reason",
        ("name", "reason"),
    ),
    ("counter", "reflector_events", "Total number of events the source delivered", ("name",)),
    (
        "gauge",
        "reflector_last_resource_version",
        "Last resource version seen for the reflectors",
        ("name",),
    ),
)


def _families(samples: dict[str, list[tuple[Sequence[str], object]]]) -> Iterator[Metric]:
    for kind, name, documentation, labels in _FAMILIES:
        rows = samples.get(name, ())
        if kind == "histogram":
            histogram = HistogramMetricFamily(name, documentation, labels=labels)
            for label_values, buckets in rows:
                assert isinstance(buckets, Buckets)
                cumulative, total = buckets.snapshot()
                histogram.add_metric(list(label_values), cumulative, total)
            yield histogram
            continue
        family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = family_type(name, documentation, labels=labels)
        for label_values, value in rows:
            assert isinstance(value, int | float)
            family.add_metric(list(label_values), float(value))
        yield family
