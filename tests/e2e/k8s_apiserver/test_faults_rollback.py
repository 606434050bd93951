"""Layer: real apiserver (the cache-less kube-apiserver of a control plane of this module's own),
no kubelet, no proxy. etcd restored from an older snapshot and written to at once (issue 16 #9).

The plane is this module's own because a rollback leaves the watch cache of the session's cached
apiserver ahead of etcd. The loop watches the cache-less apiserver, which reads etcd directly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import BinaryPaths, EnvSettings, LocalControlPlane
from tests.e2e.k8s_apiserver.fault_harness import faulted_cells

pytestmark = pytest.mark.k8s_apiserver

ROLLBACK_BOUND = 20.0
"""The store equals a fresh LIST within this many seconds of the last write after the restore:
the watch ends when the apiserver stops, the probe right after it is refused, and the relist is
retried one backoff step (from 0.2 s) at a time until the apiserver is back."""
MIN_WRITES = 5


@pytest.fixture(scope="module")
def rollback_plane(
    k8s_settings: EnvSettings, request: pytest.FixtureRequest
) -> Iterator[LocalControlPlane]:
    if k8s_settings.kubeconfig is not None:
        pytest.skip("restoring etcd needs the local control plane's own etcd")
    binaries: BinaryPaths = request.getfixturevalue("k8s_binaries")
    with LocalControlPlane(binaries=binaries, settings=k8s_settings, keep=False) as plane:
        yield plane


async def test_etcd_restored_from_an_older_snapshot_and_written_at_once_converges(
    rollback_plane: LocalControlPlane, tmp_path: Path
) -> None:
    """The documented restore procedure: every apiserver is stopped while etcd is restored, so
    the loop's watch ends and the reflector probes its cursor at once; the stopped apiserver
    refuses the probe, so the reflector relists however fast the writes pass the old cursor
    (they used to win that race now and then). See `_rollback_written_at_once` for the scenario
    and the promise."""
    took = await _rollback_written_at_once(rollback_plane, tmp_path, stop_apiserver=True)
    print(f"k8s_apiserver: the store equalled a fresh LIST {took:.2f}s after the last write")


async def _rollback_written_at_once(
    plane: LocalControlPlane, tmp_path: Path, *, stop_apiserver: bool
) -> float:
    """Cell a holds a-0..a-4 when the snapshot is taken; then b-0..b-4 are created and a-0..a-2
    deleted, and the store follows. etcd is restored to the snapshot and at once pods c-0, c-1, ...
    are created (at least `MIN_WRITES`) until etcd's head passes the loop's cursor with other
    history: a watch from that cursor is accepted and shows only the writes after it. Promise: the
    store equals a fresh LIST within `ROLLBACK_BOUND` (no ghost b-*, a-0..a-2 back, every c-*
    there); returns how long it took. The issue measured 5 ghosts and 5 missing pods for the code
    that re-watched from the old cursor."""
    namespace = f"rollback-{uuid.uuid4().hex[:8]}"
    print(f"k8s_apiserver: ran on the cache-less kube-apiserver in {plane.work_dir}")
    async with faulted_cells(
        plane.uncached_kubeconfig, namespace, tmp_path, create_namespace=True
    ) as faulted:
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
        cursor_before = plane.etcd_revision()

        apiserver = plane.apiserver("uncached")
        if stop_apiserver:
            await asyncio.to_thread(apiserver.stop)
        await asyncio.to_thread(plane.restore_etcd, snapshot)
        if stop_apiserver:
            await asyncio.to_thread(apiserver.start)
        assert plane.etcd_revision() < cursor_before
        created = 0
        while created < MIN_WRITES or plane.etcd_revision() <= cursor_before + 3:
            await faulted.create(f"c-{created}", cell="c")
            created += 1
        return await faulted.store_equals_list(
            within=ROLLBACK_BOUND, what="etcd restored and written at once"
        )
