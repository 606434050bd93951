"""``miles-reconcile status``: one snapshot of a loop over the selected pods. Go: none (client-go
has no such command; this is what ``ReconcileLoop.status()`` offers a person).

One shot: connect, run a ReconcileLoop until its store has synced (``start`` returns then), let it
drain the initial reconciles, print ``status()`` as text or JSON, and exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any, Literal, TextIO

from miles.utils.workers.reconcile.cli.failures import CliError
from miles.utils.workers.reconcile.cli.kube_session import KubeTarget
from miles.utils.workers.reconcile.cli.status_view import loop_status, status_record, status_text
from miles.utils.workers.reconcile.cli.watch_view import (
    SignalCancel,
    WatchOptions,
    make_loop,
    preflight,
)
from miles.utils.workers.reconcile.source_event import ParentKey

DRAIN_SECONDS = 5.0
StatusFormat = Literal["text", "json"]


async def take_status(
    options: WatchOptions, *, pod_api: Any, drain_seconds: float = DRAIN_SECONDS
) -> Any:
    """Sync a loop over ``options``' pods and return its snapshot once the queue is empty (or after
    ``drain_seconds``)."""
    await preflight(pod_api, options)

    async def reconcile(parent: ParentKey) -> None:
        return None

    loop = make_loop(options, pod_api=pod_api, reconcile=reconcile)
    async with loop:
        status = loop_status(loop)
        if status is None:
            raise CliError("this runtime's ReconcileLoop has no status(); upgrade miles-reconcile")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_seconds):
                while status.queue_depth or status.in_flight is not None:
                    await asyncio.sleep(0.05)
                    status = loop_status(loop) or status
        return status


async def run_status(
    target: KubeTarget,
    *,
    selector: str,
    parent_label: str | None,
    output: StatusFormat,
    environ: Mapping[str, str],
    out: TextIO,
    err: TextIO,
) -> int:
    from miles.utils.workers.reconcile.cli.kube_session import kube_session
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi

    printed: list[str] = []

    async def work() -> None:
        async with kube_session(target, environ) as session:
            options = WatchOptions(
                namespace=session.namespace, selector=selector, parent_label=parent_label or ""
            )
            pod_api = KubernetesAsyncioPodApi(core_v1_api=session.core_v1_api)
            status = await take_status(options, pod_api=pod_api)
        if output == "json":
            printed.append(json.dumps(status_record(status), indent=2))
        else:
            printed.extend(status_text(status))

    code = await SignalCancel().run(work())
    if code is not None:
        err.write("miles-reconcile: interrupted\n")
        return code
    out.write("\n".join(printed) + "\n")
    return 0
