"""``miles-reconcile watch``: a ReconcileLoop whose reconcile draws the pool. Go: ``kubectl get
-w`` (``pkg/cmd/get``) and its flags (``--kubeconfig``, ``--context``, ``-n``, ``-l``, ``-o``)."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import TextIO

from miles.utils.workers.reconcile.cli.failures import CliError
from miles.utils.workers.reconcile.cli.live_view import (
    OUTPUT_FORMATS,
    LiveView,
    Terminal,
    owning_terminal,
    redraw_on_resize,
    view_title,
    wait_redrawing,
)
from miles.utils.workers.reconcile.cli.log_notes import logs_into
from miles.utils.workers.reconcile.cli.pool_loop import (
    PoolOptions,
    add_target_arguments,
    connected_pool,
    empty_selection_note,
    pool_loop,
    preflight,
    synced_pool,
    target_of,
)
from miles.utils.workers.reconcile.cli.signals import SignalCancel
from miles.utils.workers.reconcile.cli.subcommand import Subcommand
from miles.utils.workers.reconcile.k8s_interfaces import KubernetesPodApi


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


async def watch_pool(
    options: PoolOptions,
    *,
    pod_api: KubernetesPodApi,
    view: LiveView,
    stop: asyncio.Event,
    err: TextIO,
    tick: bool,
) -> None:
    """Run the loop with ``view`` as its reconcile until ``stop`` is set."""
    listed = await preflight(pod_api, options)
    loop = pool_loop(options, pod_api=pod_api, show=view.show_parent)
    async with loop:
        view.observe(loop.status())
        view.start_marking(synced_pool(loop))
        if not loop.parent_keys():
            note = empty_selection_note(options, listed)
            err.write(f"miles-reconcile: {note}\n")
            err.flush()
            view.notes.append(note)
        view.draw()
        await wait_redrawing(view, stop, tick=tick, status=loop.status)


async def run_watch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The ``watch`` command; returns its exit code (130 after Ctrl-C, 143 after SIGTERM)."""
    if not args.parent_label.strip():
        raise CliError("--parent-label is empty; name the label whose value is a pod's parent")
    stop = asyncio.Event()
    target = target_of(args)

    async def watch() -> None:
        async with connected_pool(
            target, os.environ, selector=args.selector, parent_label=args.parent_label
        ) as (options, pod_api):
            view = LiveView(
                stream=out,
                output=args.output,
                tty=False,
                title=view_title(options),
                on_output_closed=stop.set,
                terminal=Terminal.of(out, os.environ),
            )
            with (
                owning_terminal(view, out),
                redraw_on_resize(view),
                logs_into(view.notes, enabled=view.live),
            ):
                await watch_pool(
                    options, pod_api=pod_api, view=view, stop=stop, err=err, tick=view.live
                )
            if view.output_closed:
                raise BrokenPipeError

    code = await SignalCancel().run(watch())
    err.write("miles-reconcile: stopped\n" if code is None else "miles-reconcile: interrupted\n")
    return code or 0


WATCH = Subcommand(
    name="watch",
    help="show every parent and its member pods, redrawn as reconciles happen",
    add_arguments=add_watch_arguments,
    run=run_watch,
)
