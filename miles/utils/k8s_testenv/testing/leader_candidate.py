"""Our ``LeaderElector`` on one coordination.k8s.io/v1 Lease, printing what it sees: the peer of
``tools/k8s/leader-candidate`` (client-go's), with the same flags and the same lines on stdout, one
JSON object each, flushed::

    {"t": <time.time()>, "id": "<identity>", "event": "<event>", "leader": "<holder>" | null}

``event`` is ``leading`` (became leader), ``stopped`` (lost the lease, or released it on SIGTERM),
``new_leader`` (the holder it observed changed; the holder is ``leader``) or ``acting`` (every
100 ms while ``is_leader()`` is true: when a reconcile would be dispatched). After losing the lease
it runs for election again under the same identity, as the Go candidate does. SIGTERM or SIGINT:
it stops acting, releases a lease it holds, prints ``stopped`` and exits 0::

    python -m miles.utils.k8s_testenv.testing.leader_candidate --kubeconfig PATH --namespace NS \\
        --lease NAME --identity ID [--lease-duration S] [--renew-deadline S] [--retry-period S]

Diagnostics (the elector's log lines) go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from miles.utils.workers.reconcile.leaderelection.leader_election import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
    LeaderElector,
)
from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseApi, LeaseLock
from miles.utils.workers.reconcile.tasks import first_of

ACTING_PERIOD = 0.1


def emit(identity: str, event: str, leader: str | None) -> None:
    line = json.dumps({"t": time.time(), "id": identity, "event": event, "leader": leader})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def campaign(lock: LeaseLock, options: argparse.Namespace, stop: asyncio.Event) -> bool:
    """One elector's run, until it loses the lease (returns ``False``) or ``stop`` is set (returns
    ``True``, after the release)."""
    elector = LeaderElector(
        lock=lock,
        lease_duration=options.lease_duration,
        renew_deadline=options.renew_deadline,
        retry_period=options.retry_period,
        release_on_cancel=True,
    )
    identity = elector.identity
    async with elector:
        reporter = asyncio.create_task(_report(elector, identity))
        try:
            await first_of(elector.wait_until_lost(), stop.wait())
        finally:
            reporter.cancel()
            await asyncio.wait([reporter])
    emit(identity, "stopped", elector.leader)
    return stop.is_set()


async def _report(elector: LeaderElector, identity: str) -> None:
    leading: asyncio.Task[None] | None = asyncio.create_task(elector.wait_until_leading())
    reported: str | None = None
    try:
        while True:
            if leading is not None and leading.done():
                emit(identity, "leading", elector.leader)
                leading = None
            if elector.leader != reported:
                reported = elector.leader
                emit(identity, "new_leader", reported)
            if elector.is_leader():
                emit(identity, "acting", elector.leader)
            await asyncio.sleep(ACTING_PERIOD)
    finally:
        if leading is not None:
            leading.cancel()
            await asyncio.wait([leading])


async def run(options: argparse.Namespace) -> int:
    from kubernetes_asyncio import client

    from miles.utils.k8s_testenv.client import api_client
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioLeaseApi

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with api_client(Path(options.kubeconfig)) as api:
        lease_api: LeaseApi = KubernetesAsyncioLeaseApi(
            coordination_v1_api=client.CoordinationV1Api(api)
        )
        lock = LeaseLock(
            lease_api=lease_api,
            namespace=options.namespace,
            name=options.lease,
            identity=options.identity,
        )
        while not await campaign(lock, options, stop):
            pass
    return 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="leader_candidate", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True, help="kubeconfig of the apiserver")
    parser.add_argument("--namespace", required=True, help="namespace of the Lease")
    parser.add_argument("--lease", required=True, help="name of the Lease")
    parser.add_argument("--identity", required=True, help="this candidate's holderIdentity")
    parser.add_argument("--lease-duration", type=float, default=DEFAULT_LEASE_DURATION)
    parser.add_argument("--renew-deadline", type=float, default=DEFAULT_RENEW_DEADLINE)
    parser.add_argument("--retry-period", type=float, default=DEFAULT_RETRY_PERIOD)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        return asyncio.run(run(options))
    except ValueError as error:
        print(f"leader_candidate: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        print(f"leader_candidate: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
