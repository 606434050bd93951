"""Layer: real apiserver (the cached kube-apiserver), no kubelet; the loop's clients go through an
`HttpFaultProxy`. The faults that need real HTTP, each held to its promise: the store
equals a fresh LIST within a stated bound, no pod is lost, the failure is named in a log line, and
no fault drives more than one LIST per backoff step.

Every test runs `Cells` with `retry_delay=0.2`, so Go's backoff steps are 0.2 s doubling to 30 s
with jitter up to twice the step (`backoff.py`); the bounds below are stated in those steps.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.http_fault_proxy import (
    PAGED_LIST_CONTINUATION,
    WATCH,
    BlackHole,
    CorruptChunk,
    Respond,
)
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.loop import ReconcileLoop
from tests.e2e.k8s_apiserver.fault_harness import (
    consistent_lists,
    faulted_cells,
    lines_naming,
    pod_api,
)
from tests.e2e.k8s_apiserver.harness import SELECTOR, cell_of, create_pod

pytestmark = [pytest.mark.k8s_apiserver, pytest.mark.usefixtures("behind_the_fault_proxy")]

RETRY_DELAY = 0.2
IDLE_TIMEOUT = 3.0
"""The read-idle deadline these tests give the watch (`watch_idle_timeout`); the client's total
deadline stays `watch_timeout_seconds` (60) plus its margin, so only the idle deadline can end a
stalled stream within the bounds below."""
_RUNTIME = "miles.utils.workers.reconcile"


async def test_a_watch_that_keeps_failing_relists_while_list_works(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every WATCH answered 500 for 20 s while LIST works; pods deleted and created just
    after the fault begins. Bound: the store equals a fresh LIST within 8 s, inside the fault:
    three failed watches and their backoff steps (0.2 + 0.4 + 0.8 s, each up to doubled by
    jitter, 2.8 s) plus the relist, with room for a LIST on two busy cores. Today's code re-watches
    from the same cursor for the whole fault and serves the deleted pods as ghosts."""
    caplog.set_level(logging.WARNING, logger=_RUNTIME)
    async with faulted_cells(cached_kubeconfig, k8s_namespace, tmp_path) as faulted:
        await faulted.seed("a", "a-0", "a-1", "a-2", "a-3")
        fault = faulted.proxy.add(WATCH, Respond(500), seconds=20)
        await faulted.proxy.cut()
        for name in ("a-0", "a-1", "a-2"):
            await faulted.delete(name)
        await faulted.create("a-4", cell="a")
        await faulted.store_equals_list(within=8.0, what="watches failing with 500")
        assert fault.live(time.monotonic()), "the store only caught up after the fault ended"
    assert fault.applied >= 1
    assert lines_naming(caplog.records, "500"), "no log line names the 500"


@pytest.mark.parametrize(
    "rejection",
    [Respond(410, in_band=True), Respond(504, message="Too large resource version")],
    ids=["410-in-band", "504"],
)
async def test_a_server_that_rejects_every_cursor_gets_one_list_per_backoff_step(
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
    rejection: Respond,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every WATCH rejects its cursor for 12 s. Each rejection costs a relist, but
    after a backoff step: the steps are at least 0.2, 0.4, 0.8, 1.6, 3.2, 6.4 s, whose sums pass
    12 s after the sixth, so at most 6 LISTs in the window (today's flat 0.2 s: about 60). The
    relists themselves work, so the store keeps up: a pod created during the fault is served
    within 8 s."""
    caplog.set_level(logging.WARNING, logger=_RUNTIME)
    async with faulted_cells(cached_kubeconfig, k8s_namespace, tmp_path) as faulted:
        await faulted.seed("a", "a-0")
        window = 12.0
        started = time.monotonic()
        faulted.proxy.add(WATCH, rejection, seconds=window)
        await faulted.proxy.cut()
        await faulted.create("a-1", cell="a")
        await faulted.store_equals_list(within=8.0, what="every cursor rejected")
        await asyncio.sleep(max(0.0, started + window - time.monotonic()))
        lists = consistent_lists(faulted.proxy.seen(since=started))
        watches = [r for r in faulted.proxy.seen(since=started) if r.is_watch]
    assert len(lists) <= 6, [round(r.at - started, 2) for r in lists]
    assert len(lists) >= 2, "no relist after the rejections"
    assert all(w.outcome.startswith("answered") for w in watches if w.at < started + window)
    assert lines_naming(caplog.records, str(rejection.status))


async def test_a_429_with_retry_after_is_honoured_and_keeps_the_cursor(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every WATCH answered 429 with `Retry-After: 5` for 12 s. Each retry waits at
    least the 5 s the server asked for (today: every `retry_delay`, 0.2 s), and a 429 keeps the
    cursor (client-go's `isWatchErrorRetriable`): no relist during the fault. Afterwards a pod
    created during the fault is served within 5 s + one step."""
    caplog.set_level(logging.WARNING, logger=_RUNTIME)
    async with faulted_cells(cached_kubeconfig, k8s_namespace, tmp_path) as faulted:
        await faulted.seed("a", "a-0")
        window = 12.0
        started = time.monotonic()
        faulted.proxy.add(WATCH, Respond(429, headers={"Retry-After": "5"}), seconds=window)
        await faulted.proxy.cut()
        await faulted.create("a-1", cell="a")
        await asyncio.sleep(window)
        await faulted.store_equals_list(within=6.0, what="after the 429s")
        seen = faulted.proxy.seen(since=started)
    throttled = [r.at for r in seen if r.is_watch and r.outcome == "answered 429"]
    assert len(throttled) >= 2
    gaps = [later - earlier for earlier, later in itertools.pairwise(throttled)]
    assert min(gaps) >= 4.9, f"retried before Retry-After: gaps {[round(g, 2) for g in gaps]}"
    assert consistent_lists([r for r in seen if r.at < started + window]) == []
    assert lines_naming(caplog.records, "429")


async def test_a_continue_token_that_keeps_expiring_falls_back_to_one_full_list(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """501 pods, so the LIST takes two pages of 500, and every continuation is
    answered 410 Expired. client-go's pager falls back to one full LIST (`FullListIfExpired`);
    the promise here: after two expired tokens in a row, one LIST without a limit. Bound: the loop
    syncs within 30 s with at most 3 first pages sent (today: the paged LIST restarts at once,
    forever, and `start()` never returns)."""
    caplog.set_level(logging.WARNING, logger=_RUNTIME)
    async with api_client(cached_kubeconfig) as api:
        core = client.CoreV1Api(api)
        gate = asyncio.Semaphore(16)

        async def one(index: int) -> None:
            async with gate:
                await create_pod(core, k8s_namespace, f"p-{index:03d}", cell="a")

        await asyncio.gather(*(one(i) for i in range(501)))
    started = time.monotonic()
    async with (
        asyncio.timeout(30),
        faulted_cells(
            cached_kubeconfig,
            k8s_namespace,
            tmp_path,
            before_start=lambda proxy: proxy.add(PAGED_LIST_CONTINUATION, Respond(410)),
        ) as faulted,
    ):
        await faulted.store_equals_list(within=5.0, what="synced despite expiring continuations")
        seen = faulted.proxy.seen(since=started)
    pages = [r for r in seen if not r.is_watch and "resourceVersion=" not in r.target]
    first_pages = consistent_lists(pages)
    expired = [r for r in pages if r.outcome == "answered 410"]
    assert expired, "the fault never met a continuation"
    assert len(first_pages) <= 3, [r.target for r in first_pages]
    assert "limit=" not in first_pages[-1].target, "the last LIST was not a full one"
    assert lines_naming(caplog.records, "410")


@pytest.mark.parametrize(
    "breakage", [CorruptChunk(), BlackHole()], ids=["chunk-broken-mid-frame", "dead-without-fin"]
)
async def test_a_stalled_watch_ends_within_the_read_idle_bound(
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
    breakage: CorruptChunk | BlackHole,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chunk carrying a DELETED is cut mid-frame by a chunk-size line that is not
    hex, or the connection dies there without a FIN; either way the TCP connection stays open
    and nothing more arrives. The watch must end within the read-idle deadline (3 s here) and
    re-watch from its cursor, so the store stops serving the deleted pod within 3 s + one backoff
    step + a re-watch: 6 s, with a log line (INFO suffices: on a cache-less apiserver an idle
    watch ends this way every read-idle period). Today the stream stalls until the client's total
    deadline, `timeout_seconds` + 10 s (70 s here; 310 s by default)."""
    caplog.set_level(logging.INFO, logger=_RUNTIME)
    async with faulted_cells(
        cached_kubeconfig, k8s_namespace, tmp_path, watch_idle_timeout=IDLE_TIMEOUT
    ) as faulted:
        await faulted.seed("a", "a-0", "a-1")
        fault = faulted.proxy.add(WATCH, breakage, count=1)
        began = time.time()
        await faulted.delete("a-0")
        await faulted.store_equals_list(within=IDLE_TIMEOUT + 3.0, what=breakage.describe())
    assert fault.applied == 1
    ended = [r for r in caplog.records if r.created >= began and r.levelno >= logging.INFO]
    assert ended, "the end of the stalled watch was not logged"


async def test_one_pod_whose_key_map_returns_an_unhashable_key_stalls_nothing(
    cached_kubeconfig: Path, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`key_map` returns a dict for one pod (unhashable, and not a collection of parent keys,
    which a key map may return). That pod alone is left out, with one error line naming it; the
    others are stored and `start()` returns (once, the store rejected the whole listing and
    `start()` never did). Bound: 10 s."""
    caplog.set_level(logging.WARNING, logger=_RUNTIME)

    def key_map(pod: Pod) -> str | None:
        if pod.metadata.name == "bad":
            return {"not": "hashable"}  # type: ignore[return-value]
        return cell_of(pod)

    async with api_client(cached_kubeconfig) as api:
        core = client.CoreV1Api(api)
        for name in ("good-0", "good-1", "bad"):
            await create_pod(core, k8s_namespace, name, cell="a")
        reflector = KubernetesReflector(
            kube_client=pod_api(core), namespace=k8s_namespace, label_selector=SELECTOR
        )
        reconciled: list[str] = []

        async def reconcile(parent: str) -> None:
            reconciled.append(parent)

        loop = ReconcileLoop(source=reflector.watch, reconcile=reconcile, key_map=key_map)
        async with asyncio.timeout(10), loop:
            members = {pod.metadata.name for pod in loop.get_by_parent("a")}
    assert members == {"good-0", "good-1"}
    assert lines_naming(caplog.records, "bad"), "no log line names the pod"
