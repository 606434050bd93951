"""The pool every command shows: its flags, its connection, the probing LIST and the ReconcileLoop
over it, shared by ``watch``, ``status`` and the demo. Go: kubectl's ``cmdutil.Factory`` and the
``resource.Builder`` selection ``kubectl get`` lists and watches."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from miles.utils.workers.reconcile.cli.failures import CliError
from miles.utils.workers.reconcile.k8s_config import KubeTarget
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_interfaces import KubernetesPodApi
from miles.utils.workers.reconcile.source_event import ParentKey

if TYPE_CHECKING:
    from miles.utils.workers.reconcile.loop import ReconcileLoop

PREFLIGHT_TIMEOUT = 15.0
ShowFn = Callable[[ParentKey, list[Any]], None]
"""Told each parent the loop reconciles, with its members as the store holds them."""


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """Which pods make the pool, and which label of theirs names a pod's parent."""

    namespace: str
    selector: str
    parent_label: str


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


def target_of(args: argparse.Namespace) -> KubeTarget:
    return KubeTarget(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)


@contextlib.asynccontextmanager
async def connected_pool(
    target: KubeTarget, environ: Mapping[str, str], *, selector: str, parent_label: str
) -> AsyncIterator[tuple[PoolOptions, KubernetesPodApi]]:
    """The pool's options in the session's namespace, and the pod API over that session."""
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi, kube_session

    async with kube_session(target, environ) as session:
        options = PoolOptions(
            namespace=session.namespace, selector=selector, parent_label=parent_label
        )
        yield options, KubernetesAsyncioPodApi(core_v1_api=session.core_v1_api)


def parent_label_map(label: str) -> Callable[[Any], ParentKey | None]:
    """The loop's ``key_map``: a pod's parent is the value of ``label``; no label, no parent."""

    def key_map(pod: Any) -> ParentKey | None:
        value: str | None = pod.metadata.labels.get(label)
        return value or None

    return key_map


async def preflight(pod_api: KubernetesPodApi, options: PoolOptions) -> int:
    """One LIST before the loop starts, so a bad address, a bad selector or a missing permission
    fails at once (the reflector would retry it forever). Returns how many pods it listed."""
    try:
        async with asyncio.timeout(PREFLIGHT_TIMEOUT):
            page = await pod_api.list_pods(
                namespace=options.namespace, label_selector=options.selector
            )
    except KubernetesApiError as err:
        if err.code == 400:
            raise CliError(
                f"selector {options.selector!r} rejected by the apiserver: "
                f"{err.message or err.reason}; fix --selector (e.g. app=engine)"
            ) from None
        raise
    return len(page.pods)


def pool_loop(
    options: PoolOptions,
    *,
    pod_api: KubernetesPodApi,
    show: ShowFn | None = None,
    retry_delay: float | None = None,
) -> ReconcileLoop:
    """A ReconcileLoop over the pool whose reconcile hands each parent to ``show``;
    ``retry_delay`` sets the reflector's and the loop's first retry (their defaults otherwise)."""
    from miles.utils.workers.reconcile.k8s_reflector import DEFAULT_RETRY_DELAY, KubernetesReflector
    from miles.utils.workers.reconcile.loop import DEFAULT_SOURCE_RETRY_DELAY, ReconcileLoop

    reflector = KubernetesReflector(
        kube_client=pod_api,
        namespace=options.namespace,
        label_selector=options.selector,
        retry_delay=DEFAULT_RETRY_DELAY if retry_delay is None else retry_delay,
    )

    async def reconcile(parent: ParentKey) -> None:
        if show is not None:
            show(parent, loop.get_by_parent(parent))

    loop = ReconcileLoop(
        source=reflector.watch,
        reconcile=reconcile,
        key_map=parent_label_map(options.parent_label),
        source_retry_delay=DEFAULT_SOURCE_RETRY_DELAY if retry_delay is None else retry_delay,
        # The command waits for the apiserver as long as the person running it does.
        cache_sync_timeout=None,
    )
    return loop


def synced_pool(loop: ReconcileLoop) -> dict[ParentKey, list[Any]]:
    return {parent: loop.get_by_parent(parent) for parent in loop.parent_keys()}


def empty_selection_note(options: PoolOptions, pods_listed: int) -> str:
    if pods_listed == 0:
        return (
            f"no pods in namespace {options.namespace!r} match selector {options.selector!r}; "
            "watching for them"
        )
    return (
        f"{pods_listed} pods match selector {options.selector!r} but none carries label "
        f"{options.parent_label!r}; watching for them"
    )
