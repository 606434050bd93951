"""``miles-reconcile env`` and ``demo``: the subcommands that need a local control plane. Go:
kwokctl's ``create`` / ``delete cluster``, as kubectl plugins.

Declared in the entry-point group ``miles_reconcile.commands`` (``pyproject.toml``), so the
runtime's command line runs them without importing them. This package imports both the runtime's
command line and the provisioner; neither imports it. The work itself is imported when a
subcommand runs.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from miles.utils.k8s_testenv.errors import K8sTestEnvError
from miles.utils.workers.reconcile.cli.subcommand import Subcommand


def describe_testenv_failure(exc: BaseException) -> str | None:
    return str(exc) if isinstance(exc, K8sTestEnvError) else None


def _add_env_arguments(env: argparse.ArgumentParser) -> None:
    actions = env.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="build what is missing, start, print the kubeconfig")
    up.set_defaults(run=_run_env_up)
    down = actions.add_parser(
        "down",
        help="stop the plane NAME; without a name, list this user's planes and stop those "
        "left running or orphaned",
    )
    down.add_argument("names", nargs="*", metavar="NAME", help="a plane's name (miles-k8s-...)")
    down.set_defaults(run=_run_env_down)


async def _run_env(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    raise AssertionError("argparse requires an action")


async def _run_env_up(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.k8s_testenv.commands.env_command import env_up

    await env_up(out=out, err=err)
    return None


async def _run_env_down(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.k8s_testenv.commands.env_command import env_down

    await env_down(names=args.names, out=out, err=err)
    return None


def _add_demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--short", action="store_true", help="fewer pauses, for CI")


async def _run_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    from miles.utils.k8s_testenv.commands.demo import run_demo

    return await run_demo(short=args.short, out=out, err=err)


ENV = Subcommand(
    name="env",
    help="the local control plane: etcd, two kube-apiservers, KWOK",
    add_arguments=_add_env_arguments,
    run=_run_env,
    describe_failure=describe_testenv_failure,
)
DEMO = Subcommand(
    name="demo",
    help="a scripted pool story on a local control plane, checked against a LIST",
    add_arguments=_add_demo_arguments,
    run=_run_demo,
    describe_failure=describe_testenv_failure,
)
