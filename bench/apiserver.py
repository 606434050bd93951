"""Against a real kube-apiserver: ours, ``kubernetes_asyncio``'s own models, and client-go.

Run from the repository root::

    .venv/bin/python -m bench.apiserver                 # 10,000 pods over 1,000 parents, 3 rounds
    .venv/bin/python -m bench.apiserver --quick         # 1,000 pods over 100 parents, 1 round
    .venv/bin/python -m bench.apiserver --profile ours  # then one cProfiled run of ours

It starts a local control plane (etcd plus a kube-apiserver with its watch cache on; or reuses
``MILES_K8S_KUBECONFIG``), creates ``--pods`` realistic pods (``bench/apiserver_seed.py``) once, and
then, for ``--rounds`` rounds, runs each contender alone, one after another, each in its own
process against the same apiserver state (the order rotates every round):

- ours: ``ReconcileLoop`` over ``KubernetesReflector`` and ``KubernetesAsyncioPodApi``;
- kubernetes_asyncio: the same ``ReconcileLoop`` over a reflector on ``kubernetes_asyncio``'s
  ``Watch`` and ``V1Pod`` models (``bench/apiserver_ka_reflector.py``);
- client-go: ``tools/k8s/oracle``, client-go's ``Reflector`` and ``Store``.

What is measured, per contender and round (the figure printed is the median over the rounds, and
each ratio the median of the per-round ratios, so that one noisy round moves neither):

- LIST-to-synced: from just before the API client is built (for client-go: just before its process
  starts) until the store holds every pod and, for the Python contenders, every parent has been
  reconciled once;
- memory: the growth of the process's resident set (``VmRSS``) from before the LIST to the moment
  of sync, per stored pod. For client-go "before" is an oracle synced to an empty selection;
- WATCH ingestion: a writer process (``bench/apiserver_writer.py``) patches a label and an
  annotation of random pods, ``--writer-concurrency`` patches in flight, for ``--watch-seconds``.
  The rate is the writer's events divided by the time from the writer's start until the contender
  has applied its last one; the lag of an event is the time from the writer receiving the
  apiserver's acknowledgement (the new resourceVersion) until the contender's store holds that
  resourceVersion (median and p99 over every event); the CPU per event is the contender's CPU time
  over the phase divided by its events;
- reconcile dispatch latency, under that load: from an event being applied to the store until
  the reconcile of its parent starts (median and p99 over every event). The oracle has no
  controller, so it has no figure here.

In every ratio column a number above 1 means ours is better (faster, smaller, higher rate).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.apiserver_oracle import baseline_rss, oracle_process
from bench.apiserver_proc import REPO_ROOT, child_argv, cpu_seconds, rss_bytes

CONTENDERS = ("ours", "ka", "go")
TITLES = {
    "ours": "ours",
    "ka": "kubernetes_asyncio",
    "go": "client-go",
}
COLUMNS = {
    "ours": "ours",
    "ka": "k8s_asyncio",
    "go": "client-go",
}
LINE_LIMIT = 256 * 2**20
SYNC_TIMEOUT = 600.0
POLL_COST_SHARE = 5.0
"""Oracle polls are spaced at least this many snapshot costs apart: at most 20% of a core."""
Values = dict[str, float | None]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    scale: float
    higher_is_better: bool


METRICS: dict[str, Metric] = {
    "sync_s": Metric("LIST-to-synced", "s", 1.0, False),
    "sync_cpu_s": Metric("  CPU the contender spent on it", "s", 1.0, False),
    "rss_per_pod": Metric("RSS growth per stored pod", "KiB", 1 / 1024, False),
    "rss_trimmed_per_pod": Metric("  the same after gc + malloc_trim", "KiB", 1 / 1024, False),
    "events_per_s": Metric("WATCH events applied per second", "ev/s", 1.0, True),
    "lag_p50": Metric("WATCH lag behind the apiserver, median", "ms", 1e3, False),
    "lag_p99": Metric("WATCH lag behind the apiserver, p99", "ms", 1e3, False),
    "cpu_per_event": Metric("contender CPU per WATCH event", "us", 1e6, False),
    "dispatch_p50": Metric("reconcile dispatch latency, median", "us", 1e6, False),
    "dispatch_p99": Metric("reconcile dispatch latency, p99", "us", 1e6, False),
    "writer_rate": Metric("writer: patches acknowledged per second", "ev/s", 1.0, True),
    "gc_sync_s": Metric("cyclic GC pauses during sync, total", "ms", 1e3, False),
    "gc_watch_max_s": Metric("longest cyclic GC pause during WATCH", "ms", 1e3, False),
}


@dataclass(frozen=True)
class Target:
    metric: str
    other: str
    at_least: float
    text: str


TARGETS = (
    Target("sync_s", "ka", 6.0, ">= 6x faster than kubernetes_asyncio"),
    Target("sync_s", "go", 1.0, "no slower than client-go"),
    Target("events_per_s", "go", 0.5, ">= half of client-go's rate"),
    Target("rss_per_pod", "go", 1.0, "no more than client-go"),
)


@dataclass(frozen=True)
class Env:
    kubeconfig: Path
    oracle: Path
    logs: Path
    compact: Callable[[], object] | None


@dataclass
class WriterRun:
    started: float
    acks: list[tuple[float, int]]
    errors: int

    @property
    def last_rv(self) -> int:
        return max((rv for _, rv in self.acks), default=0)


# --- child processes ------------------------------------------------------------------------------


class Child:
    """A bench child process speaking JSON lines on stdout and commands on stdin."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name

    async def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        await self.process.stdin.drain()

    async def read(self, phase: str, within: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), within)
        if not line:
            code = await self.process.wait()
            raise RuntimeError(f"{self.name} exited with {code} before {phase!r}; see its log")
        message: dict[str, Any] = json.loads(line)
        if message.get("phase") != phase:
            raise RuntimeError(f"{self.name}: expected {phase!r}, got {line[:200]!r}")
        return message


@contextlib.asynccontextmanager
async def child(module: str, args: Sequence[str], *, log: Path) -> AsyncIterator[Child]:
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            *child_argv(module, *args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            cwd=REPO_ROOT,
            limit=LINE_LIMIT,
        )
    try:
        yield Child(process, module)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def ready_writer(env: Env, args: argparse.Namespace, seed: int) -> AsyncIterator[Child]:
    writer_args = [
        f"--kubeconfig={env.kubeconfig}",
        f"--pods={args.pods}",
        f"--seconds={args.watch_seconds}",
        f"--concurrency={args.writer_concurrency}",
        f"--seed={seed}",
    ]
    async with child("apiserver_writer", writer_args, log=env.logs / "writer.log") as writer:
        await writer.read("ready", 60.0)
        yield writer


async def run_writer(writer: Child, args: argparse.Namespace) -> WriterRun:
    await writer.send("go")
    done = await writer.read("done", args.watch_seconds + 120.0)
    acks = [(float(stamp), int(rv)) for stamp, rv in done["acks"]]
    return WriterRun(started=float(done["started"]), acks=acks, errors=int(done["errors"]))


# --- figures --------------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ingestion(writer: WriterRun, applied: dict[int, float], cpu: float) -> Values:
    """Rate, lag and CPU per event from the writer's acknowledgements and the applied stamps."""
    lags = [applied[rv] - acked for acked, rv in writer.acks if rv in applied]
    seen = [applied[rv] for _, rv in writer.acks if rv in applied]
    last_ack = max((acked for acked, _ in writer.acks), default=writer.started)
    return {
        "events_per_s": len(seen) / (max(seen) - writer.started) if seen else None,
        "lag_p50": percentile(lags, 0.5),
        "lag_p99": percentile(lags, 0.99),
        "cpu_per_event": cpu / len(seen) if seen else None,
        "writer_rate": len(writer.acks) / (last_ack - writer.started) if writer.acks else None,
        "missed_events": float(len(writer.acks) - len(seen)),
    }


def stamps_from_polls(writer: WriterRun, polls: Sequence[tuple[float, int]]) -> dict[int, float]:
    """For each written resourceVersion, the first poll that saw the store at or past it."""
    stamps: dict[int, float] = {}
    rvs = sorted(rv for _, rv in writer.acks)
    index = 0
    for stamp, seen in sorted(polls):
        while index < len(rvs) and rvs[index] <= seen:
            stamps[rvs[index]] = stamp
            index += 1
    return stamps


# --- contenders -----------------------------------------------------------------------------------


async def measure_python(
    name: str, env: Env, args: argparse.Namespace, seed: int, profile: str | None = None
) -> Values:
    contender_args = [
        f"--contender={name}",
        f"--kubeconfig={env.kubeconfig}",
        f"--parents={args.parents}",
        f"--drain-timeout={args.drain_timeout}",
    ]
    if profile is not None:
        contender_args.append(f"--profile={profile}")
    async with child("apiserver_contender", contender_args, log=env.logs / f"{name}.log") as proc:
        synced = await proc.read("synced", SYNC_TIMEOUT)
        async with ready_writer(env, args, seed) as writer:
            await proc.send("mark")
            await proc.read("marked", 30.0)
            written = await run_writer(writer, args)
        await proc.send(f"drain {written.last_rv}")
        drained = await proc.read("drained", args.drain_timeout + 60.0)
        await proc.send("quit")
    applied = {int(rv): float(stamp) for rv, stamp in drained["applied"]}
    gc_sync = [float(seconds) for _, seconds in synced["gc_pauses"]]
    gc_watch = [float(seconds) for _, seconds in drained["gc_pauses"]]
    dispatch = [float(latency) for latency in drained["dispatch"]]
    values: Values = {
        "sync_s": synced["synced"] - synced["started"],
        "sync_cpu_s": synced["sync_cpu"],
        "rss_per_pod": (synced["rss_after"] - synced["rss_before"]) / max(synced["pods"], 1),
        "rss_trimmed_per_pod": (synced["rss_trimmed"] - synced["rss_before"])
        / max(synced["pods"], 1),
        "stored": float(synced["pods"]),
        "dispatch_p50": percentile(dispatch, 0.5),
        "dispatch_p99": percentile(dispatch, 0.99),
        "gc_sync_s": sum(gc_sync),
        "gc_watch_max_s": max(gc_watch, default=0.0),
    }
    values.update(ingestion(written, applied, float(drained["cpu"])))
    return values


async def measure_go(env: Env, args: argparse.Namespace, seed: int) -> Values:
    log = env.logs / "oracle.log"
    rss_before = await baseline_rss(env.oracle, env.kubeconfig, log=log)
    started = time.monotonic()
    async with oracle_process(env.oracle, env.kubeconfig, log=log) as oracle:
        snap = await oracle.wait_until(pods=args.pods, within=SYNC_TIMEOUT)
        sync_cpu = cpu_seconds(oracle.pid)
        rss_after = rss_bytes(oracle.pid)
        interval = max(args.oracle_poll, POLL_COST_SHARE * await oracle.snapshot_cost())
        polls: list[tuple[float, int]] = []
        stop = asyncio.Event()

        async def poll() -> None:
            while not stop.is_set():
                seen = await oracle.snapshot()
                polls.append((seen.stamp, seen.resource_version))
                await asyncio.sleep(interval)

        async with ready_writer(env, args, seed) as writer:
            cpu_before = cpu_seconds(oracle.pid)
            poller = asyncio.create_task(poll())
            written = await run_writer(writer, args)
        drained = await _wait_for_poll(polls, written.last_rv, args.drain_timeout)
        stop.set()
        await poller
        cpu = cpu_seconds(oracle.pid) - cpu_before
        cost = await oracle.snapshot_cost()
    values: Values = {
        "sync_s": snap.stamp - started,
        "sync_cpu_s": sync_cpu,
        "rss_per_pod": (rss_after - rss_before) / max(snap.pods, 1),
        "stored": float(snap.pods),
        "dispatch_p50": None,
        "dispatch_p99": None,
        "snapshot_cost_s": cost,
        "poll_interval_s": interval,
        "polls": float(len(polls)),
        "drained": float(drained),
    }
    values.update(
        ingestion(written, stamps_from_polls(written, polls), max(cpu - cost * len(polls), 0.0))
    )
    return values


async def _wait_for_poll(polls: list[tuple[float, int]], rv: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if polls and polls[-1][1] >= rv:
            return True
        await asyncio.sleep(0.01)
    return False


async def measure(name: str, env: Env, args: argparse.Namespace, seed: int) -> Values:
    try:
        if name == "go":
            return await measure_go(env, args, seed)
        return await measure_python(name, env, args, seed)
    finally:
        if env.compact is not None:
            env.compact()


# --- report ---------------------------------------------------------------------------------------


@dataclass
class Results:
    rounds: list[dict[str, Values]] = field(default_factory=list)

    def median(self, name: str, key: str) -> float | None:
        present = [v for r in self.rounds if (v := r[name].get(key)) is not None]
        return statistics.median(present) if present else None

    def advantage(self, key: str, other: str) -> float | None:
        """Median over rounds of how many times better ours is than ``other`` (>1: ours better)."""
        ratios = []
        for r in self.rounds:
            ours, theirs = r["ours"].get(key), r[other].get(key)
            if ours is None or theirs is None or min(ours, theirs) <= 0:
                continue
            ratios.append(ours / theirs if METRICS[key].higher_is_better else theirs / ours)
        return statistics.median(ratios) if ratios else None


def _fmt(value: float | None, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    scaled = value * scale
    if abs(scaled) >= 100:
        return f"{scaled:,.0f}"
    return f"{scaled:.2f}" if abs(scaled) >= 1 else f"{scaled:.3f}"


def print_table(results: Results, args: argparse.Namespace, context: dict[str, Any]) -> None:
    print(
        f"\n{args.pods} pods ({context['pod_bytes']:.0f} B of JSON each) over {args.parents}"
        f" parents, {len(results.rounds)} round(s), medians; ratios: > 1 means ours is better"
    )
    names = [name for name in COLUMNS if any(r.get(name) for r in results.rounds)]
    header = f"{'metric':42} {'unit':>5}" + "".join(f" {COLUMNS[n]:>11}" for n in names)
    print(f"{header} {'ours vs k8s_asyncio':>19} {'ours vs client-go':>17}")
    for key, metric in METRICS.items():
        cells = "".join(f" {_fmt(results.median(n, key), metric.scale):>11}" for n in names)
        ratios = [_fmt(results.advantage(key, other)) for other in ("ka", "go")]
        print(f"{metric.name:42} {metric.unit:>5}{cells} {ratios[0]:>19} {ratios[1]:>17}")
    print("\ntargets:")
    for target in TARGETS:
        ratio = results.advantage(target.metric, target.other)
        verdict = "n/a" if ratio is None else "met" if ratio >= target.at_least else "MISSED"
        print(f"  {METRICS[target.metric].name}: {target.text}: ratio {_fmt(ratio)} -> {verdict}")
    print(
        f"\nseeding took {_fmt(context.get('seed_s'))} s (0 if reused); the same LIST read raw,"
        f" decoding nothing: {_fmt(context['list_floor_s'])} s (resourceVersion unset, as ours"
        f' and kubernetes_asyncio ask), {_fmt(context["list_floor_rv0_s"])} s ("0", as client-go'
        " asks)"
    )
    poll, cost = results.median("go", "poll_interval_s"), results.median("go", "snapshot_cost_s")
    if poll is not None and cost is not None:
        print(
            f"client-go is read by asking for its progress every {poll * 1e3:.1f} ms (each poll"
            f" costs it {cost * 1e6:.0f} us of CPU, subtracted): its lags are upper bounds, late"
            " by up to one interval."
        )
    for index, measured in enumerate(results.rounds, start=1):
        for name in measured:
            missed = measured[name].get("missed_events")
            if missed:
                print(f"  round {index}, {TITLES[name]}: {missed:.0f} writer events never seen")


def print_profile(prefix: str, top: int) -> None:
    for phase in ("sync", "watch"):
        path = f"{prefix}.{phase}.prof"
        if not os.path.exists(path):
            continue
        print(f"\n--- cProfile (CPU time), {phase} phase ({path}), by own time ---")
        stats = pstats.Stats(path, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(top)


# --- driver ---------------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def prepare(env: Env, args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes_asyncio import client

    from bench.apiserver_seed import count_pods, create_pods, ensure_namespace, mean_pod_bytes
    from miles.utils.k8s_testenv.client import api_client

    context: dict[str, Any] = {}
    async with api_client(env.kubeconfig) as api:
        core = client.CoreV1Api(api)
        await ensure_namespace(core)
        present = await count_pods(core)
        if present != args.pods:
            if present > args.pods:
                raise RuntimeError(f"the bench namespace holds {present} pods, want {args.pods}")
            context["seed_s"] = await create_pods(
                core, pods=args.pods, parents=args.parents, parallel=32, progress=_progress
            )
        context["pod_bytes"] = await mean_pod_bytes(core)
    if env.compact is not None:
        env.compact()
    return context


async def list_floor(env: Env, *, resource_version: str | None = None) -> float:
    """Seconds to GET the same LIST and read its whole body, decoding nothing: the server's part."""
    from kubernetes_asyncio import client

    from bench.apiserver_proc import NAMESPACE, SELECTOR
    from miles.utils.k8s_testenv.client import api_client

    async with api_client(env.kubeconfig) as api:
        started = time.monotonic()
        core: Any = client.CoreV1Api(api)
        resp = await core.list_namespaced_pod(
            NAMESPACE,
            label_selector=SELECTOR,
            resource_version=resource_version,
            _preload_content=False,
        )
        try:
            await resp.read()
        finally:
            resp.release()
        return time.monotonic() - started


async def bench(env: Env, args: argparse.Namespace) -> None:
    context = await prepare(env, args)
    _progress(f"{args.pods} pods ready, {context['pod_bytes']:.0f} B each; measuring")
    results = Results()
    floors: dict[str, list[float]] = {"list_floor_s": [], "list_floor_rv0_s": []}
    for index in range(args.rounds):
        measured: dict[str, Values] = {}
        floors["list_floor_s"].append(await list_floor(env))
        floors["list_floor_rv0_s"].append(await list_floor(env, resource_version="0"))
        shift = index % len(args.contenders)
        for offset, name in enumerate(args.contenders[shift:] + args.contenders[:shift]):
            measured[name] = await measure(name, env, args, seed=index * 10 + offset)
            _progress(f"round {index + 1}, {TITLES[name]}: {_short(measured[name])}")
        for name in COLUMNS:
            measured.setdefault(name, {})
        results.rounds.append(measured)
    context.update({key: statistics.median(values) for key, values in floors.items()})
    print_table(results, args, context)
    if args.json:
        print(
            json.dumps(
                {"args": vars(args), "context": context, "rounds": results.rounds}, default=str
            )
        )
    if args.profile:
        prefix = str(env.logs / args.profile)
        _progress(f"profiling {args.profile} (one extra run)")
        await measure_python(args.profile, env, args, seed=999, profile=prefix)
        print_profile(prefix, args.profile_top)


def _short(values: Values) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())


@contextlib.contextmanager
def environment(logs: Path) -> Iterator[Env]:
    from miles.utils.k8s_testenv.binaries import ensure_binaries
    from miles.utils.k8s_testenv.control_plane import LocalControlPlane
    from miles.utils.k8s_testenv.settings import EnvSettings

    settings = EnvSettings.from_env()
    oracle = ensure_binaries(names=["oracle"], settings=settings).oracle
    if settings.kubeconfig is not None:
        yield Env(kubeconfig=settings.kubeconfig, oracle=oracle, logs=logs, compact=None)
        return
    with LocalControlPlane(settings=settings) as plane:
        _progress(f"control plane up in {plane.work_dir}")
        yield Env(
            kubeconfig=plane.cached_kubeconfig,
            oracle=oracle,
            logs=logs,
            compact=plane.compact_etcd,
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=None, help="default 10000 (--quick: 1000)")
    parser.add_argument("--parents", type=int, default=None, help="default pods / 10")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--watch-seconds", type=float, default=None, help="default 8 (quick: 3)")
    parser.add_argument("--writer-concurrency", type=int, default=32)
    parser.add_argument(
        "--oracle-poll", type=float, default=0.005, help="least seconds between oracle polls"
    )
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 pods, one round")
    parser.add_argument("--profile", choices=("ours", "ka"), default=None)
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--logs", type=Path, default=None, help="folder for child logs")
    parser.add_argument("--json", action="store_true", help="also print every round as JSON")
    args = parser.parse_args(argv)
    args.pods = args.pods or (1000 if args.quick else 10_000)
    args.parents = args.parents or max(args.pods // 10, 1)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.watch_seconds = args.watch_seconds or (3.0 if args.quick else 8.0)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="miles-bench-apiserver-"))
    logs.mkdir(parents=True, exist_ok=True)
    _progress(f"child logs in {logs}")
    with environment(logs) as env:
        asyncio.run(bench(env, args))


if __name__ == "__main__":
    main()
