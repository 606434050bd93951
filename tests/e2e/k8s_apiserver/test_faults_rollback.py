"""Layer: real apiserver (the cache-less kube-apiserver of a control plane of this module's own),
no kubelet; the loop's clients go through an `HttpFaultProxy`. etcd restored from an older
snapshot under a restarted apiserver, then written to, in each ordering of
the writes and the loop's reconnection, at watch timeouts of 10 s, 60 s and the default (300 s).

The plane is this module's own because a rollback leaves the watch cache of the session's cached
apiserver ahead of etcd. The loop watches the cache-less apiserver, which reads etcd directly.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import BinaryPaths, LocalControlPlane
from miles.utils.k8s_testenv.http_fault_proxy import BlackHole, Match
from miles.utils.k8s_testenv.testing.differential.oracle_client import OracleProcess
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from tests.e2e.k8s_apiserver.fault_harness import Faulted, Membership, faulted_cells
from tests.e2e.k8s_apiserver.harness import SELECTOR

pytestmark = pytest.mark.k8s_apiserver

ROLLBACK_BOUND = 20.0
"""The store equals a fresh LIST within this many seconds of the last write after the restore:
the watch ends when the apiserver stops, the probe right after it is refused, and the relist is
retried one backoff step (from 0.2 s) at a time until the apiserver is back."""
MIN_WRITES = 5
WATCH_TIMEOUTS = [
    10,
    60,
    inspect.signature(KubernetesReflector).parameters["watch_timeout_seconds"].default,
]
HIDDEN_RESTART_SETTLE = 5.0
"""Seconds both clients get, once the held connections are reset, to reconnect and catch up."""


@pytest.mark.parametrize("watch_timeout_seconds", WATCH_TIMEOUTS, ids=lambda t: f"watch-{t}s")
@pytest.mark.parametrize(
    "writes_after_reconnect", [False, True], ids=["written-at-once", "written-after-reconnect"]
)
async def test_etcd_restored_from_an_older_snapshot_converges(
    own_plane: LocalControlPlane,
    tmp_path: Path,
    writes_after_reconnect: bool,
    watch_timeout_seconds: int,
) -> None:
    """The documented restore procedure: every apiserver is stopped while etcd is restored, so
    the loop's watch ends and the reflector probes its cursor at once; the stopped apiserver does
    not answer the probe (through the proxy, a reset), so the reflector relists, however fast the
    writes pass the old cursor (written at once), and the relist meets the restored history
    (written after the loop reconnected). Promise: the store equals a fresh LIST within
    `ROLLBACK_BOUND` of the last write, at every watch timeout."""
    async with _restored(
        own_plane, tmp_path, watch_timeout_seconds=watch_timeout_seconds
    ) as restored:
        if writes_after_reconnect:
            await restored.faulted.store_equals_list(
                within=ROLLBACK_BOUND, what="reconnected to the restored etcd"
            )
        await restored.write_past_the_cursor()
        took = await restored.faulted.store_equals_list(
            within=ROLLBACK_BOUND, what="etcd restored and written"
        )
        relists = restored.faulted.cells.loop.status().source.relists
    print(f"k8s_apiserver: the store equalled a fresh LIST {took:.2f}s after the last write")
    assert relists == {"server was unreachable": 1}


@pytest.mark.parametrize("watch_timeout_seconds", WATCH_TIMEOUTS, ids=lambda t: f"watch-{t}s")
async def test_a_restore_behind_a_held_connection_is_seen_by_no_client(
    own_plane: LocalControlPlane,
    k8s_binaries: BinaryPaths,
    tmp_path: Path,
    watch_timeout_seconds: int,
) -> None:
    """The ordering no client can detect: a proxy holds every client connection open and silent
    (`BlackHole`) from before the apiserver stops until after the restored etcd has been written
    past the loop's cursor, then resets them. Neither client saw the server go: each reads a
    broken connection, re-watches from its cursor (ours after a probe the restored server
    accepts), and from then follows a history that is not the one it listed. What the loop does
    is what client-go does: both keep the erased pods (b-*) and miss the restored ones (a-0..a-2)
    and those written below the old cursor, until something else relists them. Promise (of the
    record, not of convergence): ours and client-go hold the same pods, and neither equals the
    fresh LIST."""
    async with _restored(
        own_plane,
        tmp_path,
        watch_timeout_seconds=watch_timeout_seconds,
        oracle_binary=k8s_binaries.oracle,
    ) as restored:
        await restored.write_past_the_cursor()
        restored.faulted.proxy.clear()
        await restored.faulted.proxy.reset_held()
        await asyncio.sleep(HIDDEN_RESTART_SETTLE)
        truth = await restored.faulted.fresh_list()
        ours = restored.faulted.store()
        assert restored.oracle is not None
        theirs = await restored.oracle.snapshot()
        probes = [p for p in restored.faulted.cells.api.probes if p.failure is None]
    print(
        f"k8s_apiserver: after a restore behind a held connection, ours serves ghosts "
        f"{sorted(set(ours) - set(truth))} and misses {sorted(set(truth) - set(ours))}; "
        f"client-go serves ghosts {sorted(set(theirs.pods) - set(truth))}"
    )
    assert set(ours) == set(theirs.pods)
    assert {f"b-{index}" for index in range(5)} <= set(ours) - set(truth)
    assert probes, "the loop never asked the restored server about its cursor"


@dataclass
class _Restored:
    """A loop (and, when asked, client-go's oracle) that followed cell a's and cell b's history
    on `plane`, whose etcd has been restored to a snapshot taken before cell b existed and three
    of cell a's pods were deleted."""

    plane: LocalControlPlane
    faulted: Faulted
    cursor_before: int
    oracle: OracleProcess | None

    async def write_past_the_cursor(self) -> int:
        """Creates pods c-0, c-1, ... (at least `MIN_WRITES`) until etcd's head passes the loop's
        cursor with other history: a watch from that cursor is accepted and shows only the
        writes after it. Returns how many."""
        created = 0
        while created < MIN_WRITES or self.plane.etcd_revision() <= self.cursor_before + 3:
            await self.faulted.create(f"c-{created}", cell="c")
            created += 1
        return created


@asynccontextmanager
async def _restored(
    plane: LocalControlPlane,
    tmp_path: Path,
    *,
    watch_timeout_seconds: int,
    oracle_binary: Path | None = None,
) -> AsyncIterator[_Restored]:
    """Cell a holds a-0..a-4 when the snapshot is taken; then b-0..b-4 are created and a-0..a-2
    deleted, and the store follows. The apiserver is stopped, etcd restored to the snapshot and
    the apiserver started again. With an oracle, every client connection is held open and silent
    through all of it (the proxy's `BlackHole`), and the caller releases them."""
    namespace = f"rollback-{uuid.uuid4().hex[:8]}"
    print(f"k8s_apiserver: ran on the cache-less kube-apiserver in {plane.work_dir}")
    async with (
        faulted_cells(
            plane.uncached_kubeconfig,
            namespace,
            tmp_path,
            create_namespace=True,
            watch_timeout_seconds=watch_timeout_seconds,
        ) as faulted,
        _oracle(faulted, oracle_binary, tmp_path) as oracle,
    ):
        for index in range(5):
            await faulted.create(f"a-{index}", cell="a")
        await faulted.store_equals_list(within=10.0, what="before the snapshot")
        snapshot = await asyncio.to_thread(plane.snapshot_etcd)
        await faulted.store_equals_list(within=10.0, what="after the snapshot")

        for index in range(5):
            await faulted.create(f"b-{index}", cell="b")
        for index in range(3):
            await faulted.delete(f"a-{index}")
        await faulted.store_equals_list(within=10.0, what="history the rollback will erase")
        if oracle is not None:
            await _oracle_holds(oracle, await faulted.fresh_list())
            faulted.proxy.add(Match(method=None), BlackHole())
        cursor_before = plane.etcd_revision()

        apiserver = plane.apiserver("uncached")
        await asyncio.to_thread(apiserver.stop)
        await asyncio.to_thread(plane.restore_etcd, snapshot)
        await asyncio.to_thread(apiserver.start)
        assert plane.etcd_revision() < cursor_before
        yield _Restored(plane, faulted, cursor_before, oracle)


@asynccontextmanager
async def _oracle(
    faulted: Faulted, binary: Path | None, tmp_path: Path
) -> AsyncIterator[OracleProcess | None]:
    if binary is None:
        yield None
        return
    proxied = faulted.proxy.write_kubeconfig(tmp_path / "oracle.kubeconfig")
    async with OracleProcess(
        binary=binary,
        kubeconfig=proxied,
        namespace=faulted.namespace,
        selector=SELECTOR,
        log_path=tmp_path / "oracle.log",
    ) as oracle:
        yield oracle


async def _oracle_holds(oracle: OracleProcess, truth: Membership, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while True:
            if set((await oracle.snapshot()).pods) == set(truth):
                return
            await asyncio.sleep(0.1)
