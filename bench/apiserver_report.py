"""The figures of ``bench/apiserver.py``: its metrics, targets, tables and plot, on the report
engine of ``bench/report.py``.

Go counterpart: none (benchmark report). A ratio above 1 means ours is better.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import Metric, Results, Values, fmt

TITLES = {
    "ours": "ours",
    "ka": "kubernetes_asyncio",
    "go": "client-go",
    "kube-rs": "kube-rs",
    "ours-stream": "ours, streaming list",
    "go-stream": "client-go, WatchList",
    "wire": "the wire, read raw",
    "wire-decode": "the wire, decoded",
    "wire-keep": "the wire, decoded, kept",
    "floor": "the raw paged LIST",
    "ours-typed": "ours, engine pools, typed",
    "ours-dynamic": "ours, engine pools, dynamic",
    "floor-objects": "the raw paged LIST of engine pools",
}
COLUMNS = {
    "ours": "ours",
    "ka": "k8s_asyncio",
    "go": "client-go",
    "kube-rs": "kube-rs",
    "ours-stream": "ours-stream",
    "go-stream": "go-stream",
    "wire": "wire",
    "wire-decode": "wire-decode",
    "wire-keep": "wire-keep",
    "ours-typed": "pools-typed",
    "ours-dynamic": "pools-dyn",
    "floor-objects": "pools-floor",
}
PEERS = tuple(name for name in COLUMNS if name != "ours")
SHARE_SHOWN = 0.001


METRICS: dict[str, Metric] = {
    "sync_s": Metric("LIST-to-synced", "s", 1.0, False),
    "sync_cpu_s": Metric("  CPU the contender spent on it", "s", 1.0, False),
    "apiserver_cpu_s": Metric("  CPU the apiserver spent meanwhile", "s", 1.0, False),
    "apiserver_rss_peak": Metric("  apiserver RSS, peak meanwhile", "MiB", 2**-20, False),
    "rss_per_pod": Metric("RSS growth per stored pod", "KiB", 1 / 1024, False),
    "rss_trimmed_per_pod": Metric("  the same after gc + malloc_trim", "KiB", 1 / 1024, False),
    "events_per_s": Metric("WATCH events applied per second", "ev/s", 1.0, True),
    "lag_p50": Metric("WATCH lag behind the apiserver, median", "ms", 1e3, False),
    "lag_p99": Metric("WATCH lag behind the apiserver, p99", "ms", 1e3, False),
    "cpu_per_event": Metric("contender CPU per WATCH event", "us", 1e6, False),
    "apiserver_cpu_per_event": Metric(
        "  apiserver CPU per WATCH event meanwhile", "us", 1e6, False, False
    ),
    "kernel_share": Metric("  share of it in the kernel (stat's ticks)", "%", 100.0, False, False),
    "instructions_per_event": Metric("instructions per WATCH event", "k", 1e-3, False),
    "dispatch_p50": Metric("reconcile dispatch latency, median", "us", 1e6, False),
    "dispatch_p99": Metric("reconcile dispatch latency, p99", "us", 1e6, False),
    "writer_rate": Metric("writer: patches acknowledged per second", "ev/s", 1.0, True),
    "gc_sync_s": Metric("cyclic GC pauses during sync, total", "ms", 1e3, False),
    "gc_watch_max_s": Metric("longest cyclic GC pause during WATCH", "ms", 1e3, False),
    "gc_watch_per_event": Metric("  cyclic GC pauses during WATCH, per event", "us", 1e6, False),
    "full_gc_s": Metric("one full cyclic collection after the WATCH", "ms", 1e3, False),
}


@dataclass(frozen=True)
class Target:
    """Ours against the best of ``others`` in each round: the advantage (> 1: ours better) must be
    at least ``at_least``."""

    metric: str
    others: tuple[str, ...]
    at_least: float
    text: str
    as_cost: bool = False
    """Print the inverse (ours / theirs), as a cost ratio with its ceiling."""


TARGETS = (
    Target("sync_s", ("floor",), 1 / 1.3, "at most 1.3x the raw paged LIST", as_cost=True),
    Target("sync_s", ("go", "kube-rs"), 2.0, ">= 2x faster than the faster compiled peer"),
    Target("sync_s", ("ka",), 6.0, ">= 6x faster than kubernetes_asyncio"),
    Target("cpu_per_event", ("kube-rs",), 1.0, "no more than kube-rs's"),
    Target("lag_p99", ("go",), 1.0, "no more than client-go's"),
    Target("rss_per_pod", ("go",), 2.0, "at most half of client-go's"),
    Target("events_per_s", ("go",), 0.5, ">= half of client-go's rate"),
)
INSTRUCTION_TARGETS = (
    Target("instructions_per_event", ("kube-rs",), 1.0, "no more than kube-rs's"),
)


def present_contenders(results: Results) -> list[str]:
    return [name for name in COLUMNS if any(r.get(name) for r in results.rounds)]


def print_table(results: Results, title: str) -> None:
    print(f"\n{title}")
    names = present_contenders(results)
    peers = [p for p in PEERS if p in names]
    header = f"{'metric':42} {'unit':>5}" + "".join(f" {COLUMNS[n]:>11}" for n in names)
    print(header + "".join(f" {'ours vs ' + COLUMNS[p]:>20}" for p in peers))
    for key, metric in METRICS.items():
        if all(results.median(n, key) is None for n in names):
            continue
        cells = "".join(f" {fmt(results.median(n, key), metric.scale):>11}" for n in names)
        ratios = "".join(
            f" {fmt(results.advantage(key, metric, (p,)) if metric.compared else None):>20}"
            for p in peers
        )
        print(f"{metric.name:42} {metric.unit:>5}{cells}{ratios}")


def check_targets(
    results: Results, skipped: dict[str, str], targets: Sequence[Target] = TARGETS
) -> bool:
    """Prints each target's ratio and verdict; False when a target that could be judged missed."""
    print("\ntargets (ratios within each round, median over rounds):")
    met = True
    for target in targets:
        ratio = results.advantage(target.metric, METRICS[target.metric], target.others)
        name = METRICS[target.metric].name.strip()
        against = " / ".join(TITLES[o] for o in target.others)
        missing = [TITLES[o] for o in target.others if o in skipped]
        if ratio is None:
            why = f" ({', '.join(missing)} skipped)" if missing else ""
            print(f"  {name} vs {against}: {target.text}: n/a{why}")
            continue
        verdict = "met" if ratio >= target.at_least else "MISSED"
        met = met and verdict == "met"
        if target.as_cost:
            shown = f"ours costs {fmt(1 / ratio)}x, ceiling {fmt(1 / target.at_least)}"
        else:
            shown = f"ours is {fmt(ratio)}x better, needs {fmt(target.at_least)}"
        note = f" (without {', '.join(missing)}: skipped)" if missing else ""
        print(f"  {name} vs {against}: {target.text}: {shown} -> {verdict}{note}")
    return met


def print_rounds(results: Results, key: str, title: str) -> None:
    """One figure in every round, and its spread (max/min - 1) per contender."""
    names = [n for n in present_contenders(results) if results.median(n, key)]
    if not names:
        return
    scale = METRICS[key].scale
    print(f"\n{title}:")
    print(f"  {'round':>5}" + "".join(f" {COLUMNS[n]:>11}" for n in names))
    for index in range(len(results.rounds)):
        cells = "".join(f" {fmt(results.per_round(n, key)[index], scale):>11}" for n in names)
        print(f"  {index + 1:>5}{cells}")
    spreads = []
    for n in names:
        runs = [v for v in results.per_round(n, key) if v]
        spreads.append(f"{(max(runs) / min(runs) - 1) * 100:.0f}%" if len(runs) > 1 else "-")
    print(f"  {'spread':>5}" + "".join(f" {s:>11}" for s in spreads))


def print_shares(costs: dict[str, Counter[str]], top: int) -> None:
    """Where each contender's counted instructions went (``bench/apiserver_callgrind.py``)."""
    for name, where in costs.items():
        total = sum(where.values()) or 1
        print(f"\nwhere {TITLES[name]}'s instructions went in its last window (self cost):")
        for place, instructions in where.most_common(top):
            if instructions / total >= SHARE_SHOWN:
                print(f"  {instructions / total:6.1%}  {place}")


def print_notes(results: Results, context: dict[str, Any]) -> None:
    print(
        f"\nseeding took {fmt(context.get('seed_s'))} s (0 if reused); the same LIST read raw,"
        f" decoding nothing: {fmt(context.get('floor_paged_s'))} s in pages of 500 as ours,"
        f" {fmt(context.get('floor_s'))} s in one (resourceVersion unset, as ours and kube-rs ask),"
        f' {fmt(context.get("floor_rv0_s"))} s in one with "0" (as client-go asks)'
    )
    poll, requests = (
        results.median("go", "poll_interval_s"),
        results.median("go", "settle_requests"),
    )
    if poll is not None:
        print(
            f"client-go's CPU is read around an unpolled phase ({fmt(requests)} request(s) after"
            f" the writer); its lag and rate come from a second phase polled every"
            f" {poll * 1e3:.1f} ms, so they are upper bounds, late by up to one interval."
        )
    print_missed(results)


def print_missed(results: Results) -> None:
    for index, measured in enumerate(results.rounds, start=1):
        for name, values in measured.items():
            missed = values.get("missed_events")
            if missed:
                print(f"  round {index}, {TITLES[name]}: {missed:.0f} writer events never seen")


# --- growth ---------------------------------------------------------------------------------------

GROWTH_COLUMNS = (
    ("sync_s", "sync s", 1.0),
    ("sync_us_per_pod", "sync us/pod", 1e6),
    ("sync_cpu_us_per_pod", "CPU us/pod", 1e6),
    ("rss_per_pod", "RSS KiB/pod", 1 / 1024),
    ("apiserver_cpu_s", "apiserver CPU s", 1.0),
    ("apiserver_cpu_us_per_pod", "apiserver us/pod", 1e6),
    ("apiserver_rss_peak", "apiserver MiB", 2**-20),
)


GROWTH_KEYS = ("sync_s", "sync_cpu_s", "rss_per_pod", "apiserver_cpu_s", "apiserver_rss_peak")


def growth_values(pods: int, values: Values) -> Values:
    def per_pod(key: str) -> float | None:
        value = values.get(key)
        return None if value is None else value / pods

    return {
        **values,
        "sync_us_per_pod": per_pod("sync_s"),
        "sync_cpu_us_per_pod": per_pod("sync_cpu_s"),
        "apiserver_cpu_us_per_pod": per_pod("apiserver_cpu_s"),
    }


def print_growth(growth: dict[int, Results]) -> None:
    print("\ngrowth: the sync at each pool size (medians over rounds)")
    print(
        f"{'pods':>7} {'contender':>18}"
        + "".join(f" {title:>16}" for _, title, _ in GROWTH_COLUMNS)
    )
    for pods, results in sorted(growth.items()):
        for name in present_contenders(results):
            row = growth_values(pods, {key: results.median(name, key) for key in GROWTH_KEYS})
            cells = "".join(f" {fmt(row[key], scale):>16}" for key, _, scale in GROWTH_COLUMNS)
            print(f"{pods:>7} {TITLES[name]:>18}{cells}")
    sizes = sorted(growth)
    if len(sizes) < 2:
        return
    print(f"\ncost per pod at {sizes[-1]:,} pods against {sizes[0]:,} (1.00: flat, linear growth):")
    for name in COLUMNS:
        ratios = []
        for key, title, _, per_pod in PER_POD:
            first, last = (
                cost_per_pod(growth[s], name, key, s, per_pod) for s in (sizes[0], sizes[-1])
            )
            if first and last:
                ratios.append(f"{title.split(' (')[0]} {last / first:.2f}")
        if ratios:
            print(f"  {TITLES[name]:>18}: " + ", ".join(ratios))


PER_POD = (
    ("sync_s", "LIST-to-synced per pod (us)", 1e6, True),
    ("sync_cpu_s", "contender CPU per pod (us)", 1e6, True),
    ("rss_per_pod", "contender RSS per pod (KiB)", 1 / 1024, False),
    ("apiserver_cpu_s", "apiserver CPU per pod (us)", 1e6, True),
)
"""What the plot shows and the flatness line compares: (key, title, scale, divide by pods)."""


def cost_per_pod(results: Results, name: str, key: str, pods: int, per_pod: bool) -> float | None:
    value = results.median(name, key)
    if value is None:
        return None
    return value / pods if per_pod else value


def plot_growth(growth: dict[int, Results], path: Path) -> str | None:
    """Writes the growth plot; returns why not when matplotlib (the ``bench`` extra) is missing."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no plot"
    sizes = sorted(growth)
    figure, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for axis, (key, title, scale, per_pod) in zip(axes.flat, PER_POD, strict=True):
        for name in COLUMNS:
            points = [
                (pods, value * scale)
                for pods in sizes
                if (value := cost_per_pod(growth[pods], name, key, pods, per_pod)) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                axis.plot(xs, ys, marker="o", label=TITLES[name])
        axis.set_xscale("log")
        axis.set_ylim(bottom=0)
        axis.set_xticks(sizes, [f"{s:,}" for s in sizes])
        axis.set_xlabel("pods in the pool")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend()
    figure.suptitle("bench/apiserver.py --growth: cost per pod against pool size (flat = linear)")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return None
