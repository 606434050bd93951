"""Against a real kube-apiserver: ours, ``kubernetes_asyncio``'s own models, client-go and kube-rs.

Run from the repository root::

    .venv/bin/python -m bench.apiserver                 # 10,000 pods over 1,000 parents, 3 rounds
    .venv/bin/python -m bench.apiserver --quick         # 1,000 pods over 100 parents, 1 round
    .venv/bin/python -m bench.apiserver --profile ours  # then one cProfiled run of ours
    .venv/bin/python -m bench.apiserver --growth 1000 10000 30000   # the sync at each size, a plot
    .venv/bin/python -m bench.apiserver --instructions  # instructions per WATCH event (callgrind)
    .venv/bin/python -m bench.apiserver --kind enginepools [--instructions]  # custom objects

It starts a local control plane (etcd plus a kube-apiserver with its watch cache on; or reuses
``MILES_K8S_KUBECONFIG``, e.g. one left running with ``MILES_K8S_KEEP=1``, whose seeded pods it
then reuses), creates ``--pods`` realistic pods (``bench/apiserver_seed.py``, one namespace per pool
size) once, and then, for ``--rounds`` rounds, runs each contender alone, one after another, each
in its own process against the same apiserver state (the order rotates every round):

- ours: ``ReconcileLoop`` over ``KubernetesReflector`` and ``KubernetesAsyncioPodApi``;
- kubernetes_asyncio: the same ``ReconcileLoop`` over a reflector on ``kubernetes_asyncio``'s
  ``Watch`` and ``V1Pod`` models (``bench/apiserver_ka_reflector.py``);
- client-go: ``tools/k8s/oracle``, client-go's ``Reflector`` and ``Store``;
- kube-rs: ``tools/kube-rs-oracle``, kube-runtime's ``watcher`` (default ``Config``) into a
  ``reflector::store::<Pod>()``, built with cargo on first use (``bench/apiserver_kube_rs.py``);
- the wire: the same LIST and WATCH over ours's client stack, read and not decoded
  (``bench/apiserver_wire.py``), the floor of a Python client; ``wire-decode`` and ``wire-keep``
  (not default) add ours's decoding of each WATCH line, then keeping its pod.

A contender that cannot be built is skipped with one line saying why; the rest run, and the exit
status reflects the targets that could be judged. What is measured, per contender and round (the
figure printed is the median over the rounds, and each ratio the median of per-round ratios):

- LIST-to-synced: from just before the API client is built (for the compiled contenders: just
  before their process starts) until the store holds every pod and, for the Python contenders,
  every parent has been reconciled once; beside it the contender's CPU, and the apiserver's CPU
  and peak RSS over the same span, read from its ``/proc``. The wire's floor is the same LIST in
  pages of 500, read raw, decoding nothing;
- memory: the growth of the process's resident set (``VmRSS``) from before the LIST to the moment
  of sync, per stored pod. For the compiled contenders "before" is the same program synced to an
  empty selection;
- WATCH ingestion: a writer process (``bench/apiserver_writer.py``) patches a label and an
  annotation of random pods, ``--writer-concurrency`` patches in flight, for ``--watch-seconds``
  (``--writer-rate`` paces them evenly instead, so that every contender meets the same load).
  The rate is the writer's events divided by the time from the writer's start until the contender
  has applied its last one; the lag of an event is the time from the writer receiving the
  apiserver's acknowledgement until the contender's store holds that resourceVersion; the CPU per
  event is the contender's CPU over an unpolled window divided by the writer's events (see
  ``bench/apiserver_measure.py``); a Python contender collects its garbage fully just before the
  window, so that each window starts from the same collector state, and reports the collector's
  pauses inside it and one full collection's cost after it;
- reconcile dispatch latency, under that load: from an event being applied to the store until
  the reconcile of its parent starts. The compiled contenders have no controller, so no figure.

``--growth`` measures only the sync, at each pool size, and writes a plot of cost per pod.
``--instructions`` measures only the WATCH phase of ours, kube-rs and the wire, each under
valgrind's callgrind, as instructions per event (``bench/apiserver_callgrind.py``): a CPU figure
the host's load does not move; its exit status is that target's.
``--kind enginepools`` runs ours over the pods beside ours over as many engine pools of a pod's
size, typed and dynamic, and the raw paged LIST of the pools, in the same rounds, every writer
paced at ``apiserver_objects.PACE`` unless ``--writer-rate`` (``bench/apiserver_objects.py``); its
exit status is the engine pools' targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.apiserver_callgrind import (
    COUNTED,
    NOT_COUNTED,
    RATE,
    Callgrind,
    count,
    self_costs,
)
from bench.apiserver_kube_rs import ContenderUnavailable, ensure_kube_rs
from bench.apiserver_measure import Env, Scenario, measure_compiled, measure_python
from bench.apiserver_objects import (
    CEILINGS,
    INSTRUCTION_CEILINGS,
    KIND,
    PACE,
    check_ceilings,
    pace_kept,
)
from bench.apiserver_objects import CONTENDERS as OBJECT_CONTENDERS
from bench.apiserver_proc import SELECTOR, read_body
from bench.apiserver_report import (
    INSTRUCTION_TARGETS,
    TITLES,
    check_targets,
    plot_growth,
    print_growth,
    print_missed,
    print_notes,
    print_rounds,
    print_shares,
    print_table,
)
from bench.apiserver_seed import namespace_for
from bench.apiserver_wire import WIRE_LEVELS
from bench.report import Results, Values, fmt

CONTENDERS = (
    "ours",
    "ka",
    "go",
    "kube-rs",
    "ours-stream",
    "go-stream",
    *WIRE_LEVELS,
    *OBJECT_CONTENDERS,
)
DEFAULT_CONTENDERS = ("ours", "ka", "go", "kube-rs", "wire")
COUNTED_DEFAULT = ("ours", "kube-rs", "wire")
COMPILED = ("go", "kube-rs", "go-stream")
PAGE_SIZE = 500
DEFAULT_PLOT = Path("docs") / "apiserver-growth.png"
_CONTINUE = re.compile(rb'"continue":"([^"]*)"')


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def measure(
    name: str, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int
) -> Values:
    if name in COMPILED:
        return await measure_compiled(name, env, scenario, args, seed)
    return await measure_python(name, env, scenario, args, seed)


# --- the apiserver's state ------------------------------------------------------------------------


async def prepare(env: Env, pods: int, parents: int) -> tuple[Scenario, dict[str, Any]]:
    """Seeds the pool of this size if it is not there yet; the scenario as the apiserver has it."""
    from kubernetes_asyncio import client

    from bench.apiserver_seed import (
        create_pods,
        ensure_namespace,
        list_items,
        mean_pod_bytes,
        parents_of,
    )
    from miles.utils.k8s_testenv.client import api_client

    namespace = namespace_for(pods)
    context: dict[str, Any] = {"seed_s": 0.0}
    async with api_client(env.kubeconfig) as api:
        core = client.CoreV1Api(api)
        await ensure_namespace(core, namespace)
        present = len(await list_items(core, namespace))
        if present > pods:
            raise RuntimeError(f"namespace {namespace} holds {present} pods, want {pods}")
        if present < pods:
            _progress(f"seeding {pods - present} pods into {namespace}")
            context["seed_s"] = await create_pods(
                core,
                namespace=namespace,
                pods=pods,
                parents=parents,
                parallel=32,
                progress=_progress,
                start=present,
            )
        items = await list_items(core, namespace)
        context["pod_bytes"] = mean_pod_bytes(items)
        scenario = Scenario(
            namespace=namespace, pods=len(items), parents=parents_of(items), watch=True
        )
    if env.compact is not None:
        env.compact()
    return scenario, context


async def list_floor(
    env: Env,
    namespace: str,
    *,
    resource_version: str | None = None,
    limit: int | None = None,
    kind: str = "pods",
) -> float:
    """Seconds to GET the same LIST and read every body, decoding nothing: the server's part.

    With ``limit`` the pages are followed by their continue token, found in the first bytes of
    each body (the server writes a pod list's ``metadata`` before ``items``; a custom resource's
    list, unstructured, after)."""
    from kubernetes_asyncio import client

    from bench.apiserver_objects import list_page
    from miles.utils.k8s_testenv.client import api_client

    async with api_client(env.kubeconfig) as api:
        started = time.monotonic()
        core: Any = client.CoreV1Api(api)
        token: str | None = None
        while True:
            options: dict[str, Any] = {"label_selector": SELECTOR, "_preload_content": False}
            if token:
                options["_continue"] = token
            elif resource_version is not None:
                options["resource_version"] = resource_version
            if limit is not None:
                options["limit"] = limit
            if kind == KIND:
                resp = await list_page(api, namespace, options)
            else:
                resp = await core.list_namespaced_pod(namespace, **options)
            body = await read_body(resp)
            # a custom resource's list is written with its keys sorted: metadata after the items
            head = max(len(body) - 4096, 0) if kind == KIND else 0
            found = _CONTINUE.search(body, head, head + 4096) if limit is not None else None
            token = found.group(1).decode() if found else None
            if not token:
                return time.monotonic() - started


async def floors(env: Env, namespace: str) -> Values:
    return {
        "sync_s": await list_floor(env, namespace, limit=PAGE_SIZE),
        "floor_s": await list_floor(env, namespace),
        "floor_rv0_s": await list_floor(env, namespace, resource_version="0"),
    }


# --- runs -----------------------------------------------------------------------------------------


Measure = Callable[[str, Env, Scenario, argparse.Namespace, int], Awaitable[Values]]


async def run_rounds(
    env: Env,
    scenario: Scenario,
    args: argparse.Namespace,
    contenders: Sequence[str],
    measure_one: Measure = measure,
    *,
    with_floor: bool = True,
) -> Results:
    results = Results()
    for index in range(args.rounds):
        measured: dict[str, Values] = {}
        if with_floor:
            measured["floor"] = await floors(env, scenario.namespace)
        shift = index % len(contenders)
        for offset, name in enumerate([*contenders[shift:], *contenders[:shift]]):
            try:
                measured[name] = await measure_one(name, env, scenario, args, index * 10 + offset)
            finally:
                if env.compact is not None:
                    env.compact()
            _progress(
                f"{scenario.pods} pods, round {index + 1}, {TITLES[name]}: {_short(measured[name])}"
            )
        results.rounds.append(measured)
    return results


async def bench(
    env: Env, args: argparse.Namespace, contenders: Sequence[str], skipped: dict[str, str]
) -> bool:
    scenario, context = await prepare(env, args.pods, args.parents)
    _progress(
        f"{scenario.pods} pods over {scenario.parents} parents ready,"
        f" {context['pod_bytes']:.0f} B each"
    )
    results = await run_rounds(env, scenario, args, contenders)
    for key in ("floor_paged_s", "floor_s", "floor_rv0_s"):
        context[key] = results.median("floor", "sync_s" if key == "floor_paged_s" else key)
    print_table(
        results,
        f"{scenario.pods} pods ({context['pod_bytes']:.0f} B of JSON each) over {scenario.parents}"
        f" parents, {len(results.rounds)} round(s), medians; ratios: > 1 means ours is better",
    )
    print_rounds(results, "cpu_per_event", "CPU per WATCH event by round (us), unpolled window")
    met = check_targets(results, skipped)
    print_notes(results, context)
    if args.json:
        print(
            json.dumps(
                {"args": vars(args), "context": context, "rounds": results.rounds}, default=str
            )
        )
    if args.profile:
        prefix = str(env.logs / args.profile)
        _progress(f"profiling {args.profile} (one extra run)")
        await measure_python(args.profile, env, scenario, args, seed=999, profile=prefix)
        print_profile(prefix, args.profile_top)
    return met


async def count_instructions(
    env: Env, args: argparse.Namespace, contenders: Sequence[str], skipped: dict[str, str]
) -> bool:
    """``--instructions``: the WATCH phase of each contender under callgrind, counted."""
    cg = Callgrind.find(env.logs)
    scenario, context = await prepare(env, args.pods, args.parents)
    _progress(
        f"{scenario.pods} pods ready; counting instructions under callgrind, the writer at"
        f" {args.writer_rate:g} patches/s for {args.watch_seconds:g} s (profiles in {env.logs})"
    )

    last_dump: dict[str, Path] = {}

    async def counted(
        name: str, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int
    ) -> Values:
        last_dump[name] = cg.window_dump(name, seed)
        return await count(name, env, scenario, args, seed, cg)

    results = await run_rounds(env, scenario, args, contenders, counted, with_floor=False)
    print_rounds(
        results,
        "instructions_per_event",
        "instructions per WATCH event by round (thousands; callgrind, user space, all threads)",
    )
    met = check_targets(results, skipped, INSTRUCTION_TARGETS)
    shares = {}
    for name, dump in last_dump.items():
        with contextlib.suppress(OSError), dump.open() as lines:
            shares[name] = self_costs(lines)
    print_shares(shares, args.profile_top)
    print_missed(results)
    if args.json:
        rounds = results.rounds
        print(json.dumps({"args": vars(args), "context": context, "rounds": rounds}, default=str))
    return met


async def prepare_pools(env: Env, pods: Scenario) -> tuple[Scenario, float]:
    """An engine pool of each of these pods, seeded once; and their mean JSON size."""
    from kubernetes_asyncio import client

    from bench.apiserver_objects import create_pools, install_crd, list_pools, namespace_for
    from bench.apiserver_seed import ensure_namespace, list_items, mean_pod_bytes, parents_of
    from miles.utils.k8s_testenv.client import api_client

    namespace = namespace_for(pods.pods)
    async with api_client(env.kubeconfig) as api:
        await install_crd(api)
        core = client.CoreV1Api(api)
        await ensure_namespace(core, namespace)
        present = {item["metadata"]["name"] for item in await list_pools(api, namespace, SELECTOR)}
        missing = [
            pod
            for pod in await list_items(core, pods.namespace)
            if pod["metadata"]["name"] not in present
        ]
        if missing:
            _progress(f"seeding {len(missing)} engine pools into {namespace}")
            await create_pools(
                api, namespace=namespace, pods=missing, parallel=32, progress=_progress
            )
        items = await list_pools(api, namespace, SELECTOR)
    scenario = Scenario(namespace, len(items), parents_of(items), watch=True, kind=KIND)
    return scenario, mean_pod_bytes(items)


async def objects_bench(
    env: Env, args: argparse.Namespace, contenders: Sequence[str], skipped: dict[str, str]
) -> bool:
    """``--kind enginepools``: ours over the pods and over the engine pools, in the same rounds."""
    pods, context = await prepare(env, args.pods, args.parents)
    pools, pool_bytes = await prepare_pools(env, pods)
    _progress(
        f"{pods.pods} pods ({context['pod_bytes']:.0f} B each) and {pools.pods} engine pools"
        f" ({pool_bytes:.0f} B each) ready"
    )
    cg = Callgrind.find(env.logs) if args.instructions else None

    async def one(name: str, env: Env, _: Scenario, args: argparse.Namespace, seed: int) -> Values:
        if name == "floor-objects":
            return {"sync_s": await list_floor(env, pools.namespace, limit=PAGE_SIZE, kind=KIND)}
        scenario = pools if name in OBJECT_CONTENDERS else pods
        if cg is not None:
            return await count(name, env, scenario, args, seed, cg)
        return await measure(name, env, scenario, args, seed)

    floor = [] if args.instructions else ["floor-objects"]
    results = await run_rounds(env, pods, args, [*contenders, *floor], one, with_floor=False)
    print(
        f"\n{pods.pods} pods ({context['pod_bytes']:.0f} B of JSON each) and as many engine pools"
        f" ({pool_bytes:.0f} B each), {len(results.rounds)} round(s), load average"
        f" {os.getloadavg()[0]:.1f}"
    )
    for key, title in (
        ("sync_s", "LIST-to-synced by round (s)"),
        (
            "writer_rate",
            f"the writer's patches per second by round (paced at {args.writer_rate:g})",
        ),
        ("cpu_per_event", "CPU per WATCH event by round (us), unpolled window"),
        (
            "apiserver_cpu_per_event",
            "the apiserver's CPU per WATCH event by round (us), same window",
        ),
        ("instructions_per_event", "instructions per WATCH event by round (thousands)"),
    ):
        if any(results.per_round(name, key) != [None] * len(results.rounds) for name in contenders):
            print_rounds(results, key, title)
    met = check_ceilings(results, INSTRUCTION_CEILINGS if args.instructions else CEILINGS)
    met = pace_kept(results, args.writer_rate) and met
    if args.json:
        context["pool_bytes"] = pool_bytes
        print(
            json.dumps(
                {"args": vars(args), "context": context, "rounds": results.rounds}, default=str
            )
        )
    return met


async def growth(env: Env, args: argparse.Namespace, contenders: Sequence[str]) -> None:
    measured: dict[int, Results] = {}
    for pods in sorted(args.growth):
        scenario, context = await prepare(env, pods, min(args.parents, pods))
        _progress(
            f"{pods} pods ready (seeding took {fmt(context['seed_s'])} s); measuring the sync"
        )
        sync_only = Scenario(scenario.namespace, scenario.pods, scenario.parents, watch=False)
        measured[pods] = await run_rounds(env, sync_only, args, contenders)
    print_growth(measured)
    if args.json:
        rounds = {pods: results.rounds for pods, results in measured.items()}
        print(json.dumps({"args": vars(args), "growth": rounds}, default=str))
    why_not = plot_growth(measured, args.plot)
    print(f"\nplot: {why_not or args.plot}")


def print_profile(prefix: str, top: int) -> None:
    for phase in ("sync", "watch"):
        path = f"{prefix}.{phase}.prof"
        if not os.path.exists(path):
            continue
        print(f"\n--- cProfile (CPU time), {phase} phase ({path}), by own time ---")
        stats = pstats.Stats(path, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(top)


def _short(values: Values) -> str:
    keys = (
        "sync_s",
        "sync_cpu_s",
        "rss_per_pod",
        "apiserver_cpu_s",
        "cpu_per_event",
        "lag_p99",
        "instructions_per_event",
    )
    return ", ".join(f"{k}={fmt(values[k])}" for k in keys if values.get(k) is not None)


# --- environment ----------------------------------------------------------------------------------


def build_compiled(wanted: Sequence[str], settings: Any) -> tuple[dict[str, Path], dict[str, str]]:
    """The compiled contenders that could be built, and why each other one could not."""
    from miles.utils.k8s_testenv.binaries import ensure_binaries
    from miles.utils.k8s_testenv.errors import K8sTestEnvError

    binaries: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    go = [name for name in ("go", "go-stream") if name in wanted]
    if go:
        try:
            oracle = ensure_binaries(names=["oracle"], settings=settings).oracle
            binaries.update(dict.fromkeys(go, oracle))
        except K8sTestEnvError as err:
            skipped.update(dict.fromkeys(go, str(err).splitlines()[0]))
    if "kube-rs" in wanted:
        try:
            binaries["kube-rs"] = ensure_kube_rs(_progress)
        except ContenderUnavailable as err:
            skipped["kube-rs"] = str(err)
    if "ours-stream" in wanted and not reflector_streams():
        skipped["ours-stream"] = "this KubernetesReflector has no streaming_list option"
    return binaries, skipped


def reflector_streams() -> bool:
    import inspect

    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector

    return "streaming_list" in inspect.signature(KubernetesReflector).parameters


def apiserver_pid_of(kubeconfig: Path) -> int | None:
    """The pid of the local process listening on the kubeconfig's server port, if one is."""
    from urllib.parse import urlsplit

    try:
        config = json.loads(kubeconfig.read_text())
        port = urlsplit(config["clusters"][0]["cluster"]["server"]).port
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return None if port is None else listener_pid(port)


def listener_pid(port: int) -> int | None:
    """The process holding the listening TCP socket on ``port``, from ``/proc/net`` and fds."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
    return None


@contextlib.contextmanager
def environment(logs: Path, binaries: dict[str, Path]) -> Iterator[Env]:
    from miles.utils.k8s_testenv.control_plane import LocalControlPlane
    from miles.utils.k8s_testenv.settings import EnvSettings

    settings = EnvSettings.from_env()
    if settings.kubeconfig is not None:
        pid = apiserver_pid_of(settings.kubeconfig)
        yield Env(kubeconfig=settings.kubeconfig, binaries=binaries, logs=logs, apiserver_pid=pid)
        return
    with LocalControlPlane(settings=settings) as plane:
        _progress(f"control plane up in {plane.work_dir}")
        yield Env(
            kubeconfig=plane.cached_kubeconfig,
            binaries=binaries,
            logs=logs,
            apiserver_pid=plane.apiserver("cached").process.pid,
            compact=plane.compact_etcd,
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=None, help="default 10000 (--quick: 1000)")
    parser.add_argument(
        "--parents", type=int, default=None, help="default pods / 10 (--growth: 1000)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--watch-seconds", type=float, default=None, help="default 8 (quick: 3)")
    parser.add_argument("--writer-concurrency", type=int, default=32)
    parser.add_argument(
        "--writer-rate",
        type=float,
        default=None,
        help="patches started per second, evenly spaced; 0: as fast as the apiserver takes them"
        f" (default 0; --kind {KIND}: {PACE:g}; --instructions: {RATE:g})",
    )
    parser.add_argument(
        "--oracle-poll", type=float, default=0.005, help="least seconds between client-go polls"
    )
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS,
        default=None,
        help=f"default {' '.join(DEFAULT_CONTENDERS)}"
        f" (--instructions: {' '.join(COUNTED_DEFAULT)}); ours-stream / go-stream: ours /"
        " client-go listing by a streaming list (not default); wire: the same LIST and WATCH"
        " read raw, decoding nothing; wire-decode / wire-keep: also decoding each WATCH line /"
        " and keeping its pod (not default)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 pods, one round")
    parser.add_argument(
        "--kind",
        choices=("pods", KIND),
        default="pods",
        help=f"{KIND}: ours over the pods beside ours over as many engine pools (a custom"
        " resource), typed and dynamic, in the same rounds",
    )
    parser.add_argument(
        "--growth", type=int, nargs="+", default=None, metavar="PODS", help="pool sizes: sync only"
    )
    parser.add_argument(
        "--plot", type=Path, default=DEFAULT_PLOT, help=f"growth plot (default {DEFAULT_PLOT})"
    )
    parser.add_argument("--profile", choices=("ours", "ka"), default=None)
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--logs", type=Path, default=None, help="folder for child logs")
    parser.add_argument("--json", action="store_true", help="also print every round as JSON")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each contender's instructions per WATCH event under callgrind instead"
        f" (the writer at {RATE:g} patches/s unless --writer-rate)",
    )
    args = parser.parse_args(argv)
    if any(
        n <= 0 for n in [*(args.growth or ()), args.pods or 1, args.rounds or 1, args.parents or 1]
    ):
        parser.error("--pods, --parents, --rounds and --growth take positive numbers")
    args.pods = args.pods or (1000 if args.quick else 10_000)
    args.parents = args.parents or (1000 if args.growth else max(args.pods // 10, 1))
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.watch_seconds = args.watch_seconds or (3.0 if args.quick else 8.0)
    if args.writer_rate is None:
        args.writer_rate = RATE if args.instructions else PACE if args.kind == KIND else 0.0
    if args.writer_rate < 0:
        parser.error("--writer-rate takes a rate of 0 or more")
    if args.kind == KIND:
        args.contenders = args.contenders or ["ours", *OBJECT_CONTENDERS]
    args.contenders = args.contenders or list(
        COUNTED_DEFAULT if args.instructions else DEFAULT_CONTENDERS
    )
    return args


def main(argv: Sequence[str] | None = None) -> None:
    from miles.utils.k8s_testenv.errors import K8sTestEnvError
    from miles.utils.k8s_testenv.settings import EnvSettings

    args = parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="miles-bench-apiserver-"))
    logs.mkdir(parents=True, exist_ok=True)
    _progress(f"child logs in {logs}")
    skipped = {
        name: "not counted: " + NOT_COUNTED
        for name in args.contenders
        if args.instructions and name not in COUNTED
    }
    binaries, unbuilt = build_compiled(
        [name for name in args.contenders if name not in skipped], EnvSettings.from_env()
    )
    skipped.update(unbuilt)
    for name, why in skipped.items():
        print(f"{TITLES[name]}: skipped: {why}", flush=True)
    contenders = [name for name in args.contenders if name not in skipped]
    if "ours" not in contenders:
        sys.exit("bench.apiserver: ours must be among the contenders (every ratio is against it)")
    try:
        with environment(logs, binaries) as env:
            if args.growth:
                asyncio.run(growth(env, args, contenders))
                return
            run = count_instructions if args.instructions else bench
            if args.kind == KIND:
                run = objects_bench
            met = asyncio.run(run(env, args, contenders, skipped))
    except (K8sTestEnvError, ContenderUnavailable) as err:
        sys.exit(f"bench.apiserver: {err}")
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
