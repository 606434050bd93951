"""Layer: real apiserver, no kubelet. Shared helpers for the runtime tests of this layer.

- `replay_members`: folds the log of a `RecordingPodApi`
  (`miles.utils.k8s_testenv.testing.pod_api_recorder`) into what the store must hold for a parent
  after a prefix of it, so a test can check each reconcile against exactly the events that
  preceded it.
- `Cells`: a `ReconcileLoop` over a `KubernetesReflector` on a recording api, keyed by `CELL_LABEL`,
  recording every reconcile with the members it read and how much of the log had arrived.
- `eventually`: a bounded wait on a polled condition that fails naming what it awaited.
- `write_client`: the write client on an `ApiClient` through a transport of `WRITE_TRANSPORTS`:
  the HTTP/2 one `k8s_api.write_transport` picks (HTTP/1.1 behind `HttpFaultProxy`, whose ALPN
  offers only `http/1.1`), the HTTP/1.1 one, or aiohttp's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kubernetes_asyncio import client

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.apiserver_metrics import apiserver_metrics, series_sum
from miles.utils.k8s_testenv.testing.pod_api_recorder import LogEntry, RecordingPodApi
from miles.utils.workers.reconcile.client import Client
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport, write_transport
from miles.utils.workers.reconcile.k8s_http import HttpTransport
from miles.utils.workers.reconcile.k8s_http2 import Http2Transport
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import PodListPage
from miles.utils.workers.reconcile.loop import ReconcileLoop

if TYPE_CHECKING:
    from miles.utils.k8s_testenv import ApiClientFactory, LocalControlPlane
    from miles.utils.k8s_testenv.control_plane import ApiServerName
    from miles.utils.workers.reconcile.metrics import MetricsTarget

WRITE_TRANSPORTS = ("http2", "http11", "aiohttp")
"""The write client's transports: ``k8s_http2.Http2Transport`` (the default),
``k8s_http.HttpTransport`` and ``KubernetesAsyncioTransport``."""
CELL_LABEL = "miles.test/cell"
SELECTED_LABEL = "miles.test/selected"
SELECTED = "yes"
SELECTOR = f"{SELECTED_LABEL}={SELECTED}"
WAIT_SECONDS = 30.0
POLL_SECONDS = 0.05
FUTURE_OFFSET = 10_000_000
"""Added to the current resourceVersion: a cursor etcd will not reach during a test."""

T = TypeVar("T")


async def eventually(
    probe: Callable[[], T | None],
    *,
    what: str,
    within: float = WAIT_SECONDS,
    context: Callable[[], str] | None = None,
) -> T:
    """The first non-None, non-False value of `probe()`, polled every `POLL_SECONDS`."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            detail = f"; {context()}" if context is not None else ""
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}{detail}")
        await asyncio.sleep(POLL_SECONDS)


async def open_namespaced_pod_watches(api_client: Any) -> int:
    """The apiserver's own count of WATCH requests on namespaced pods that are open right now."""
    text = await apiserver_metrics(api_client)
    labels = ('resource="pods"', 'scope="namespace"', 'verb="WATCH"', 'subresource=""')
    return int(series_sum(text, "apiserver_longrunning_requests", *labels))


def pod_manifest(name: str, *, cell: str | None, selected: bool = True) -> dict[str, Any]:
    """A pod bound to a node directly (no scheduler), with one minimal container."""
    labels = {SELECTED_LABEL: SELECTED if selected else "no"}
    if cell is not None:
        labels[CELL_LABEL] = cell
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox"}]},
    }


async def create_pod(
    core_v1: Any, namespace: str, name: str, *, cell: str | None, selected: bool = True
) -> Any:
    return await core_v1.create_namespaced_pod(
        namespace, pod_manifest(name, cell=cell, selected=selected)
    )


async def future_cursor(core_v1: Any, namespace: str) -> str:
    listed = await core_v1.list_namespaced_pod(namespace)
    return str(int(listed.metadata.resource_version) + FUTURE_OFFSET)


async def make_cursor_stale_then_compact(
    core_v1: Any, plane: LocalControlPlane, namespace: str, stale: str
) -> None:
    """Writes the pod watch does not see move etcd past `stale`; etcd is then compacted to its
    head, so a watch from `stale` meets a real 410."""
    for index in range(3):
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"unwatched-{index}"))
        await core_v1.create_namespaced_config_map(namespace, body)
    compacted_to = await asyncio.to_thread(plane.compact_etcd)
    assert compacted_to > int(stale) + 1


class ForgedCursorCoreV1:
    """A `CoreV1Api` stand-in that forwards everything, except that the first `list_namespaced_pod`
    call that is a WATCH (`on_watch=True`) or a LIST (`on_watch=False`) is sent from
    `resource_version` instead. A forged WATCH also asks for `sendInitialEvents`, the one watch
    shape for which a real server answers a future cursor rather than waiting for it."""

    def __init__(self, core_v1: Any, resource_version: str, *, on_watch: bool) -> None:
        self._core = core_v1
        self._forged: str | None = resource_version
        self._on_watch = on_watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    async def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        if self._forged is not None and bool(kwargs.get("watch")) == self._on_watch:
            kwargs["resource_version"], self._forged = self._forged, None
            if self._on_watch:
                kwargs.update(send_initial_events=True, resource_version_match="NotOlderThan")
        return await self._core.list_namespaced_pod(namespace, **kwargs)


def cell_of(pod: Pod) -> str | None:
    return pod.metadata.labels.get(CELL_LABEL)


Members = dict[str, str]
"""Pod name to resourceVersion."""


def replay_members(log: Sequence[LogEntry], parent: str) -> Members:
    """What the store must hold for `parent` once `log` has been applied to it."""
    pods: dict[str, Pod] = {}
    for entry in log:
        if isinstance(entry, PodListPage):
            pods = {pod.metadata.name: pod for pod in entry.pods}
        elif entry.pod is not None and entry.type == "DELETED":
            pods.pop(entry.pod.metadata.name, None)
        elif entry.pod is not None:
            pods[entry.pod.metadata.name] = entry.pod
    return {
        name: pod.metadata.resource_version or ""
        for name, pod in pods.items()
        if cell_of(pod) == parent
    }


def members_of(pods: Sequence[Pod]) -> Members:
    return {pod.metadata.name: pod.metadata.resource_version or "" for pod in pods}


@dataclass(frozen=True)
class Reconciled:
    """One reconcile call: its parent, the members it read, and how much of the log had arrived."""

    parent: str
    members: Members
    log_length: int

    @property
    def names(self) -> set[str]:
        return set(self.members)


class Cells:
    """A running `ReconcileLoop` over pods of one namespace, parents named by `CELL_LABEL`."""

    def __init__(self, *, core_v1: Any, namespace: str, api: RecordingPodApi) -> None:
        self.core_v1 = core_v1
        self.namespace = namespace
        self.api = api
        self.reconciled: list[Reconciled] = []
        self._loop: ReconcileLoop | None = None

    @classmethod
    @asynccontextmanager
    async def running(
        cls,
        *,
        core_v1: Any,
        namespace: str,
        api: RecordingPodApi | None = None,
        watch_timeout_seconds: int = 60,
        retry_delay: float = 0.2,
        metrics: MetricsTarget | None = None,
        consistency_check_period: float | None = None,
    ) -> AsyncIterator[Cells]:
        cells = cls(core_v1=core_v1, namespace=namespace, api=api or RecordingPodApi.over(core_v1))
        reflector = KubernetesReflector(
            kube_client=cells.api,
            namespace=namespace,
            label_selector=SELECTOR,
            watch_timeout_seconds=watch_timeout_seconds,
            retry_delay=retry_delay,
            consistency_check_period=consistency_check_period,
        )
        cells._loop = ReconcileLoop(
            source=reflector.watch,
            reconcile=cells._record,
            key_map=cell_of,
            source_retry_delay=retry_delay,
            metrics=metrics,
        )
        async with cells._loop:
            yield cells

    @classmethod
    @asynccontextmanager
    async def on(
        cls,
        k8s_api_client: ApiClientFactory,
        apiserver: ApiServerName,
        *,
        namespace: str,
        watch_timeout_seconds: int = 60,
        metrics: MetricsTarget | None = None,
    ) -> AsyncIterator[Cells]:
        """``running`` on a client of the plane's ``apiserver``, opened for it and closed after."""
        async with (
            k8s_api_client(apiserver) as api,
            cls.running(
                core_v1=client.CoreV1Api(api),
                namespace=namespace,
                watch_timeout_seconds=watch_timeout_seconds,
                metrics=metrics,
            ) as cells,
        ):
            yield cells

    @property
    def loop(self) -> ReconcileLoop:
        assert self._loop is not None, "the reconcile loop is not running"
        return self._loop

    async def _record(self, parent: str) -> None:
        members = members_of(self.loop.get_by_parent(parent))
        self.reconciled.append(Reconciled(parent, members, len(self.api.log)))

    async def create(self, name: str, *, cell: str | None, selected: bool = True) -> Any:
        return await create_pod(self.core_v1, self.namespace, name, cell=cell, selected=selected)

    async def seed(self, cell: str, *names: str) -> None:
        """Creates `names` in `cell` and waits until the cell holds exactly them."""
        for name in names:
            await self.create(name, cell=cell)
        await self.converge(cell, set(names))

    async def patch_labels(self, name: str, labels: dict[str, str | None]) -> Any:
        body = {"metadata": {"labels": labels}}
        return await self.core_v1.patch_namespaced_pod(name, self.namespace, body)

    async def delete(self, name: str) -> None:
        await self.core_v1.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def member_names(self, cell: str) -> set[str]:
        return {pod.metadata.name for pod in self.loop.get_by_parent(cell)}

    def last_reconciled(self, cell: str) -> Reconciled | None:
        return next((r for r in reversed(self.reconciled) if r.parent == cell), None)

    def describe(self) -> str:
        cells = {cell: sorted(self.member_names(cell)) for cell in self.loop.parent_keys()}
        recent = [(r.parent, sorted(r.names)) for r in self.reconciled[-6:]]
        return f"store={cells} last reconciles={recent} {self.api.describe()}"

    async def converge(
        self, cell: str, names: set[str], *, within: float = WAIT_SECONDS
    ) -> Reconciled:
        """Waits until the store holds exactly `names` for `cell` and a reconcile has read them."""

        def probe() -> Reconciled | None:
            last = self.last_reconciled(cell)
            if self.member_names(cell) != names or last is None or last.names != names:
                return None
            return last

        return await eventually(
            probe,
            what=f"cell {cell!r} reconciled with exactly {sorted(names)}",
            within=within,
            context=self.describe,
        )

    async def assert_consistent(self, *, lists: int = 1) -> None:
        """Every change woke its parent, no reconcile read a stale store, and `lists` consistent
        LISTs ran (the initial sync plus relists; cursor probes are counted apart)."""
        await eventually(
            lambda: not self.unwoken_changes(),
            what="a reconcile after every membership change",
            context=lambda: f"unwoken={self.unwoken_changes()} {self.describe()}",
        )
        assert self.stale_reconciles() == []
        assert len(self.api.lists) == lists, self.api.describe()

    def stale_reconciles(self) -> list[tuple[Reconciled, Members]]:
        """Every reconcile that read members other than its log prefix says the store held."""
        stale = []
        for call in self.reconciled:
            expected = replay_members(self.api.log[: call.log_length], call.parent)
            if call.members != expected:
                stale.append((call, expected))
        return stale

    def unwoken_changes(self) -> list[tuple[int, str]]:
        """(log index, parent) for each membership change no later reconcile of that parent read."""
        missing = []
        for index, parent in self._membership_changes():
            if not any(r.parent == parent and r.log_length > index for r in self.reconciled):
                missing.append((index, parent))
        return missing

    def _membership_changes(self) -> list[tuple[int, str]]:
        changes = []
        parents = {cell_of(pod) for entry in self.api.log for pod in _pods_in(entry)}
        for parent in sorted(p for p in parents if p is not None):
            before: Members = {}
            for index in range(len(self.api.log)):
                after = replay_members(self.api.log[: index + 1], parent)
                if after != before:
                    changes.append((index, parent))
                before = after
        return changes


def _pods_in(entry: LogEntry) -> Sequence[Pod]:
    if isinstance(entry, PodListPage):
        return entry.pods
    return () if entry.pod is None else (entry.pod,)


@asynccontextmanager
async def write_client(api: Any, transport: str, *, field_manager: str) -> AsyncIterator[Client]:
    """A ``Client`` on ``api`` (an ``ApiClient``) through the ``transport`` named (one of
    ``WRITE_TRANSPORTS``), its connections closed on exit."""
    if transport == "aiohttp":
        yield Client(
            transport=KubernetesAsyncioTransport(api_client=api), field_manager=field_manager
        )
        return
    if transport == "http11":
        async with HttpTransport.for_api_client(api) as http11:
            yield Client(transport=http11, field_manager=field_manager)
        return
    async with write_transport(api) as chosen:
        assert isinstance(chosen, Http2Transport)
        yield Client(transport=chosen, field_manager=field_manager)


@asynccontextmanager
async def writer_on(
    kubeconfig: Path, transport: str, *, field_manager: str
) -> AsyncIterator[Client]:
    """A ``write_client`` on an ``ApiClient`` of its own for ``kubeconfig``, both closed on exit."""
    async with (
        api_client(kubeconfig) as api,
        write_client(api, transport, field_manager=field_manager) as writer,
    ):
        yield writer
