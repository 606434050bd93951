"""The figures of ``bench/pipeline.py``: its metrics, targets, rows and table, on the report engine
of ``bench/report.py``.

Go counterpart: none (benchmark report). A cost ratio is ours/floor for times and bytes and
floor/ours for rates, so above 1 always means ours is slower or bigger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.report import Metric, Results, advantage, fmt

TARGET_RATIO = 1.3
TARGET_P99_RATIO = 1.5
TARGET_METRICS_OVERHEAD = 1.05
TARGET_PODS = 100_000

METRICS: dict[str, Metric] = {
    "start_s": Metric("start until every parent reconciled", "ms", 1e3, False),
    "burst_events_per_s": Metric("mixed events, burst", "kev/s", 1e-3, True),
    "streamed_events_per_s": Metric("mixed events, streamed", "kev/s", 1e-3, True),
    "latency_median_s": Metric("event-to-reconcile latency, median", "us", 1e6, False),
    "latency_p99_s": Metric("event-to-reconcile latency, p99", "us", 1e6, False),
    "burst_reconciles": Metric("reconciles per mixed drain, burst", "n", 1.0, False),
    "streamed_reconciles": Metric("reconciles per mixed drain, streamed", "n", 1.0, False),
    "peak_bytes_per_pod": Metric("peak memory per pod (start)", "B", 1.0, False),
    "retained_bytes_per_pod": Metric("retained memory per pod", "B", 1.0, False),
}
UNTARGETED = frozenset({"burst_reconciles", "streamed_reconciles"})
"""Counts shown beside the costs, held to no target."""


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


def make_rows(pods: int, parents: int, results: Results) -> list[Row]:
    with_metrics = any("metrics" in measured for measured in results.rounds)
    rows = []
    for key, metric in METRICS.items():
        best = advantage(
            metric, results.best("ours", key, metric), results.best("floor", key, metric)
        )
        rows.append(
            Row(
                metric=key,
                description=metric.name,
                unit=metric.unit,
                pods=pods,
                parents=parents,
                ours=results.median("ours", key),
                floor=results.median("floor", key),
                cost_ratio=results.cost(key, metric, ("floor",)),
                best_ratio=None if best is None else 1 / best,
                ours_samples=results.per_round("ours", key),
                floor_samples=results.per_round("floor", key),
                metrics=results.median("metrics", key) if with_metrics else None,
                metrics_overhead=results.cost(key, metric, ("ours",), mine="metrics")
                if with_metrics
                else None,
                metrics_samples=results.per_round("metrics", key) if with_metrics else None,
            )
        )
    return rows


def target_of(metric: str) -> float:
    return TARGET_P99_RATIO if metric.endswith("_p99_s") else TARGET_RATIO


def misses_target(row: Row) -> bool:
    if row.metric in UNTARGETED or row.pods < TARGET_PODS:
        return False
    return row.cost_ratio is None or row.cost_ratio > target_of(row.metric)


def misses_metrics_target(row: Row) -> bool:
    if row.metric in UNTARGETED or row.pods < TARGET_PODS or row.metrics_samples is None:
        return False
    return row.metrics_overhead is None or row.metrics_overhead > TARGET_METRICS_OVERHEAD


def print_table(rows: list[Row], *, rounds: int, clock: str) -> None:
    print(
        f"ours and floor: medians of {rounds} rounds, {clock} clock; memory: one"
        " traced pass.\ncost ratio: ours/floor for times and bytes, floor/ours for rates"
        " (>1 = ours worse), the median of the paired per-round ratios; best ratio: best"
        f" sample against best sample; overhead: ours with metrics against ours.\n! = cost"
        f" ratio over {TARGET_RATIO} ({TARGET_P99_RATIO} for p99) at {TARGET_PODS} pods;"
        f" m! = metrics overhead over {TARGET_METRICS_OVERHEAD}."
    )
    header = f"{'metric':38} {'pods':>7} {'parents':>7} {'unit':>5} {'ours':>10} {'floor':>10}"
    print(f"{header} {'cost ratio':>10} {'best ratio':>10} {'+metrics':>10} {'overhead':>8}")
    for row in rows:
        scale = METRICS[row.metric].scale
        flag = " !" if misses_target(row) else ""
        flag += " m!" if misses_metrics_target(row) else ""
        print(
            f"{row.description:38} {row.pods:>7} {row.parents:>7} {row.unit:>5}"
            f" {fmt(row.ours, scale):>10} {fmt(row.floor, scale):>10}"
            f" {fmt(row.cost_ratio):>10} {fmt(row.best_ratio):>10}"
            f" {fmt(row.metrics, scale):>10} {fmt(row.metrics_overhead):>8}{flag}"
        )


def json_report(rows: list[Row], *, rounds: int, clock: str, events: int, samples: int) -> Any:
    return {
        "rounds": rounds,
        "clock": clock,
        "events": events,
        "latency_samples": samples,
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
