"""``miles-reconcile status``: one snapshot of a loop over the selected pods. Go: none (client-go
has no such command; this is what ``ReconcileLoop.status()`` offers a person).

One shot: connect, run a ReconcileLoop until its store has synced (``start`` returns then), let it
drain the initial reconciles, print ``status()`` as text or JSON, and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from typing import TextIO

from miles.utils.workers.reconcile.cli.pool_loop import (
    PoolOptions,
    add_target_arguments,
    connected_pool,
    pool_loop,
    preflight,
    target_of,
)
from miles.utils.workers.reconcile.cli.signals import SignalCancel
from miles.utils.workers.reconcile.cli.status_view import status_record, status_text
from miles.utils.workers.reconcile.cli.subcommand import Subcommand
from miles.utils.workers.reconcile.k8s_interfaces import KubernetesPodApi
from miles.utils.workers.reconcile.status import LoopStatus

DRAIN_SECONDS = 5.0
STATUS_FORMATS = ("text", "json")


def add_status_arguments(status: argparse.ArgumentParser) -> None:
    add_target_arguments(status)
    status.add_argument("--parent-label", help="label whose value names a pod's parent")
    status.add_argument("--output", "-o", choices=STATUS_FORMATS, default="text")


async def take_status(
    options: PoolOptions, *, pod_api: KubernetesPodApi, drain_seconds: float = DRAIN_SECONDS
) -> LoopStatus:
    """Sync a loop over ``options``' pods and return its snapshot once the queue is empty (or after
    ``drain_seconds``)."""
    await preflight(pod_api, options)
    loop = pool_loop(options, pod_api=pod_api)
    async with loop:
        status = loop.status()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_seconds):
                while status.queue_depth or status.in_flight is not None:
                    await asyncio.sleep(0.05)
                    status = loop.status()
        return status


async def run_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The ``status`` command; returns its exit code (130 after Ctrl-C, 143 after SIGTERM)."""
    printed: list[str] = []

    async def work() -> None:
        async with connected_pool(
            target_of(args),
            os.environ,
            selector=args.selector,
            parent_label=args.parent_label or "",
        ) as (options, pod_api):
            status = await take_status(options, pod_api=pod_api)
        if args.output == "json":
            printed.append(json.dumps(status_record(status), indent=2))
        else:
            printed.extend(status_text(status))

    code = await SignalCancel().run(work())
    if code is not None:
        err.write("miles-reconcile: interrupted\n")
        return code
    out.write("\n".join(printed) + "\n")
    return 0


STATUS = Subcommand(
    name="status",
    help="connect, sync a loop over the selected pods, print its status() once, and exit",
    add_arguments=add_status_arguments,
    run=run_status,
)
