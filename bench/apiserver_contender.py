"""One Python contender of ``bench/apiserver.py`` in its own process: ours, or kubernetes_asyncio.

Go counterpart: the client-go oracle (``tools/k8s/oracle``) plays the same part for Go.

Both contenders run the same ``ReconcileLoop`` (key map: the parent label) and the same recording
reconcile; only the source differs: ``KubernetesReflector`` over ``KubernetesAsyncioPodApi``
(ours) or ``KubernetesAsyncioModelReflector`` (``V1Pod`` models); ``ours-typed`` and
``ours-dynamic`` watch engine pools (``bench/apiserver_objects.py``) through
``KubernetesAsyncioResourceApi``. Protocol, one JSON line each:

1. ``synced``: once the store holds every pod and every parent has been reconciled once, with the
   start stamp (before the API client is built), the synced stamp, and RSS before and after;
2. on ``mark`` (the writer is about to start): ``marked``, the CPU clock reset;
3. on ``drain <rv>``: once an event with resourceVersion >= rv has been applied (or after
   ``--drain-timeout``), ``drained`` with every applied (rv, stamp), every dispatch latency, and the
   CPU seconds used since ``mark``;
4. on ``wait <rv>``: the same wait, then ``caught-up`` with the highest resourceVersion applied and
   nothing else, so that a count of the contender's instructions can end right after it
   (``bench/apiserver_callgrind.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_asyncio.client
import kubernetes_asyncio.config
import kubernetes_asyncio.watch  # noqa: F401  (imported before the clock starts, as Go's init)

from bench.apiserver_ka_reflector import KubernetesAsyncioModelReflector
from bench.apiserver_objects import CONTENDERS as OBJECT_CONTENDERS
from bench.apiserver_objects import POOLS
from bench.apiserver_proc import (
    PARENT_LABEL,
    SELECTOR,
    AppliedEvents,
    cpu_seconds,
    emit,
    read_command,
    rss_bytes,
)
from bench.apiserver_wire import WIRE_LEVELS, WireReader
from bench.objects import EnginePool
from miles.utils.workers.reconcile.heap_trim import trim_free_heap
from miles.utils.workers.reconcile.k8s_api import (
    KubernetesAsyncioPodApi,
    KubernetesAsyncioResourceApi,
)
from miles.utils.workers.reconcile.k8s_objects import DynamicObject
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ParentKey,
    ReplaceEvent,
    SourceEvent,
    SourceWatchFn,
    UpsertEvent,
)

CONTENDERS = ("ours", "ours-stream", "ka", *OBJECT_CONTENDERS, *WIRE_LEVELS)
STREAMING = "ours-stream"
"""Ours listing by a streaming list (``sendInitialEvents``) instead of paged LISTs."""


def parent_of(pod: Any) -> ParentKey | None:
    labels = pod.metadata.labels
    return labels.get(PARENT_LABEL) if labels else None


class Recorder(AppliedEvents):
    """Stamps each event once the store has applied it, and each reconcile of a parent that had
    events pending."""

    def __init__(self, *, parents: int) -> None:
        super().__init__()
        self.stored = 0
        self._parents = parents
        self._reconciled: set[ParentKey] = set()
        self._pending: defaultdict[ParentKey, list[float]] = defaultdict(list)
        self.all_reconciled = asyncio.Event()

    def wrap(self, source: SourceWatchFn) -> SourceWatchFn:
        async def recorded() -> AsyncIterator[SourceEvent]:
            async for event in source():
                yield event
                self._note_applied(event)

        return recorded

    def _note_applied(self, event: SourceEvent) -> None:
        now = time.monotonic()
        if isinstance(event, ReplaceEvent):
            self.stored = len(event.objects)
            return
        obj = event.obj if isinstance(event, UpsertEvent) else event.last_obj
        self.stored += isinstance(event, UpsertEvent) - isinstance(event, DeleteEvent)
        parent = parent_of(obj)
        if parent is not None:
            self._pending[parent].append(now)
        self.note(int(obj.metadata.resource_version), now)

    def reconciler(self, members: Callable[[ParentKey], list[Any]]) -> Any:
        async def reconcile(parent: ParentKey) -> None:
            now = time.monotonic()
            members(parent)
            stamps = self._pending.pop(parent, None)
            if stamps:
                self.dispatch.extend(now - stamp for stamp in stamps)
            if not self.all_reconciled.is_set():
                self._reconciled.add(parent)
                if len(self._reconciled) >= self._parents:
                    self.all_reconciled.set()

        return reconcile


def build_source(name: str, api_client: Any, namespace: str) -> SourceWatchFn:
    from kubernetes_asyncio import client

    core = client.CoreV1Api(api_client)
    if name in OBJECT_CONTENDERS:
        model = EnginePool if name == "ours-typed" else DynamicObject
        return KubernetesReflector(
            api=KubernetesAsyncioResourceApi(api_client=api_client, resource=POOLS, model=model),
            namespace=namespace,
            label_selector=SELECTOR,
        ).watch
    if name.startswith("ours"):
        streaming: dict[str, Any] = {"streaming_list": True} if name == STREAMING else {}
        return KubernetesReflector(
            **streaming,
            kube_client=KubernetesAsyncioPodApi(core_v1_api=core),
            namespace=namespace,
            label_selector=SELECTOR,
        ).watch
    return KubernetesAsyncioModelReflector(
        core_v1_api=core, namespace=namespace, label_selector=SELECTOR
    ).watch


class Profiler:
    """cProfile around the sync phase and the watch phase, one pstats file each (if asked).

    It counts this process's CPU time, not wall time: on a shared two-core machine a wall-clock
    profile charges to whatever call was running the time the process spent waiting for a core.
    """

    def __init__(self, prefix: str | None) -> None:
        self._prefix = prefix
        self._profile: cProfile.Profile | None = None

    def start(self) -> None:
        if self._prefix is not None:
            self._profile = cProfile.Profile(time.process_time)
            self._profile.enable()

    def dump(self, phase: str) -> None:
        if self._profile is not None and self._prefix is not None:
            self._profile.disable()
            self._profile.dump_stats(f"{self._prefix}.{phase}.prof")
            self._profile = None


class CollectorPauses:
    """Every pause of the cyclic garbage collector, as (generation, seconds)."""

    def __init__(self) -> None:
        self._pauses: list[tuple[int, float]] = []
        self._started = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._pauses.append((info["generation"], time.perf_counter() - self._started))

    def take(self) -> list[tuple[int, float]]:
        taken, self._pauses = self._pauses, []
        return taken


@dataclass(frozen=True)
class SyncStart:
    """A contender's stamps just before it builds its API client, for its ``synced`` line."""

    rss: int
    monotonic: float
    cpu: float

    @classmethod
    def now(cls) -> SyncStart:
        return cls(rss_bytes(), time.monotonic(), cpu_seconds())

    def synced(
        self, *, pods: int, pauses: CollectorPauses, trimmed: Callable[[], int] | None = None
    ) -> None:
        synced = time.monotonic()
        cpu = cpu_seconds() - self.cpu
        rss_after = rss_bytes()
        gc_pauses = pauses.take()  # before ``trimmed``, whose own collection is not the sync's
        emit(
            {
                "phase": "synced",
                "started": self.monotonic,
                "synced": synced,
                "sync_cpu": cpu,
                "rss_before": self.rss,
                "rss_after": rss_after,
                "rss_trimmed": rss_after if trimmed is None else trimmed(),
                "pods": pods,
                "gc_pauses": gc_pauses,
            }
        )


def starting(args: argparse.Namespace) -> tuple[Profiler, CollectorPauses, SyncStart]:
    """The profiler, the collector's pauses from a collected heap on, and the start stamps."""
    profiler = Profiler(args.profile)
    gc.collect()
    return profiler, CollectorPauses(), SyncStart.now()


def full_collection_seconds() -> float:
    """What one full collection of this heap costs. CPython runs one once ten generation-1
    collections have run since the last, and a quarter more objects than it found alive have been
    promoted since."""
    started = time.process_time()
    gc.collect()
    return time.process_time() - started


def trimmed_rss() -> int:
    """RSS once garbage is collected and glibc has returned its free pages: what stays."""
    gc.collect()
    trim_free_heap()
    return rss_bytes()


async def run(args: argparse.Namespace) -> None:
    from miles.utils.k8s_testenv.client import api_client

    profiler, pauses, start = starting(args)
    profiler.start()
    recorder = Recorder(parents=args.parents)
    async with api_client(Path(args.kubeconfig)) as api:
        loop = ReconcileLoop(
            source=recorder.wrap(build_source(args.contender, api, args.namespace)),
            reconcile=recorder.reconciler(lambda parent: loop.get_by_parent(parent)),
            key_map=parent_of,
        )
        async with loop:
            await recorder.all_reconciled.wait()
            start.synced(pods=recorder.stored, pauses=pauses, trimmed=trimmed_rss)
            profiler.dump("sync")
            await follow_commands(recorder, profiler, pauses, args)


async def run_wire(args: argparse.Namespace) -> None:
    """The wire contender (``bench/apiserver_wire.py``) in the same protocol: synced once its LIST
    is read; its WATCH runs until ``quit``."""
    from kubernetes_asyncio import client

    from miles.utils.k8s_testenv.client import api_client

    profiler, pauses, start = starting(args)
    async with api_client(Path(args.kubeconfig)) as api:
        reader = WireReader(client.CoreV1Api(api), args.namespace, WIRE_LEVELS[args.contender])
        watch = asyncio.create_task(reader.watch(await reader.list()))
        try:
            start.synced(pods=reader.stored, pauses=pauses)
            await follow_commands(reader, profiler, pauses, args)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch


async def follow_commands(
    recorder: AppliedEvents,
    profiler: Profiler,
    pauses: CollectorPauses,
    args: argparse.Namespace,
) -> None:
    cpu_at_mark = cpu_seconds()
    while True:
        command, *rest = (await read_command()).split()
        if command == "mark":
            recorder.reset()
            gc.collect()
            pauses.take()
            cpu_at_mark = cpu_seconds()
            profiler.start()
            emit({"phase": "marked"})
        elif command == "drain":
            await recorder.wait_for_rv(int(rest[0]), args.drain_timeout)
            profiler.dump("watch")
            cpu, watch_pauses, rss = cpu_seconds() - cpu_at_mark, pauses.take(), rss_bytes()
            emit(
                {
                    "phase": "drained",
                    "applied": recorder.applied,
                    "dispatch": recorder.dispatch.tolist(),
                    "cpu": cpu,
                    "gc_pauses": watch_pauses,
                    "full_gc": full_collection_seconds(),
                    "rss": rss,
                }
            )
        elif command == "wait":
            await recorder.wait_for_rv(int(rest[0]), args.drain_timeout)
            emit({"phase": "caught-up", "rv": recorder.max_rv})
        elif command == "quit":
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--contender", choices=CONTENDERS, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--parents", type=int, required=True)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--profile", default=None, help="pstats path prefix")
    args = parser.parse_args()
    asyncio.run(run_wire(args) if args.contender in WIRE_LEVELS else run(args))


if __name__ == "__main__":
    main()
