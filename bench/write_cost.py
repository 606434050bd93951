"""Our write client's cost per write, counted: ``bench.writes``' loops for ours alone, a fixed
number of writes, under callgrind (instructions, which the host's load does not move) or cProfile.

Go counterpart: none (benchmark plumbing). Run from the repository root::

    .venv/bin/python -m bench.write_cost --op create-delete --writes 2000
    .venv/bin/python -m bench.write_cost --op patch --profile        # cProfile's top functions

It starts a local control plane (or reuses ``MILES_K8S_KUBECONFIG``) and a child process that
writes ``--writes`` times at ``--concurrency`` with ``bench.writes.ours_writing`` over
``Http2Transport`` (``--transport http1``: ``HttpTransport``), after ``--warm`` writes that fill
its caches and open its connections. With ``--instructions`` (the default) the child runs under
``valgrind --tool=callgrind --instr-atstart=no`` and counting is on for the window alone
(``callgrind_control``, as ``bench.apiserver_callgrind``); the figure is its instructions per
write, all of its user-space work: the client, the transport, TLS and the event loop. With
``--profile`` it runs under cProfile instead and prints the functions by their own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.apiserver_callgrind import Callgrind, totals
from bench.writes import OPERATIONS, apiserver, ours_writing, seed

_READY, _GO, _DONE = "ready", "go", "done"


async def child(args: argparse.Namespace) -> None:
    """The writer: warms up, says ready, waits for go, writes, says done with its CPU seconds."""
    from miles.utils.k8s_testenv import api_client
    from miles.utils.workers.reconcile.k8s_http import HttpTransport
    from miles.utils.workers.reconcile.k8s_http2 import Http2Transport

    kind = Http2Transport if args.transport == "h2" else HttpTransport
    async with api_client(args.kubeconfig) as api, kind.for_api_client(api) as transport:
        observed: list[str] = []
        on_write = (lambda _, version: observed.append(version)) if args.observe else None
        write = ours_writing(transport, args.namespace, args.op, on_write=on_write)
        await writes(write, args.warm, args.concurrency, first=0)
        print(_READY, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        profile = cProfile.Profile() if args.profile else None
        started = os.times()
        if profile is not None:
            profile.enable()
        done = await writes(write, args.writes, args.concurrency, first=1 << 20)
        if profile is not None:
            profile.disable()
        ended = os.times()
        user, system = ended.user - started.user, ended.system - started.system
        print(f"{_DONE} {done} {user} {system}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if profile is not None:
        if args.out:
            profile.dump_stats(Path(args.out) / "ours.pstats")
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(args.top)


async def writes(write: Any, total: int, concurrency: int, *, first: int) -> int:
    """``total`` writes (at least) by ``concurrency`` writers, each on its own object, their
    sequence numbers from ``first`` (a create's name is its writer's and its number)."""
    done = 0

    async def worker(index: int) -> None:
        nonlocal done
        seq = first
        while done < total:
            seq += 1
            wrote = await write(f"bench-{index}", seq)
            done += wrote

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done


def measure(args: argparse.Namespace) -> int:
    with apiserver(None) as (kubeconfig, _):
        namespace = f"bench-cost-{time.time_ns():x}"
        asyncio.run(seed(kubeconfig, namespace, args.concurrency))
        argv = [
            sys.executable,
            "-m",
            "bench.write_cost",
            "--child",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--op={args.op}",
            f"--writes={args.writes}",
            f"--warm={args.warm}",
            f"--concurrency={args.concurrency}",
            f"--transport={args.transport}",
            f"--top={args.top}",
        ]
        argv += ["--observe"] if args.observe else []
        argv += ["--profile"] if args.profile else []
        argv += [f"--out={args.out}"] if args.out else []
        with tempfile.TemporaryDirectory(prefix="write-cost-") as scratch:
            out = Path(args.out or scratch)
            cg = None if args.profile or args.timed else Callgrind.find(out)
            wrapper = [] if cg is None else cg.wrapper("ours", 0)
            with subprocess.Popen(
                wrapper + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            ) as proc:
                assert proc.stdin is not None
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != _READY:
                    raise SystemExit("the writer did not start")
                if cg is not None:
                    subprocess.run([cg.control, "--instr=on", str(proc.pid)], check=True)
                proc.stdin.write(f"{_GO}\n")
                proc.stdin.flush()
                said = proc.stdout.readline().split()
                if cg is not None:
                    subprocess.run([cg.control, "--dump=window", str(proc.pid)], check=True)
                proc.stdin.write(f"{_GO}\n")
                proc.stdin.flush()
                proc.wait()
            done, user, system = int(said[1]), float(said[2]), float(said[3])
            line = f"{args.op} {args.transport} concurrency {args.concurrency}: {done} writes"
            if cg is not None:
                instructions = totals(cg.window_dump("ours", 0))
                line += f", {instructions / done / 1e3:,.1f} k instructions/write"
                if args.out:
                    line += f" (profile {cg.window_dump('ours', 0)})"
            else:
                under = " (under cProfile)" if args.profile else ""
                cpu = (user + system) / done * 1e6
                line += f", {cpu:.1f} µs CPU/write ({system / done * 1e6:.1f} in the kernel){under}"
            print(line)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--op", choices=OPERATIONS, default="create-delete")
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--transport", choices=("h2", "http1"), default="h2")
    parser.add_argument("--profile", action="store_true", help="cProfile instead of callgrind")
    parser.add_argument("--timed", action="store_true", help="the process's CPU, not counted")
    parser.add_argument(
        "--observe", action="store_true", help="the client with a write observer (on_write)"
    )
    parser.add_argument("--out", help="a directory to keep callgrind's profile of the window in")
    parser.add_argument("--top", type=int, default=40, help="functions --profile prints")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        asyncio.run(child(args))
        return 0
    os.environ.setdefault("PYTHONHASHSEED", "0")
    return measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
