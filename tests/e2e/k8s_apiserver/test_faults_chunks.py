"""Layer: real apiserver (the cached kube-apiserver), no kubelet; the loop's clients go through an
`HttpFaultProxy`. A response whose chunked transfer encoding breaks mid-body: a
chunk-size line that is not hex, or a chunk whose data runs past its size, after half a frame, on
a connection the proxy then keeps open and silent.

aiohttp's C parser (llhttp) drops such a body without telling its reader, so the read used to wait
for the read-idle deadline (90 s) or the watch's client deadline (`watch_timeout_seconds` + 10 s)
before the store caught up. Now the read fails the moment aiohttp closes the connection, the watch
re-watches from its cursor (the frames before the break were whole), and a LIST is retried.

Every test runs `Cells` with `retry_delay=0.2` and the default read-idle deadline (90 s).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.http_fault_proxy import (
    LIST,
    WATCH,
    CorruptChunk,
    Fault,
    HttpFaultProxy,
)
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from tests.e2e.k8s_apiserver.fault_harness import faulted_cells, lines_naming
from tests.e2e.k8s_apiserver.harness import create_pod

pytestmark = [pytest.mark.k8s_apiserver, pytest.mark.usefixtures("behind_the_fault_proxy")]

STALE_BOUND = 3.0
"""Seconds the store may serve a deleted pod once the chunk carrying its deletion is broken: the
watch fails as that chunk arrives and re-watches at once (it had delivered frames), so the store
follows one probe-and-watch round trip later, or one backoff step (0.2 to 0.4 s) more if the watch
was new. 3 s leaves room for two busy cores and stays under the shortest watch timeout tried
(10 s); the hang lasted 18.9 s there and 90 s at the default."""
LIST_BOUND = 10.0
"""Seconds for `start()` when the first LIST's body breaks: the LIST fails at once and is retried
one backoff step later (the hang lasted until a 75 s `sock_read` that aiohttp had dropped)."""
_RUNTIME = "miles.utils.workers.reconcile"
_FRAMINGS = [CorruptChunk(), CorruptChunk(framing="terminator")]


@pytest.mark.parametrize(
    "watch_timeout_seconds",
    [10, inspect.signature(KubernetesReflector).parameters["watch_timeout_seconds"].default],
    ids=["watch-timeout-10s", "default-watch-timeout"],
)
@pytest.mark.parametrize("breakage", _FRAMINGS, ids=["bad-chunk-size", "bad-chunk-terminator"])
async def test_a_broken_chunk_fails_the_watch_at_once(
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
    breakage: CorruptChunk,
    watch_timeout_seconds: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chunk carrying a pod's deletion is broken mid-frame. Promise: the store stops serving
    the pod within `STALE_BOUND`, the watch's end is one log line at WARNING naming the broken
    body, and the loop neither relists nor spins for it."""
    caplog.set_level(logging.INFO, logger=_RUNTIME)
    async with faulted_cells(
        cached_kubeconfig, k8s_namespace, tmp_path, watch_timeout_seconds=watch_timeout_seconds
    ) as faulted:
        await faulted.seed("a", "a-0", "a-1")
        fault = faulted.proxy.add(WATCH, breakage, count=1)
        began = time.time()
        await faulted.delete("a-0")
        took = await faulted.store_equals_list(within=STALE_BOUND, what=breakage.describe())
        listings = faulted.cells.loop.status().source.lists
    print(
        f"k8s_apiserver: {breakage.describe()}: the store equalled a fresh LIST {took:.2f}s later"
    )
    assert fault.applied == 1
    named = [m for m in lines_naming(caplog.records, "malformed") if "pod watch" in m]
    assert len(named) == 1, named
    assert [r for r in caplog.records if r.created >= began and r.levelno >= logging.ERROR] == []
    assert listings == 1, "the broken chunk cost a relist"


@pytest.mark.parametrize("breakage", _FRAMINGS, ids=["bad-chunk-size", "bad-chunk-terminator"])
async def test_a_broken_chunk_fails_the_list_at_once(
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
    breakage: CorruptChunk,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The body of the first LIST (40 pods, so the apiserver sends it chunked) is broken mid-way.
    Promise: `start()` returns within `LIST_BOUND` with every pod, after one line naming the
    broken body."""
    caplog.set_level(logging.WARNING, logger=_RUNTIME)
    names = {f"a-{index}" for index in range(40)}
    async with api_client(cached_kubeconfig) as api:
        for name in sorted(names):
            await create_pod(client.CoreV1Api(api), k8s_namespace, name, cell="a")
    faults: list[Fault] = []

    def break_first_list(proxy: HttpFaultProxy) -> None:
        faults.append(proxy.add(LIST, breakage, count=1))

    async with asyncio.timeout(LIST_BOUND):
        async with faulted_cells(
            cached_kubeconfig, k8s_namespace, tmp_path, before_start=break_first_list
        ) as faulted:
            stored = set(faulted.store())
    assert [fault.applied for fault in faults] == [1]
    assert stored == names
    assert len(lines_naming(caplog.records, "malformed", "LIST")) == 1
