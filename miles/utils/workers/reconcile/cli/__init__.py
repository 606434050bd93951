"""The ``miles-reconcile`` command line: ``watch``, ``env up|down`` and ``demo``.

Every failure a person can act on leaves as one ``miles-reconcile: error: ...`` line and exit code
2; only a bug keeps its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TextIO

from miles.utils.workers.reconcile.cli.failures import USAGE_EXIT, describe_failure
from miles.utils.workers.reconcile.cli.watch_view import INTERRUPTED_EXIT

PROG = "miles-reconcile"

Command = Callable[[argparse.Namespace, TextIO, TextIO], Awaitable[int | None]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Watch pools of pods through a ReconcileLoop."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_watch(commands)
    _add_env(commands)
    _add_demo(commands)
    return parser


def _add_watch(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = commands.add_parser(
        "watch", help="show every parent and its member pods, redrawn as reconciles happen"
    )
    watch.add_argument("--namespace", "-n", default="default")
    watch.add_argument("--selector", "-l", required=True, help="label selector, e.g. app=engine")
    watch.add_argument(
        "--parent-label", required=True, help="label whose value names a pod's parent (its cell)"
    )
    watch.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    watch.add_argument("--output", "-o", choices=("table", "jsonl"), default="table")
    watch.set_defaults(run=_run_watch)


def _add_env(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    env = commands.add_parser("env", help="the local control plane: etcd, apiservers, KWOK")
    actions = env.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="build what is missing, start, print the kubeconfig")
    up.set_defaults(run=_run_env_up)
    down = actions.add_parser("down", help="stop the environment `env up` started")
    down.set_defaults(run=_run_env_down)


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo", help="a scripted pool story on a local control plane, checked against a LIST"
    )
    demo.add_argument("--short", action="store_true", help="fewer pauses, for CI")
    demo.set_defaults(run=_run_demo)


async def _run_watch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.watch_view import WatchOptions, run_watch

    options = WatchOptions(
        namespace=args.namespace,
        selector=args.selector,
        parent_label=args.parent_label,
        output=args.output,
    )
    await run_watch(options, kubeconfig=args.kubeconfig, environ=os.environ, out=out, err=err)
    return None


async def _run_env_up(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.env_command import env_up

    await env_up(out=out, err=err)
    return None


async def _run_env_down(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.env_command import env_down

    await env_down(out=out, err=err)
    return None


async def _run_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.workers.reconcile.cli.demo import run_demo

    return await run_demo(short=args.short, out=out, err=err)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = sys.stderr
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format=f"{PROG}: %(levelname)s %(name)s: %(message)s"
    )
    command: Command = args.run
    try:
        code = asyncio.run(_run(command, args, out, err))
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except Exception as exc:
        line = describe_failure(_single_cause(exc))
        if line is None:
            raise
        err.write(f"{PROG}: error: {line}\n")
        return USAGE_EXIT
    return code or 0


async def _run(command: Command, args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    return await command(args, out, err)


def _single_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
