"""A subcommand of ``miles-reconcile``, built in or declared by another package. Go: kubectl's
plugin handler (``k8s.io/kubectl/pkg/cmd/plugin``), with entry points in place of ``$PATH``.

A distribution adds a subcommand by declaring, in the entry-point group :data:`ENTRY_POINT_GROUP`,
a :class:`Subcommand` under the name the user types. The command line loads only the entry point
it runs (all of them for ``--help``), so the runtime never imports what a subcommand needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO

ENTRY_POINT_GROUP = "miles_reconcile.commands"

Run = Callable[[argparse.Namespace, TextIO, TextIO], Awaitable[int | None]]
"""``run(args, out, err)``: the exit status, ``None`` meaning 0."""

DescribeFailure = Callable[[BaseException], str | None]
"""The one line for a failure the user can act on, ``None`` for any other."""


def _no_description(exc: BaseException) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Subcommand:
    """``add_arguments`` fills the subcommand's parser; nested parsers may set their own ``run``
    default. ``describe_failure`` names the failures of this subcommand's own dependencies; the
    command line's own descriptions (Kubernetes, a missing extra) apply after it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Run
    describe_failure: DescribeFailure = _no_description
