"""Layer: real apiserver, no kubelet. What the fault tests share: a loop of cells whose clients go
through an `HttpFaultProxy`, and the check that the store equals a fresh LIST within a bound.

The loop is `Cells` (`harness.py`) over a `KubernetesAsyncioPodApi` whose kubeconfig points at the
proxy; writes and the fresh LIST go straight to the apiserver. `store_equals_list` polls until the
store (pod name to parent and resourceVersion) equals a consistent LIST of the selector.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.http_fault_proxy import HttpFaultProxy, Seen
from miles.utils.k8s_testenv.testing.pod_api_recorder import RecordingPodApi
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
from tests.e2e.k8s_apiserver.harness import CELL_LABEL, SELECTOR, Cells

Membership = dict[str, tuple[str | None, str]]
"""Pod name to (parent, resourceVersion)."""

POLL_SECONDS = 0.05
WRITE_RETRY_SECONDS = 15.0


def pod_api(core_v1: Any, **options: float) -> KubernetesAsyncioPodApi:
    """A `KubernetesAsyncioPodApi` with those of `options` its constructor accepts, so a test of a
    promise fails on what the code does, not on a keyword it does not know yet."""
    accepted = inspect.signature(KubernetesAsyncioPodApi).parameters
    known: dict[str, Any] = {name: value for name, value in options.items() if name in accepted}
    return KubernetesAsyncioPodApi(core_v1_api=core_v1, **known)


MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass
class Faulted:
    """A running `Cells` behind `proxy`, and a CoreV1Api straight to the apiserver."""

    cells: Cells
    proxy: HttpFaultProxy
    direct: Any
    namespace: str

    def store(self) -> Membership:
        loop = self.cells.loop
        return {
            pod.metadata.name: (parent, pod.metadata.resource_version or "")
            for parent in loop.parent_keys()
            for pod in loop.get_by_parent(parent)
        }

    async def fresh_list(self) -> Membership:
        resp = await self.direct.list_namespaced_pod(
            self.namespace, label_selector=SELECTOR, _preload_content=False
        )
        try:
            body = json.loads(await resp.read())
        finally:
            resp.release()
        return {
            item["metadata"]["name"]: (
                (item["metadata"].get("labels") or {}).get(CELL_LABEL),
                item["metadata"]["resourceVersion"],
            )
            for item in body["items"]
        }

    async def store_equals_list(self, *, within: float, what: str) -> float:
        """Seconds until the store equals a fresh LIST; fails after `within` with the diff."""
        started = time.monotonic()
        while True:
            truth = await self.fresh_list()
            store = self.store()
            if store == truth:
                return time.monotonic() - started
            if time.monotonic() - started > within:
                raise AssertionError(
                    f"{what}: the store did not equal a fresh LIST within {within:.1f}s\n"
                    f"  ghosts (stored, not listed): {sorted(set(store) - set(truth))}\n"
                    f"  missing (listed, not stored): {sorted(set(truth) - set(store))}\n"
                    f"  stale: {sorted(n for n in set(store) & set(truth) if store[n] != truth[n])}"
                    f"\n  {self.cells.api.describe()}"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def create(self, name: str, *, cell: str) -> None:
        await _retrying(lambda: self.cells.create(name, cell=cell), what=f"create {name}")

    async def seed(self, cell: str, *names: str) -> None:
        """Creates `names` in `cell` and waits until the cell holds exactly them."""
        for name in names:
            await self.create(name, cell=cell)
        await self.cells.converge(cell, set(names))

    async def move(self, name: str, *, cell: str) -> None:
        """Relabels the pod into `cell` straight on the apiserver (no retry: the proxy is what is
        faulted, not the write)."""
        await raw_json(
            self.direct.patch_namespaced_pod(
                name,
                self.namespace,
                {"metadata": {"labels": {CELL_LABEL: cell}}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )

    async def delete(self, name: str) -> None:
        await _retrying(
            lambda: self.direct.delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=0, _preload_content=False
            ),
            what=f"delete {name}",
        )


@asynccontextmanager
async def faulted_cells(
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    *,
    retry_delay: float = 0.2,
    watch_timeout_seconds: int = 60,
    before_start: Callable[[HttpFaultProxy], object] | None = None,
    create_namespace: bool = False,
    consistency_check_period: float | None = None,
    **api_options: float,
) -> AsyncIterator[Faulted]:
    """`Cells` started behind a new proxy; `before_start` adds faults the first LIST must meet."""
    async with HttpFaultProxy(kubeconfig=kubeconfig) as proxy:
        if before_start is not None:
            before_start(proxy)
        proxied = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        async with api_client(proxied) as through, api_client(kubeconfig) as straight:
            if create_namespace:
                body = client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
                await client.CoreV1Api(straight).create_namespace(body)
            core = client.CoreV1Api(through)
            recording = RecordingPodApi(pod_api(core, **api_options))
            async with Cells.running(
                core_v1=client.CoreV1Api(straight),
                namespace=namespace,
                api=recording,
                retry_delay=retry_delay,
                watch_timeout_seconds=watch_timeout_seconds,
                consistency_check_period=consistency_check_period,
            ) as cells:
                yield Faulted(cells, proxy, client.CoreV1Api(straight), namespace)


async def _retrying(write: Callable[[], Awaitable[Any]], *, what: str) -> None:
    """One write, retried for up to `WRITE_RETRY_SECONDS` while the apiserver answers 5xx or its
    connection fails (etcd just restarted under it)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    deadline = time.monotonic() + WRITE_RETRY_SECONDS
    while True:
        try:
            result = await write()
            release = getattr(result, "release", None)
            if release is not None:
                release()
            return
        except (ApiException, OSError, TimeoutError) as err:
            if isinstance(err, ApiException) and err.status < 500:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} kept failing: {err}") from err
        await asyncio.sleep(0.2)


async def raw_bytes(request: Awaitable[Any]) -> bytes:
    """The body of a 2xx answer to a call made with `_preload_content=False`."""
    resp = await request
    try:
        status, body = resp.status, await resp.read()
    finally:
        resp.release()
    assert 200 <= status < 300, f"HTTP {status}: {body[:300]!r}"
    return bytes(body)


async def raw_json(request: Awaitable[Any]) -> Any:
    """The JSON body of a 2xx answer to a call made with `_preload_content=False`."""
    return json.loads(await raw_bytes(request))


def lines_naming(records: Sequence[logging.LogRecord], *needles: str) -> list[str]:
    """The messages at WARNING or above that contain every one of `needles`."""
    return [
        message
        for record in records
        if record.levelno >= logging.WARNING
        and all(needle in (message := record.getMessage()) for needle in needles)
    ]


def consistent_lists(seen: Sequence[Seen]) -> list[Seen]:
    """The first pages of consistent LISTs (no resourceVersion, no continue token): one per
    listing, cursor probes and later pages left out."""
    return [
        r
        for r in seen
        if not r.is_watch and "resourceVersion=" not in r.target and "continue=" not in r.target
    ]
