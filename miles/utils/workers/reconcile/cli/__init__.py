"""The ``miles-reconcile`` command line: its own ``watch`` and ``status``, plus the subcommands
other packages declare in the entry-point group ``miles_reconcile.commands`` (the test
environment's ``env`` and ``demo``). Go: kubectl's root command and plugin handler.

Every failure a person can act on leaves as one ``miles-reconcile: error: ...`` line and exit code
2; only a bug keeps its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from typing import NoReturn, TextIO

from miles.utils.workers.reconcile.cli.failures import USAGE_EXIT, CliError, describe_failure
from miles.utils.workers.reconcile.cli.signals import INTERRUPTED_EXIT
from miles.utils.workers.reconcile.cli.status_command import STATUS
from miles.utils.workers.reconcile.cli.subcommand import ENTRY_POINT_GROUP, Subcommand
from miles.utils.workers.reconcile.cli.watch_command import WATCH

PROG = "miles-reconcile"
DISTRIBUTION = "miles-reconcile"
BUILT_IN: tuple[Subcommand, ...] = (WATCH, STATUS)


class CommandParser(argparse.ArgumentParser):
    """argparse, with a usage mistake as one line (the help stays one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def distribution_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


def declared_commands() -> dict[str, EntryPoint]:
    """The subcommands other packages declare, by name; a built-in name cannot be taken."""
    taken = {command.name for command in BUILT_IN}
    points = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name)
    return {point.name: point for point in points if point.name not in taken}


def load_command(point: EntryPoint) -> Subcommand:
    """The declared subcommand; one that cannot load runs as its load failure."""
    try:
        loaded = point.load()
    except Exception as exc:
        return _unloadable(point, exc)
    if not isinstance(loaded, Subcommand):
        reason = TypeError(f"{point.value} is a {type(loaded).__name__}, not a Subcommand")
        return _unloadable(point, reason)
    return loaded


def _unloadable(point: EntryPoint, exc: Exception) -> Subcommand:
    async def fail(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
        if describe_failure(exc) is not None:
            raise exc
        raise CliError(
            f"the {point.name} command ({point.value}) cannot be loaded: "
            f"{type(exc).__name__}: {exc}; reinstall {DISTRIBUTION}"
        ) from exc

    def accept_anything(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    return Subcommand(
        name=point.name,
        help=f"(cannot be loaded: {type(exc).__name__})",
        add_arguments=accept_anything,
        run=fail,
    )


def commands_for(argv: Sequence[str]) -> list[Subcommand]:
    """The built-in subcommands, plus the declared one ``argv`` runs, or every declared one when
    it names none of them (so ``--help`` and a mistyped name list them all)."""
    declared = declared_commands()
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    if named in {command.name for command in BUILT_IN}:
        return list(BUILT_IN)
    points = [declared[named]] if named in declared else list(declared.values())
    return [*BUILT_IN, *(load_command(point) for point in points)]


def build_parser(commands: Iterable[Subcommand] = BUILT_IN) -> CommandParser:
    parser = CommandParser(prog=PROG, description="Watch pools of pods through a ReconcileLoop.")
    parser.add_argument("--version", action="version", version=f"{PROG} {distribution_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        sub.set_defaults(run=command.run, subcommand=command)
        command.add_arguments(sub)
    return parser


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(commands_for(argv)).parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format=f"{PROG}: %(levelname)s %(name)s: %(message)s"
    )
    command: Subcommand = args.subcommand
    try:
        code = asyncio.run(args.run(args, out, err))
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except Exception as exc:
        cause = _single_cause(exc)
        line = command.describe_failure(cause) or describe_failure(cause)
        if line is None:
            raise
        err.write(f"{PROG}: error: {line}\n")
        return USAGE_EXIT
    return int(code or 0)


def _single_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
