"""Layer: real apiserver (the cache-less kube-apiserver of a control plane of this module's own),
no kubelet; the loop's clients go through an `HttpFaultProxy`. etcd restored from an older
snapshot under the running apiserver (not restarted, against Kubernetes' advice to restart every
apiserver after a restore): a snapshot, 5 pods (b-*) the restore erases, the restore, then 12
pods (c-*), at watch timeouts of 5 s and 60 s, with and without the opt-in consistency check.

The uncached apiserver reads etcd: a LIST or probe at the loop's cursor is answered 504 "Too large
resource version: C, current: R" until new writes carry etcd past the cursor; from then on nothing
a client asks can tell. Its open watch outlives the restore (etcd's client resumes it from the
cursor), so the c-* pods written at revisions at or below the cursor are never delivered and the
b-* pods are never deleted. The watch-cache apiserver is worse and no client can mend it: its
cache stays ahead of etcd and answers even a consistent LIST with the ghosts
(`test_the_watch_cache_keeps_the_ghosts_for_every_client`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import LocalControlPlane
from tests.e2e.k8s_apiserver.fault_harness import Faulted, Membership, faulted_cells

pytestmark = pytest.mark.k8s_apiserver

ERASED = 5
WRITTEN_AFTER = 12
CHECK_PERIOD = 30.0
"""Longer than the snapshot, the restore and the writes take, so that the first check falls after
the writes have carried etcd past the loop's cursor: the ordering nothing else detects."""
CHECK_BOUND = CHECK_PERIOD + 10.0
"""With the check, the store equals a fresh LIST within this many seconds of the last write: the
watch is asked to close when the check falls due (at most `CHECK_PERIOD` after the last listing),
then one LIST; the rest is slack for a loaded machine."""
DELIVERED = 1.0
"""Seconds a live watch gets to deliver the writes before what it lost is read."""
SETTLE = 12.0
"""Seconds after the last write before what is lost without the check is measured: two 5 s
watches end and are probed in that time."""


@dataclass(frozen=True)
class _Lost:
    ghosts: list[str]
    missed: list[str]

    @classmethod
    def between(cls, store: Membership, truth: Membership) -> _Lost:
        return cls(sorted(set(store) - set(truth)), sorted(set(truth) - set(store)))


async def _restore_under_the_running_apiserver(plane: LocalControlPlane, faulted: Faulted) -> None:
    """The held-out case: snapshot, `ERASED` pods, etcd restored (the apiservers keep running),
    `WRITTEN_AFTER` pods."""
    await faulted.store_equals_list(within=10.0, what="before the snapshot")
    snapshot = await asyncio.to_thread(plane.snapshot_etcd)
    for index in range(ERASED):
        await faulted.create(f"b-{index}", cell="b")
    await faulted.store_equals_list(within=10.0, what="history the restore will erase")
    cursor = plane.etcd_revision()
    await asyncio.to_thread(plane.restore_etcd, snapshot)
    print(f"k8s_apiserver: etcd restored from revision {cursor} to {plane.etcd_revision()}")
    for index in range(WRITTEN_AFTER):
        await faulted.create(f"c-{index}", cell="c")


@asynccontextmanager
async def _restored_uncached(
    plane: LocalControlPlane,
    tmp_path: Path,
    watch_timeout_seconds: int,
    *,
    consistency_check_period: float | None = None,
) -> AsyncIterator[Faulted]:
    """A loop on the cache-less apiserver, in a namespace of its own, once etcd is restored."""
    namespace = f"restore-{uuid.uuid4().hex[:8]}"
    print(f"k8s_apiserver: ran on the cache-less kube-apiserver in {plane.work_dir}")
    async with faulted_cells(
        plane.uncached_kubeconfig,
        namespace,
        tmp_path,
        create_namespace=True,
        watch_timeout_seconds=watch_timeout_seconds,
        consistency_check_period=consistency_check_period,
    ) as faulted:
        await _restore_under_the_running_apiserver(plane, faulted)
        yield faulted


@pytest.mark.parametrize("watch_timeout_seconds", [5, 60], ids=lambda t: f"watch-{t}s")
async def test_the_consistency_check_bounds_what_a_restore_under_the_apiserver_loses(
    own_plane: LocalControlPlane, tmp_path: Path, watch_timeout_seconds: int
) -> None:
    """Promise (beyond client-go, record row "consistency check"): with
    `consistency_check_period=CHECK_PERIOD`, 0 ghosts and 0 missed pods within `CHECK_BOUND` of
    the last write, at either watch timeout, whether or not a probe met the too-large cursor
    first."""
    async with _restored_uncached(
        own_plane, tmp_path, watch_timeout_seconds, consistency_check_period=CHECK_PERIOD
    ) as faulted:
        await asyncio.sleep(DELIVERED)
        before = _Lost.between(faulted.store(), await faulted.fresh_list())
        took = DELIVERED + await faulted.store_equals_list(
            within=CHECK_BOUND, what="etcd restored, checked"
        )
        relists = faulted.cells.loop.status().source.relists
    print(
        f"k8s_apiserver: watch {watch_timeout_seconds}s, check {CHECK_PERIOD}s: after the writes "
        f"{len(before.ghosts)} ghosts {before.ghosts}, {len(before.missed)} missed "
        f"{before.missed}; 0 ghosts, 0 missed {took:.2f}s after the last write; relists {relists}"
    )
    assert relists.keys() & {"consistency check", "cursor too large"}
    if watch_timeout_seconds > CHECK_PERIOD:
        assert before.ghosts, "no request reached the server before the check, yet nothing lost"
        assert relists == {"consistency check": 1}


@pytest.mark.parametrize("watch_timeout_seconds", [5, 60], ids=lambda t: f"watch-{t}s")
async def test_without_the_check_only_a_probe_before_the_writes_pass_the_cursor_mends_it(
    own_plane: LocalControlPlane, tmp_path: Path, watch_timeout_seconds: int
) -> None:
    """The documented behaviour without the opt-in: the loop relists (reason "cursor too large")
    only when a probe or LIST reaches the server while its revision is still below the cursor;
    otherwise, `SETTLE` seconds after the last write, the store keeps the erased b-* pods as
    ghosts and misses the c-* pods written at revisions at or below its cursor, as client-go's
    informer does. Promise: either the store equals a fresh LIST after a "cursor too large"
    relist, or what it lost is exactly of that shape."""
    async with _restored_uncached(own_plane, tmp_path, watch_timeout_seconds) as faulted:
        await asyncio.sleep(SETTLE)
        lost = _Lost.between(faulted.store(), await faulted.fresh_list())
        relists = faulted.cells.loop.status().source.relists
    print(
        f"k8s_apiserver: watch {watch_timeout_seconds}s, no check: {len(lost.ghosts)} ghosts "
        f"{lost.ghosts}, {len(lost.missed)} missed {lost.missed}; relists {relists}"
    )
    if "cursor too large" in relists:
        assert lost == _Lost([], [])
        return
    assert lost.ghosts == [f"b-{index}" for index in range(ERASED)]
    assert lost.missed, "the restore erased history the writes re-used, yet nothing was missed"
    assert all(name.startswith("c-") for name in lost.missed)


async def test_the_watch_cache_keeps_the_ghosts_for_every_client(
    own_plane: LocalControlPlane, tmp_path: Path
) -> None:
    """Measured, recorded: the watch-cache apiserver's cache stays ahead of the restored etcd and
    serves a consistent LIST (resourceVersion unset) from it, so its fresh LIST itself holds the
    ghosts and lacks the pods written at or below the cache's revision; neither the probe nor the
    consistency check can mend a client of it, only restarting that apiserver. Promise: ours,
    with the check, equals the cached apiserver's LIST, which differs from etcd's (the cache-less
    apiserver's) by the erased pods."""
    namespace = f"restore-{uuid.uuid4().hex[:8]}"
    print(f"k8s_apiserver: ran on the watch-cache kube-apiserver in {own_plane.work_dir}")
    (tmp_path / "etcd").mkdir()
    async with (
        faulted_cells(
            own_plane.cached_kubeconfig,
            namespace,
            tmp_path,
            create_namespace=True,
            watch_timeout_seconds=5,
            consistency_check_period=CHECK_PERIOD,
        ) as faulted,
        faulted_cells(own_plane.uncached_kubeconfig, namespace, tmp_path / "etcd") as etcd_view,
    ):
        await _restore_under_the_running_apiserver(own_plane, faulted)
        started = time.monotonic()
        await faulted.store_equals_list(within=CHECK_BOUND, what="the cached apiserver's view")
        cached = _Lost.between(await faulted.fresh_list(), await etcd_view.fresh_list())
    print(
        f"k8s_apiserver: watch cache after the restore, {time.monotonic() - started:.2f}s: "
        f"ghosts {cached.ghosts}, missed {cached.missed}"
    )
    assert cached.ghosts == [f"b-{index}" for index in range(ERASED)]
