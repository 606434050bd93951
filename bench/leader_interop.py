"""Leader election, ours against client-go's, on one Lease of a real apiserver, under faults.

Run from the repository root::

    .venv/bin/python -m bench.leader_interop --seconds 300          # the record's run
    .venv/bin/python -m bench.leader_interop --seconds 60 --go 2 --ours 0

It starts etcd and the kube-apiservers (or reuses MILES_K8S_KUBECONFIG's cluster), builds
`tools/k8s/leader-candidate` if needed, and runs `miles.utils.k8s_testenv.testing.leader_interop`:
candidates of both sides, each behind its own TCP proxy, contend on one Lease while the holder is
SIGKILLed, SIGSTOPped, cut off from the apiserver and SIGTERMed in turn (every fifth fault hits a
standby). It prints the three checks per side (at most one candidate acting at any instant, no
takeover of an unexpired lease, every takeover within its bound) and the takeover times per route,
ours→go, go→ours, ours→ours and go→go, side by side, and writes every line and Lease version to
`run.json` in the work folder. Exit status 0 when ours broke nothing; client-go's own behaviour
(it does not fence) is reported, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from miles.utils.k8s_testenv import (
    EnvSettings,
    K8sTestEnvError,
    LocalControlPlane,
    api_client,
    ensure_binaries,
)
from miles.utils.k8s_testenv.binaries import ensure_tool_binary, print_stderr
from miles.utils.k8s_testenv.testing.differential.lifecycle import logs_to
from miles.utils.k8s_testenv.testing.leader_interop.analysis import analyse
from miles.utils.k8s_testenv.testing.leader_interop.candidates import OURS_MODULE, ours_available
from miles.utils.k8s_testenv.testing.leader_interop.harness import (
    InteropConfig,
    InteropRun,
    LeaderInterop,
)
from miles.utils.k8s_testenv.testing.leader_interop.records import Side, Timing
from miles.utils.k8s_testenv.testing.leader_interop.report import render


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.leader_interop")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long faults go on")
    parser.add_argument("--ours", type=int, default=2, help="candidates of ours")
    parser.add_argument("--go", type=int, default=2, help="client-go candidates")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lease-duration", type=float, default=15.0)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    return parser.parse_args()


def interleaved(ours: int, go: int) -> tuple[Side, ...]:
    """ours, go, ours, go, ... then the rest of the larger side."""
    sides: list[Side] = []
    for index in range(max(ours, go)):
        if index < ours:
            sides.append("ours")
        if index < go:
            sides.append("go")
    return tuple(sides)


@contextlib.contextmanager
def _kubeconfig(settings: EnvSettings) -> Iterator[Path]:
    if settings.kubeconfig is not None:
        yield settings.kubeconfig
        return
    with LocalControlPlane(
        binaries=ensure_binaries(settings=settings, log=print_stderr),
        settings=settings,
        announce=print_stderr,
    ) as plane:
        yield plane.cached_kubeconfig


async def _run(config: InteropConfig) -> InteropRun:
    from kubernetes_asyncio import client

    async with api_client(config.kubeconfig) as api:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=config.namespace))
        )
    async with LeaderInterop(config) as interop:
        return await interop.run()


def main() -> int:
    args = _arguments()
    ours = args.ours
    if ours and not ours_available():
        print_stderr(
            f"leader_interop: {OURS_MODULE} is not importable here: client-go candidates only"
        )
        ours = 0
    sides = interleaved(ours, args.go)
    if len(sides) < 2:
        print_stderr("leader_interop: at least two candidates are needed")
        return 2
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="miles-leader-interop-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    timing = Timing(args.lease_duration, args.renew_deadline, args.retry_period)
    print(
        f"leader_interop: {' '.join(sides)} for {args.seconds:.0f} s, seed {args.seed}; "
        f"logs in {work_dir}",
        flush=True,
    )
    settings = EnvSettings.from_env()
    try:
        go_binary = ensure_tool_binary("leader-candidate", settings=settings, log=print_stderr)
        with logs_to(work_dir / "harness.log"), _kubeconfig(settings) as kubeconfig:
            config = InteropConfig(
                kubeconfig=kubeconfig,
                namespace=f"interop-{uuid.uuid4().hex[:8]}",
                go_binary=go_binary,
                work_dir=work_dir,
                sides=sides,
                timing=timing,
                duration=args.seconds,
                seed=args.seed,
            )
            run = asyncio.run(_run(config))
    except K8sTestEnvError as err:
        print(f"leader_interop: ABORTED: {err}", flush=True)
        return 2
    report = analyse(run.lines, run.records, run.faults, run.timing, run.until)
    print(render(run, report), flush=True)
    print(f"leader_interop: record in {run.write(work_dir / 'run.json')}", flush=True)
    return 1 if report.failures("ours") or run.problems else 0


if __name__ == "__main__":
    sys.exit(main())
