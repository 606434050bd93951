"""``miles-reconcile watch``: its arguments and how it runs. Go: ``kubectl get -w``'s flags."""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from miles.utils.workers.reconcile.cli.subcommand import Subcommand


def add_watch_arguments(watch: argparse.ArgumentParser) -> None:
    watch.add_argument("--namespace", "-n", default="default")
    watch.add_argument("--selector", "-l", required=True, help="label selector, e.g. app=engine")
    watch.add_argument(
        "--parent-label", required=True, help="label whose value names a pod's parent (its cell)"
    )
    watch.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    watch.add_argument("--output", "-o", choices=("table", "jsonl"), default="table")


async def run_watch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.watch_view import WatchOptions, run_watch

    options = WatchOptions(
        namespace=args.namespace,
        selector=args.selector,
        parent_label=args.parent_label,
        output=args.output,
    )
    await run_watch(options, kubeconfig=args.kubeconfig, environ=os.environ, out=out, err=err)
    return None


WATCH = Subcommand(
    name="watch",
    help="show every parent and its member pods, redrawn as reconciles happen",
    add_arguments=add_watch_arguments,
    run=run_watch,
)
