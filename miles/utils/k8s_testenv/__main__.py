"""`python -m miles.utils.k8s_testenv build|up|down` (Go: setup-envtest and kwokctl's verbs)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from miles.utils.k8s_testenv.binaries import SPECS, bin_dir, ensure_binaries
from miles.utils.k8s_testenv.control_plane import LocalControlPlane
from miles.utils.k8s_testenv.errors import K8sTestEnvError
from miles.utils.k8s_testenv.node_lock import clean_leftover_node
from miles.utils.k8s_testenv.state import planes_named, running_planes, stop_plane


def _build(args: argparse.Namespace) -> None:
    names = args.only or [spec.name for spec in SPECS]
    ensure_binaries(names=names)
    for name in names:
        print(f"{name}: {bin_dir() / name}")


def _up(args: argparse.Namespace) -> None:
    plane = LocalControlPlane(keep=True)
    plane.start()
    try:
        state_file = plane.leave_running()
        if args.detach:
            return
        print("k8s_testenv: up; Ctrl-C stops it", file=sys.stderr, flush=True)
        _wait_for_interrupt()
    except BaseException:
        plane.stop()
        raise
    plane.stop()
    state_file.unlink(missing_ok=True)


def _wait_for_interrupt() -> None:
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()


def _down(args: argparse.Namespace) -> None:
    if args.names:
        planes = planes_named(args.names)
    else:
        planes = [plane for plane in running_planes() if args.all or plane.abandoned]
    cleaned_node = not args.names and clean_leftover_node(print)
    if not planes and not cleaned_node:
        print("k8s_testenv: nothing is running")
    for plane in planes:
        stop_plane(plane)
        print(f"k8s_testenv: stopped {', '.join(plane.pids)} in {plane.work_dir}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m miles.utils.k8s_testenv")
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser(
        "build", help="build the pinned binaries (plane, real node) that are missing or stale"
    )
    build.add_argument("--only", action="append", choices=[s.name for s in SPECS])
    build.set_defaults(run=_build)
    up = verbs.add_parser("up", help="start etcd and both kube-apiservers")
    up.add_argument("--detach", action="store_true", help="return and leave them running")
    up.set_defaults(run=_up)
    down = verbs.add_parser("down", help="stop control planes left running or orphaned")
    down.add_argument(
        "names",
        nargs="*",
        help="folder names (miles-k8s-...) to stop; default: every plane "
        "left running on purpose or whose owning process is gone",
    )
    down.add_argument("--all", action="store_true", help="also stop planes of live test runs")
    down.set_defaults(run=_down)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except K8sTestEnvError as err:
        print(f"k8s_testenv: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
