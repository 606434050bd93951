"""In-memory benchmark of the runtime core (driver, store, queue, worker) against a floor.

Run from the repository root::

    .venv/bin/python -m bench.pipeline            # 10k and 100k pods over 1k parents
    .venv/bin/python -m bench.pipeline --quick    # 10k pods only (CI smoke)
    .venv/bin/python -m bench.pipeline --json     # machine-readable output

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

The parts: ``pipeline_floor`` (the floor), ``pipeline_workload``, ``pipeline_contender`` (what is
driven, the feed and the probe), ``pipeline_measure`` (the passes) and ``pipeline_report`` (rows
and table, on ``bench/report.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
from dataclasses import asdict

from bench.pipeline_contender import IMPLEMENTATIONS
from bench.pipeline_measure import CLOCKS, measure_pass, run_memory
from bench.pipeline_report import (
    Row,
    json_report,
    make_rows,
    misses_metrics_target,
    misses_target,
    print_table,
)
from bench.pipeline_workload import build_workload
from bench.report import Results, Values

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


def run_size(*, pods: int, args: argparse.Namespace, impls: list[str]) -> Results:
    """Every round's figures per implementation, taken back to back; memory in the first round."""
    workload = build_workload(
        pods=pods,
        parents=args.parents,
        events=args.events,
        samples=args.samples,
        seed=args.seed,
    )
    results = Results()
    gc.collect()
    gc.freeze()
    try:
        for round_index in range(args.rounds):
            measured: dict[str, Values] = {name: {} for name in impls}
            results.rounds.append(measured)
            order = impls if round_index % 2 == 0 else impls[::-1]
            for streamed, keys in PASS_METRICS.items():
                for name in order:
                    gc.collect()
                    one = asyncio.run(
                        measure_pass(
                            IMPLEMENTATIONS[name],
                            workload,
                            streamed=streamed,
                            phase_timeout=args.timeout,
                            now=CLOCKS[args.clock],
                        )
                    )
                    measured[name].update({key: one.get(key) for key in keys})
                    _progress(f"{pods} pods, round {round_index + 1}, {name}: {one}", args)
        for name in impls:
            gc.collect()
            memory = run_memory(IMPLEMENTATIONS[name], workload)
            results.rounds[0][name].update(asdict(memory))
            _progress(f"{pods} pods, memory, {name}: {memory}", args)
    finally:
        gc.unfreeze()
    return results


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
        report = json_report(
            rows, rounds=args.rounds, clock=args.clock, events=args.events, samples=args.samples
        )
        print(json.dumps(report, indent=2))
    else:
        print_table(rows, rounds=args.rounds, clock=args.clock)
    misses = any(misses_target(row) or misses_metrics_target(row) for row in rows)
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
