"""Layer: real apiserver, both kube-apiservers (watch cache on and off), no kubelet; the loop's
clients go through an `HttpFaultProxy`. A watch whose connection goes silent while it stays open
(a NAT or conntrack entry expired under it), played by the proxy's `freeze`: the open
watch gets nothing more, new connections are served.

client-go's HTTP/2 health check ends such a connection 45 s after its last byte (30 s read-idle,
15 s ping). Ours, over HTTP/1.1, asks the apiserver on another connection after 30 s of silence
whether the watch missed an event (`k8s_watch_health`), and keeps an idle watch that missed
nothing instead of re-opening it.

Every test runs `Cells` with `retry_delay=0.2`, `watch_timeout_seconds=300` and the transport's
defaults (`watch_probe_after=30`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from miles.utils.k8s_testenv.http_fault_proxy import WATCH, HttpFaultProxy, Seen
from tests.e2e.k8s_apiserver.fault_harness import faulted_cells

pytestmark = pytest.mark.k8s_apiserver

DETECTION_BOUND = 45.0
"""Seconds from a frozen watch's last byte to its end: client-go's 30 s read-idle + 15 s ping."""
IDLE_SECONDS = 100.0
"""How long an idle watch on the cache-less apiserver is watched for re-opening: past the 90 s
read-idle deadline that used to re-open it."""
WATCH_TIMEOUT = 300
_RUNTIME = "miles.utils.workers.reconcile"


def _probe(seen: Seen) -> bool:
    return seen.is_watch and "timeoutSeconds=1&" in seen.target + "&"


def _rewatch(seen: Seen) -> bool:
    return seen.is_watch and not _probe(seen) and seen.outcome == "forwarded"


async def _frozen(proxy: HttpFaultProxy) -> float:
    """Freezes the loop's open watch; its last byte's time (`time.monotonic()`)."""
    last_bytes: list[float] = []
    deadline = time.monotonic() + 10.0
    while not last_bytes and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        last_bytes = await proxy.freeze(WATCH)
    assert len(last_bytes) == 1, f"{len(last_bytes)} open watches frozen"
    return last_bytes[0]


@pytest.mark.parametrize("apiserver", ["cached", "uncached"])
async def test_a_frozen_watch_is_found_dead_within_45s_of_its_last_byte(
    apiserver: str,
    request: pytest.FixtureRequest,
    k8s_namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The open watch is frozen, then a pod is deleted. Promise: the watch ends and is re-opened
    within `DETECTION_BOUND` of its last byte, the store equals a fresh LIST again (no ghost), and
    its end is one WARNING line naming the stalled watch; no relist."""
    caplog.set_level(logging.INFO, logger=_RUNTIME)
    kubeconfig: Path = request.getfixturevalue(f"{apiserver}_kubeconfig")
    async with faulted_cells(
        kubeconfig, k8s_namespace, tmp_path, watch_timeout_seconds=WATCH_TIMEOUT
    ) as faulted:
        await faulted.seed("a", "a-0", "a-1")
        last_byte = await _frozen(faulted.proxy)
        await faulted.delete("a-0")
        await faulted.store_equals_list(within=DETECTION_BOUND + 10.0, what="a frozen watch")
        rewatches = faulted.proxy.seen(_rewatch, since=last_byte)
        listings = faulted.cells.loop.status().source.lists
    detected = rewatches[0].at - last_byte
    print(
        f"k8s_apiserver: {apiserver} kube-apiserver behind the HTTP fault proxy: the frozen watch "
        f"was re-opened {detected:.1f}s after its last byte"
    )
    assert detected <= DETECTION_BOUND
    stalled = [r for r in caplog.records if "delivered nothing" in r.getMessage()]
    assert [r.levelno for r in stalled] == [logging.WARNING]
    assert listings == 1, "the dead watch cost a relist"


async def test_an_idle_watch_on_the_cache_less_apiserver_is_kept(
    uncached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """No change to the selector for `IDLE_SECONDS`, on the apiserver that sends no bookmarks.
    Promise: the watch is never re-opened (it was every 90 s), no LIST is made, and it is probed
    at most once per 15 s of silence after the first 30 s."""
    async with faulted_cells(
        uncached_kubeconfig, k8s_namespace, tmp_path, watch_timeout_seconds=WATCH_TIMEOUT
    ) as faulted:
        await faulted.seed("a", "a-0")
        began = time.monotonic()
        await asyncio.sleep(IDLE_SECONDS)
        seen = faulted.proxy.seen(since=began)
        await faulted.store_equals_list(within=5.0, what="an idle watch")
    probes = [s for s in seen if _probe(s)]
    print(
        f"k8s_apiserver: uncached kube-apiserver behind the HTTP fault proxy: an idle watch over "
        f"{IDLE_SECONDS:.0f}s drew {len(probes)} probes and no re-watch"
    )
    assert [s for s in seen if _rewatch(s)] == []
    assert [s for s in seen if not s.is_watch] == []
    assert 1 <= len(probes) <= 1 + (IDLE_SECONDS - 30.0) // 15.0
