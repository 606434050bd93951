"""The soak's loop in a process of its own, so that the resources sampled are the loop's alone.

Go counterpart: none. `bench/soak.py` starts it (`OurLoopProcess(module="bench.soak_loop")`); it
runs `OurLoop` (our reflector, store and reconcile), answers the harness on stdin and stdout
(`ours.serve`), and samples this process only with `ResourceSampler`. The harness's writers, its
fresh LISTs, the client-go oracle and the TLS-terminating fault proxies stay in the soak's process.
When stdin closes it stops and writes its report to `loop-resources.txt` in the work directory.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from bench.soak_sampler import ResourceSampler
from miles.utils.k8s_testenv.testing.differential.lifecycle import logs_to
from miles.utils.k8s_testenv.testing.differential.ours import (
    OurLoop,
    OurLoopSettings,
    parse_settings_argument,
    protocol_stdout,
    serve,
    stdin_reader,
)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", type=parse_settings_argument)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--pod-kib", type=float, default=0.0)
    parser.add_argument("--no-tracemalloc", action="store_true")
    return parser.parse_args()


async def _run(settings: OurLoopSettings, args: argparse.Namespace) -> None:
    out = protocol_stdout()
    reader = await stdin_reader()
    async with OurLoop(settings) as ours:
        sampler = ResourceSampler(
            period=args.sample_every,
            warmup=args.warmup,
            log_path=args.work_dir / "loop-resources.tsv",
            stored_pods=lambda: ours.stored_pods,
            lists=lambda: ours.list_attempts,
            trace_allocations=not args.no_tracemalloc,
            title="the loop's own process",
            pod_kib=args.pod_kib,
        )
        async with sampler:
            await serve(ours, reader, out)
        (args.work_dir / "loop-resources.txt").write_text(sampler.report() + "\n")


def main() -> int:
    args = _arguments()
    with logs_to(args.work_dir / "runtime-loop.log"):
        asyncio.run(_run(args.settings, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
