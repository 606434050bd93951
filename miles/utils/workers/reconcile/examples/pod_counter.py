"""A whole controller process: counts the pods of each parent and logs it, under a ``Manager``.
Go: a kubebuilder ``cmd/main.go`` (flags, ``ctrl.NewManager``, ``mgr.Start(SetupSignalHandler())``).

    python -m miles.utils.workers.reconcile.examples.pod_counter -n NAMESPACE --parent-label app

It serves ``/healthz`` and ``/readyz`` on ``--health-probe-bind-address`` (default ``:8081``) and
``/metrics`` on ``--metrics-bind-address`` (default ``:8080``, ``0`` off); SIGTERM lets the
reconcile in flight finish within ``--graceful-shutdown-timeout`` and exits 0. ``--leader-elect``
reconciles only while this process holds the Lease ``--leader-election-id`` (identity
``hostname_uuid``, as CR's), releases it on SIGTERM, and exits 1 if it loses it. It connects with
the kubeconfig (``--kubeconfig``, ``KUBECONFIG``, ``~/.kube/config``) or, in a pod, the service
account. ``--reconcile-seconds`` makes each reconcile take that long, to watch a shutdown wait.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from miles.utils.workers.reconcile.clock import RealClock
from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseLock
from miles.utils.workers.reconcile.manager.manager import (
    DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
    DEFAULT_HEALTH_PROBE_ADDRESS,
    DEFAULT_METRICS_ADDRESS,
    Manager,
    run_until_signalled,
)
from miles.utils.workers.reconcile.source_event import ParentKey

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("pod_counter")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pod_counter", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", help="path to a kubeconfig (default: the usual places)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig's)")
    parser.add_argument("--selector", default="", help="label selector of the pods to watch")
    parser.add_argument("--parent-label", default="app", help="label naming a pod's parent")
    parser.add_argument("--reconcile-seconds", type=float, default=0.0)
    parser.add_argument("--health-probe-bind-address", default=DEFAULT_HEALTH_PROBE_ADDRESS)
    parser.add_argument("--metrics-bind-address", default=DEFAULT_METRICS_ADDRESS)
    parser.add_argument(
        "--graceful-shutdown-timeout", type=float, default=DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT
    )
    parser.add_argument(
        "--leader-elect", action="store_true", help="reconcile only while holding the Lease"
    )
    parser.add_argument("--leader-election-id", default="pod-counter", help="the Lease's name")
    parser.add_argument(
        "--leader-election-namespace", help="the Lease's namespace (default: --namespace's)"
    )
    return parser.parse_args(argv)


def parent_of(label: str) -> Callable[[Any], ParentKey | None]:
    """The loop's ``key_map``: a pod's parent is the value of its ``label``; no label, no parent."""

    def key_map(pod: Any) -> ParentKey | None:
        value: str | None = pod.metadata.labels.get(label)
        return value or None

    return key_map


async def run(args: argparse.Namespace) -> int:
    from miles.utils.workers.reconcile.k8s_api import (
        KubernetesAsyncioLeaseApi,
        KubernetesAsyncioPodApi,
        kube_session,
    )
    from miles.utils.workers.reconcile.k8s_config import KubeTarget
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.loop import ReconcileLoop

    metrics = args.metrics_bind_address not in ("", "0")
    target = KubeTarget(kubeconfig=args.kubeconfig, namespace=args.namespace)
    async with kube_session(target, os.environ) as session:
        reflector = KubernetesReflector(
            kube_client=KubernetesAsyncioPodApi(core_v1_api=session.core_v1_api),
            namespace=session.namespace,
            label_selector=args.selector,
        )
        clock = RealClock()
        elector = None
        if args.leader_elect:
            lock = LeaseLock(
                lease_api=KubernetesAsyncioLeaseApi.beside(session.core_v1_api),
                namespace=args.leader_election_namespace or session.namespace,
                name=args.leader_election_id,
                identity=f"{socket.gethostname()}_{uuid.uuid4()}",
            )
            elector = LeaderElector(lock=lock)

        async def reconcile(parent: ParentKey) -> None:
            logger.info("reconcile of %s started", parent)
            await clock.sleep(args.reconcile_seconds)
            pods = len(loop.get_by_parent(parent))
            logger.info("reconcile of %s finished: %d pods", parent, pods)

        loop = ReconcileLoop(
            source=reflector.watch,
            reconcile=reconcile,
            key_map=parent_of(args.parent_label),
            metrics=_global_registry() if metrics else None,
            leadership=elector,
        )
        manager = Manager(
            loops=[loop],
            elector=elector,
            health_probe_address=args.health_probe_bind_address,
            metrics_address=args.metrics_bind_address,
            graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        )
        return await run_until_signalled(manager)


def _global_registry() -> CollectorRegistry:
    from prometheus_client import REGISTRY

    return REGISTRY


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except Exception as exc:
        print(f"pod_counter: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
