"""Differential soak: seeded operations and faults against a real control plane, ours beside
client-go, for a bounded time.

Run from the repository root::

    .venv/bin/python -m bench.soak --seconds 600 --seed 1     # the long one (docs/benchmarks.md)
    .venv/bin/python -m bench.soak --seconds 150 --seed 1     # a short one
    .venv/bin/python -m bench.soak --plan ci --seed 1         # the CI scenario, once

It starts its own etcd, two kube-apiservers, KWOK and, where it can run, the real node for the
kubelet churn (run it under `flock /tmp/miles-realnode-session.lock`; MILES_K8S_NODE=kwok leaves
the node out; the pinned binaries are built first if missing), runs
`miles.utils.k8s_testenv.testing.differential.harness` until the time is up (the step in flight is
finished), and prints: where the pods ran, operations applied, faults injected by kind, checkpoints
compared, divergences, relists, and the median and worst convergence time after each fault kind for
ours and for client-go side by side, then the resources of the loop's own process
(`bench/soak_loop.py`, so that the harness's writers, fresh LISTs and TLS-terminating fault
proxies do not count in them) and of the soak's. Exit status 0 only when every checkpoint was
compared and none diverged.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.soak_sampler import ResourceSampler
from miles.utils.k8s_testenv import EnvSettings, K8sTestEnvError, ensure_binaries
from miles.utils.k8s_testenv.binaries import print_stderr
from miles.utils.k8s_testenv.testing.differential.config import HarnessConfig
from miles.utils.k8s_testenv.testing.differential.environment import (
    DifferentialEnvironment,
    differential_environment,
)
from miles.utils.k8s_testenv.testing.differential.errors import DivergenceError, HarnessAborted
from miles.utils.k8s_testenv.testing.differential.harness import DifferentialHarness
from miles.utils.k8s_testenv.testing.differential.lifecycle import OursFactory, logs_to
from miles.utils.k8s_testenv.testing.differential.ours import (
    OurLoop,
    OurLoopProcess,
    OurLoopSettings,
)
from miles.utils.k8s_testenv.testing.differential.scenario import FaultKind, OpKind, ci_plan
from miles.utils.k8s_testenv.testing.differential.stats import Stats


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150.0, help="how long to keep stepping")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plan", choices=["random", "ci"], default="random")
    parser.add_argument("--target", choices=["uncached", "cached"], default="uncached")
    parser.add_argument("--bulk-size", type=int, default=200)
    parser.add_argument(
        "--silent-seconds",
        type=float,
        default=8.0,
        help="how long a silent or dead connection lasts (above our watch's 7 s read deadline)",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        choices=[step.value for step in (*OpKind, *FaultKind)],
        help="leave this operation or fault out (repeatable); the report names what was left out",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="count a divergence and go on (the exit status is still 1)",
    )
    parser.add_argument(
        "--no-engine-pools",
        action="store_true",
        help="pods alone, as soaks before the engine pools were written beside them",
    )
    parser.add_argument("--sample-every", type=float, default=10.0, help="resource sampling period")
    parser.add_argument(
        "--no-tracemalloc", action="store_true", help="sample without tracemalloc's overhead"
    )
    parser.add_argument(
        "--loop-in-process",
        action="store_true",
        help="run our loop in the soak's process (its resources are then the harness's too)",
    )
    parser.add_argument(
        "--pod-kib",
        type=float,
        default=12.2,
        help="RSS per stored pod subtracted in rss_less_pods_mib (bench/apiserver.py)",
    )
    parser.add_argument(
        "--oracle-watch-list", action="store_true", help="client-go's WatchListClient on"
    )
    parser.add_argument(
        "--streaming-list", action="store_true", help="ours lists by a streaming list"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="logs (default: a temp dir)")
    return parser.parse_args()


def _ours(args: argparse.Namespace, work_dir: Path) -> OursFactory:
    if args.loop_in_process:
        return OurLoop
    sampling = [
        f"--work-dir={work_dir}",
        f"--sample-every={args.sample_every}",
        f"--warmup={_warmup(args)}",
        f"--pod-kib={args.pod_kib}",
        *(["--no-tracemalloc"] if args.no_tracemalloc else []),
    ]

    def factory(settings: OurLoopSettings) -> OurLoopProcess:
        return OurLoopProcess(
            settings,
            module="bench.soak_loop",
            log_path=work_dir / "loop.log",
            extra_args=tuple(sampling),
        )

    return factory


def _warmup(args: argparse.Namespace) -> float:
    return min(60.0, float(args.seconds) / 5)


async def _run(env: DifferentialEnvironment, args: argparse.Namespace) -> Stats:
    config = HarnessConfig(
        seed=args.seed,
        target=args.target,
        bulk_size=args.bulk_size,
        silent_seconds=args.silent_seconds,
        oracle_watch_list=args.oracle_watch_list,
        streaming_list=args.streaming_list,
        without=frozenset(args.without),
        keep_going=args.keep_going,
        engine_pools=not args.no_engine_pools,
    )
    harness = DifferentialHarness.on(
        env, config=config, log=print_stderr, ours=_ours(args, env.work_dir)
    )
    sampler = ResourceSampler(
        period=args.sample_every,
        warmup=_warmup(args),
        log_path=env.work_dir / "resources.tsv",
        stored_pods=lambda: harness.stored_pods,
        trace_allocations=not args.no_tracemalloc,
        title="the soak's process" + (", our loop in it" if args.loop_in_process else ""),
        pod_kib=args.pod_kib if args.loop_in_process else 0.0,
    )
    try:
        async with sampler, harness:
            try:
                if args.plan == "ci":
                    plan = ci_plan(random.Random(args.seed), without=config.without)
                    return await harness.run(plan)
                return await harness.run_for(args.seconds)
            finally:
                print(harness.stats.report(), flush=True)
    finally:
        print(sampler.report(), flush=True)
        if (loop_report := env.work_dir / "loop-resources.txt").exists():
            print(loop_report.read_text(), end="", flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    # SIGTERM, and SIGINT even where a shell started the soak in the background with SIGINT
    # ignored, unwind like Ctrl-C: the control plane and the oracle are then stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    args = _arguments()
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="miles-soak-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "loop-resources.txt").unlink(missing_ok=True)
    started = time.monotonic()
    print(
        f"soak: seed {args.seed}, plan {args.plan}, "
        + (f"{args.seconds:.0f}s, " if args.plan == "random" else "")
        + f"clients on the {args.target} apiserver, "
        + f"oracle WatchListClient {'on' if args.oracle_watch_list else 'off'}, "
        + f"ours streaming list {'on' if args.streaming_list else 'off'}"
        + (f", without {', '.join(args.without)}" if args.without else "")
        + f"; logs in {work_dir}",
        flush=True,
    )
    settings = EnvSettings.from_env()
    try:
        binaries = ensure_binaries(settings=settings, log=print_stderr)
        with (
            logs_to(work_dir / "runtime.log"),
            differential_environment(
                binaries=binaries, settings=settings, work_dir=work_dir, log=print_stderr
            ) as env,
        ):
            stats = asyncio.run(_run(env, args))
        if stats.divergences:
            print(f"soak: {stats.divergences} DIVERGENCE(S), counted with --keep-going", flush=True)
            return 1
    except DivergenceError as err:
        print(f"soak: DIVERGENCE\n{err}", flush=True)
        return 1
    except (HarnessAborted, K8sTestEnvError) as err:
        print(f"soak: ABORTED, the comparison could not be made: {err}", flush=True)
        return 2
    except KeyboardInterrupt as err:
        print(f"soak: INTERRUPTED by {err or 'SIGINT'} after {time.monotonic() - started:.0f}s")
        return 130
    print(f"soak: done in {time.monotonic() - started:.0f}s wall time", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
