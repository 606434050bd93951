"""Our side of the differential: a `ReconcileLoop` over a `KubernetesReflector`, in the harness's
process or in a child process of its own. Go counterpart: none (client-go's side is the oracle).

`OurLoop` is the loop and the reconcile the harness checks; `OurLoopProcess` runs the same thing in
a child (`python -m MODULE`, speaking `serve()`'s JSON lines on stdin and stdout), so that what
the child's process measures (RSS, fds, threads) is the loop's own and not the harness's: its
writers, its fresh LISTs and the fault proxies stay in the parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TextIO

from miles.utils.k8s_testenv.client import api_client
from miles.utils.k8s_testenv.process import exit_failure, spawn_piped
from miles.utils.k8s_testenv.testing.differential.engine_pools import ENGINE_POOLS, pool_row
from miles.utils.k8s_testenv.testing.differential.oracle_client import end_process_group, log_tail
from miles.utils.k8s_testenv.testing.differential.views import PodRow, status_of_pod
from miles.utils.k8s_testenv.testing.pod_api_recorder import RecordingPodApi
from miles.utils.workers.reconcile.k8s_api import (
    KubernetesAsyncioPodApi,
    KubernetesAsyncioResourceApi,
)
from miles.utils.workers.reconcile.k8s_objects import DynamicObject
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.watches import Watch

PARENT_LABEL = "miles.diff/parent"
POOLS_WATCH = "enginepools"
"""The name of our loop's second watch, over engine pools, where the harness watches them."""
RETRY_DELAY = 0.5
"""Our reflector's first backoff step is [RETRY_DELAY, 2 * RETRY_DELAY) (jitter 1.0)."""
OURS_USER_AGENT = "OpenAPI-Generator/"
"""How our loop's requests' User-Agent begins: `kubernetes_asyncio`'s default."""

_READ_TIMEOUT = 30.0
_READY_TIMEOUT = 120.0
_EXIT_GRACE = 10.0
_LINE_LIMIT = 256 * 2**20


def parent_of(labels: Mapping[str, str]) -> str | None:
    return labels.get(PARENT_LABEL)


class ReconcileFault(RuntimeError):
    """Raised by the test reconcile while the reconcile-raises fault is on."""


class OurLoopError(RuntimeError):
    """The child running our loop died, hung, or answered something unreadable."""


@dataclass(frozen=True)
class OurLoopSettings:
    kubeconfig: Path
    namespace: str
    selector: str
    watch_timeout_seconds: int
    streaming_list: bool
    engine_pools: bool = False
    """A second source in the same loop: the engine pools of `namespace` under `selector`,
    decoded as `DynamicObject`, keyed to the same parents."""


@dataclass(frozen=True)
class OurViews:
    """Our store, what the last reconcile of each parent read (a pod two parents read shows
    both, `a+b`), and how many consistent LISTs the reflector started."""

    store: dict[str, PodRow]
    reconciled: dict[str, PodRow]
    lists: int
    pools: dict[str, PodRow] | None = None
    """The engine pools' cache and what each parent's last reconcile read of it."""
    reconciled_pools: dict[str, PodRow] | None = None


class Ours(Protocol):
    """What the harness needs of our side, wherever it runs."""

    async def views(self) -> OurViews: ...

    async def reconcile_fault(self, *, delay: float, raises: bool) -> None: ...

    async def forget_recordings(self) -> None: ...

    def failure(self) -> str | None: ...


def _row(pod: Pod, parent: str) -> PodRow:
    meta = pod.metadata
    return PodRow(
        uid=meta.uid or "",
        resource_version=meta.resource_version or "",
        parent=parent,
        status=status_of_pod(pod),
    )


class OurLoop:
    """`async with OurLoop(settings) as ours:` our loop, started and synced, in this process."""

    def __init__(self, settings: OurLoopSettings) -> None:
        self._settings = settings
        self._stack = AsyncExitStack()
        self._api: RecordingPodApi | None = None
        self._loop: ReconcileLoop | None = None
        self._reconciled: dict[str, dict[str, PodRow]] = {}
        self._reconciled_pools: dict[str, dict[str, PodRow]] = {}
        self._delay = 0.0
        self._raises = False

    async def __aenter__(self) -> OurLoop:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        from kubernetes_asyncio import client

        settings = self._settings
        api = await self._stack.enter_async_context(api_client(settings.kubeconfig))
        self._api = RecordingPodApi(
            KubernetesAsyncioPodApi(
                core_v1_api=client.CoreV1Api(api),
                connect_timeout=3.0,
                list_read_timeout=15.0,
                watch_read_margin=2.0,
            )
        )
        reflector = KubernetesReflector(
            kube_client=self._api,
            namespace=settings.namespace,
            label_selector=settings.selector,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            retry_delay=RETRY_DELAY,
            streaming_list=settings.streaming_list,
        )

        def key_map(obj: Any) -> str | None:
            return parent_of(obj.metadata.labels)

        pods = Watch(source=reflector.watch, key_map=key_map, name="pods")
        sources = [pods]
        if settings.engine_pools:
            pools = KubernetesReflector(
                api=KubernetesAsyncioResourceApi.beside(
                    client.CoreV1Api(api),
                    resource=ENGINE_POOLS,
                    model=DynamicObject,
                    connect_timeout=3.0,
                    list_read_timeout=15.0,
                    watch_read_margin=2.0,
                ),
                namespace=settings.namespace,
                label_selector=settings.selector,
                watch_timeout_seconds=settings.watch_timeout_seconds,
                retry_delay=RETRY_DELAY,
                streaming_list=settings.streaming_list,
            )
            sources.append(Watch(source=pools.watch, key_map=key_map, name=POOLS_WATCH))
        self._loop = ReconcileLoop(
            sources=sources,
            reconcile=self._reconcile,
            failure_base_delay=0.2,
            failure_max_delay=2.0,
            source_retry_delay=0.5,
        )
        await self._stack.enter_async_context(self._loop)

    async def _reconcile(self, parent: str) -> None:
        if self._delay:
            await asyncio.sleep(self._delay)
        if self._raises:
            raise ReconcileFault(f"reconcile of {parent} fails while the fault is on")
        assert self._loop is not None
        self._reconciled[parent] = {
            pod.metadata.name: _row(pod, parent) for pod in self._loop.get_by_parent(parent)
        }
        if self._settings.engine_pools:
            self._reconciled_pools[parent] = {
                pool.metadata.name: pool_row(pool, parent)
                for pool in self._loop.cache(POOLS_WATCH).get_by_parent(parent)
            }

    @property
    def stored_pods(self) -> int:
        loop = self._loop
        return sum(len(loop.get_by_parent(p)) for p in loop.parent_keys()) if loop else 0

    @property
    def list_attempts(self) -> int:
        return self._api.list_attempts if self._api else 0

    async def views(self) -> OurViews:
        assert self._loop is not None
        assert self._api is not None
        store: dict[str, PodRow] = {}
        for parent in self._loop.parent_keys():
            for pod in self._loop.get_by_parent(parent):
                store[pod.metadata.name] = _row(pod, parent)
        views = OurViews(
            store=store, reconciled=_merged(self._reconciled), lists=self._api.list_attempts
        )
        if not self._settings.engine_pools:
            return views
        cache = self._loop.cache(POOLS_WATCH)
        pools = {
            pool.metadata.name: pool_row(pool, parent)
            for parent in cache.parent_keys()
            for pool in cache.get_by_parent(parent)
        }
        return replace(views, pools=pools, reconciled_pools=_merged(self._reconciled_pools))

    async def reconcile_fault(self, *, delay: float, raises: bool) -> None:
        self._delay, self._raises = delay, raises

    async def forget_recordings(self) -> None:
        """The recorder keeps every page and frame, and the harness reads only its LIST count:
        dropping the rest at each checkpoint keeps a soak's memory from growing with every frame
        of the run (measured: 130k to 410k Python objects over 20 minutes)."""
        api = self._api
        if api is not None:
            for recorded in (api.log, api.lists, api.pages, api.probes, api.watches):
                recorded.clear()

    def failure(self) -> str | None:
        return None


def _merged(by_parent: Mapping[str, Mapping[str, PodRow]]) -> dict[str, PodRow]:
    """What the last reconcile of each parent read, one row per object; one that two parents
    read shows both, `a+b`, and so matches no store."""
    reconciled: dict[str, PodRow] = {}
    for parent, members in sorted(by_parent.items()):
        for name, row in members.items():
            if name in reconciled:
                both = f"{reconciled[name].parent}+{parent}"
                row = PodRow(row.uid, row.resource_version, both)
            reconciled[name] = row
    return reconciled


def _rows(view: Mapping[str, PodRow] | None) -> list[list[str | None]] | None:
    if view is None:
        return None
    return [[name, r.uid, r.resource_version, r.parent, r.status] for name, r in view.items()]


def _optional_view(rows: Any) -> dict[str, PodRow] | None:
    return None if rows is None else _view(rows)


def _view(rows: Any) -> dict[str, PodRow]:
    return {name: PodRow(uid, rv, parent, status) for name, uid, rv, parent, status in rows}


async def serve(ours: Ours, reader: asyncio.StreamReader, out: TextIO) -> None:
    """Answers one JSON line on `out` per request line on `reader` until it closes:
    `{"op": "views"}`, `{"op": "fault", "delay": s, "raises": b}`, `{"op": "forget"}`."""
    print(json.dumps({"ready": True}), file=out, flush=True)
    while line := await reader.readline():
        request = json.loads(line)
        op = request["op"]
        if op == "views":
            views = await ours.views()
            answer: dict[str, Any] = {
                "store": _rows(views.store),
                "reconciled": _rows(views.reconciled),
                "lists": views.lists,
                "pools": _rows(views.pools),
                "reconciled_pools": _rows(views.reconciled_pools),
            }
        elif op == "fault":
            delay, raises = float(request["delay"]), bool(request["raises"])
            await ours.reconcile_fault(delay=delay, raises=raises)
            answer = {"ok": True}
        elif op == "forget":
            await ours.forget_recordings()
            answer = {"ok": True}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), file=out, flush=True)


def protocol_stdout() -> TextIO:
    """The process's stdout for `serve()` alone: file descriptor 1 then points at stderr, so
    that nothing else printed can corrupt an answer."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


async def stdin_reader() -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=_LINE_LIMIT)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def settings_argument(settings: OurLoopSettings) -> str:
    return json.dumps({**asdict(settings), "kubeconfig": str(settings.kubeconfig)})


def parse_settings_argument(text: str) -> OurLoopSettings:
    raw = json.loads(text)
    return OurLoopSettings(**{**raw, "kubeconfig": Path(raw["kubeconfig"])})


class OurLoopProcess:
    """`async with OurLoopProcess(settings, module=..., log_path=...) as ours:` runs
    `python -m MODULE SETTINGS_JSON` in its own process group; the module calls `serve()`. Closing
    stdin ends it; a child that lingers past the grace is killed by its process group."""

    def __init__(
        self,
        settings: OurLoopSettings,
        *,
        module: str,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = [sys.executable, "-m", module, settings_argument(settings), *extra_args]
        self._log_path = log_path
        self._env = None if env is None else {**os.environ, **env}
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def __aenter__(self) -> OurLoopProcess:
        self._process = await spawn_piped(
            self._argv, self._log_path, limit=_LINE_LIMIT, env=self._env
        )
        try:
            ready = await self._read(_READY_TIMEOUT)
            if not ready.get("ready"):
                raise OurLoopError(f"our loop's process did not say it was ready: {ready}")
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def failure(self) -> str | None:
        return exit_failure(self._process, "our loop's process", self._log_tail)

    async def views(self) -> OurViews:
        answer = await self._ask({"op": "views"})
        return OurViews(
            store=_view(answer["store"]),
            reconciled=_view(answer["reconciled"]),
            lists=int(answer["lists"]),
            pools=_optional_view(answer.get("pools")),
            reconciled_pools=_optional_view(answer.get("reconciled_pools")),
        )

    async def reconcile_fault(self, *, delay: float, raises: bool) -> None:
        await self._ask({"op": "fault", "delay": delay, "raises": raises})

    async def forget_recordings(self) -> None:
        await self._ask({"op": "forget"})

    async def _ask(self, request: Mapping[str, Any]) -> Any:
        process = self._process
        if process is None or process.stdin is None:
            raise OurLoopError("our loop's process is not started")
        async with self._lock:
            try:
                process.stdin.write(json.dumps(request).encode() + b"\n")
                await asyncio.wait_for(process.stdin.drain(), _READ_TIMEOUT)
            except (ConnectionError, BrokenPipeError) as err:
                raise OurLoopError(self.failure() or f"our loop's pipe broke: {err}") from err
            return await self._read(_READ_TIMEOUT)

    async def _read(self, seconds: float) -> Any:
        assert self._process is not None
        assert self._process.stdout is not None
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), seconds)
        except TimeoutError as err:
            raise OurLoopError(
                f"our loop's process did not answer within {seconds:.0f}s\n{self._log_tail()}"
            ) from err
        if not line:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._process.wait(), 1.0)
            raise OurLoopError(self.failure() or "our loop's process closed its stdout")
        answer = json.loads(line)
        if "error" in answer:
            raise OurLoopError(f"our loop's process: {answer['error']}")
        return answer

    async def aclose(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await end_process_group(process, _EXIT_GRACE)

    def _log_tail(self) -> str:
        return log_tail(self._log_path, "our loop's log")
