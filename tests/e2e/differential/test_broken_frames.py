"""Malformed frames against client-go: the frame of one write broken on its way to both clients.

Layer: k8s_apiserver (differential), on the module's own control plane (etcd, a cached and a
cache-less kube-apiserver, KWOK; the real node only if it runs here, and it plays no part). Both
clients watch the cache-less apiserver through the harness's `TcpProxy` and `HttpFaultProxy`; the
proxy breaks the MODIFIED frame of one label write to a pod both stores hold, and of one to an
engine pool they hold, once on each client's watch of that kind (told apart by User-Agent): a
frame without a name, a frame whose JSON is cut inside the name, or its chunk's framing broken.
Each fault runs on a fresh harness, so our reflector's backoff is at its first step, and each
client's time is from the write until its stores equal a fresh LIST for good (`Checkpoints`,
polled every 0.1 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from miles.utils.k8s_testenv.testing.differential.config import HarnessConfig
from miles.utils.k8s_testenv.testing.differential.environment import DifferentialEnvironment
from miles.utils.k8s_testenv.testing.differential.harness import DifferentialHarness
from miles.utils.k8s_testenv.testing.differential.lifecycle import logs_to
from miles.utils.k8s_testenv.testing.differential.ours import RETRY_DELAY
from miles.utils.k8s_testenv.testing.differential.scenario import BROKEN_FRAMES, FaultKind, OpKind

ONE_STEP = 2 * RETRY_DELAY
"""The longest first backoff step of our reflector (jitter 1.0)."""
SLACK = 2.0
"""What the relist (or the re-watch), the loop's apply and the harness's poll (a fresh LIST, both
stores read, 0.1 s apart) may take on top of the step, on two shared cores; as in
tests/e2e/k8s_apiserver/test_faults_frames.py."""
OUR_RELISTS = {
    FaultKind.FRAME_WITHOUT_NAME: 1,
    FaultKind.FRAME_CUT: 1,
    FaultKind.FRAME_CHUNK_CORRUPT: 0,
}
"""An unreadable frame ends our watch and relists; a broken chunk fails the read and ours
re-watches from its cursor, since every frame before the break was whole."""


def _to_terminal(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)


@pytest.mark.parametrize("fault", sorted(BROKEN_FRAMES), ids=lambda fault: fault.value)
async def test_a_broken_frame_converges_ours_within_one_backoff_step_beside_client_go(
    fault: FaultKind,
    differential_env: DifferentialEnvironment,
    differential_seed: int,
    tmp_path: Path,
) -> None:
    """Ours equals a fresh LIST within one backoff step (plus `SLACK`) of the write whose frame
    was broken, relisting once for an unreadable frame and never for a broken chunk. client-go
    must converge too after a cut frame or a broken chunk (its decoder's error ends the watch);
    after a frame without a name it is allowed only the ghosts Go's semantics predict, one in
    each of its stores (the pod's, and the pool's, new state under the key '<namespace>/', the
    object stale), which the harness reports and heals by restarting it. Both times are
    printed."""
    env = differential_env
    with logs_to(tmp_path / "runtime.log"):
        async with DifferentialHarness(
            plane=env.plane,
            oracle_binary=env.oracle_binary,
            work_dir=tmp_path,
            config=HarnessConfig(seed=differential_seed),
            kwok=env.kwok,
            kwok_unavailable=env.kwok_unavailable,
            log=_to_terminal,
        ) as harness:
            await harness.run_step(OpKind.CREATE, label="before the fault")
            await harness.run_step(fault, label="the fault")
            await harness.run_step(OpKind.RELABEL, label="after the fault")
    stats = harness.stats
    [took] = stats.convergence[fault]
    client_go = "never" if took.client_go is None else f"{took.client_go:.2f}s"
    print(
        f"{fault.value}: ours {took.ours:.2f}s ({stats.our_relists[fault]} relist), "
        f"client-go {client_go} ({stats.oracle_relists[fault]} relist)"
        + (f": {took.client_go_diverged}" if took.client_go_diverged else "")
    )
    assert stats.divergences == 0
    assert took.ours <= ONE_STEP + SLACK, stats.report()
    assert stats.our_relists[fault] == OUR_RELISTS[fault], stats.report()
    if fault is FaultKind.FRAME_WITHOUT_NAME:
        assert stats.client_go_diverged[fault] == (took.client_go is None)
        assert took.client_go_diverged is None or "(engine pools)" in took.client_go_diverged
    else:
        assert took.client_go is not None, stats.report()
