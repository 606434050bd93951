"""``miles-reconcile watch`` and ``status``: their arguments and how they run. Go: ``kubectl get
-w``'s flags (``--kubeconfig``, ``--context``, ``-n``, ``-l``, ``-o``)."""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from miles.utils.workers.reconcile.cli.failures import CliError
from miles.utils.workers.reconcile.cli.kube_session import KubeTarget
from miles.utils.workers.reconcile.cli.subcommand import Subcommand
from miles.utils.workers.reconcile.cli.watch_view import OUTPUT_FORMATS

STATUS_FORMATS = ("text", "json")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: the files of $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: its current-context)")
    parser.add_argument(
        "--namespace", "-n", help="namespace (default: the context's namespace, else default)"
    )
    parser.add_argument("--selector", "-l", required=True, help="label selector, e.g. app=engine")


def add_watch_arguments(watch: argparse.ArgumentParser) -> None:
    add_target_arguments(watch)
    watch.add_argument(
        "--parent-label", required=True, help="label whose value names a pod's parent (its cell)"
    )
    watch.add_argument(
        "--output",
        "-o",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (kubectl's columns), wide (adds IP and NODE), json or jsonl (a record per "
        "reconcile)",
    )


def add_status_arguments(status: argparse.ArgumentParser) -> None:
    add_target_arguments(status)
    status.add_argument("--parent-label", help="label whose value names a pod's parent")
    status.add_argument("--output", "-o", choices=STATUS_FORMATS, default="text")


def target_of(args: argparse.Namespace) -> KubeTarget:
    return KubeTarget(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)


async def run_watch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.watch_view import WatchOptions, run_watch

    if not args.parent_label.strip():
        raise CliError("--parent-label is empty; name the label whose value is a pod's parent")
    options = WatchOptions(
        namespace=args.namespace or "",
        selector=args.selector,
        parent_label=args.parent_label,
        output=args.output,
    )
    return await run_watch(options, target=target_of(args), environ=os.environ, out=out, err=err)


async def run_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.status_command import run_status

    return await run_status(
        target_of(args),
        selector=args.selector,
        parent_label=args.parent_label,
        output=args.output,
        environ=os.environ,
        out=out,
        err=err,
    )


WATCH = Subcommand(
    name="watch",
    help="show every parent and its member pods, redrawn as reconciles happen",
    add_arguments=add_watch_arguments,
    run=run_watch,
)

STATUS = Subcommand(
    name="status",
    help="connect, sync a loop over the selected pods, print its status() once, and exit",
    add_arguments=add_status_arguments,
    run=run_status,
)
