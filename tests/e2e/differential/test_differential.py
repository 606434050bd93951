"""Our reflector and store against client-go's, over a real control plane.

Layer: k8s_apiserver (differential). Every test owns a fresh namespace on the module's own control
plane (etcd, a cached and a cache-less kube-apiserver, KWOK, and the real node where it can run:
each run prints which); both clients watch the cache-less one through a `TcpProxy` and an
`HttpFaultProxy`. The scenario is seeded (MILES_DIFF_SEED, default 1) and bounded: it runs every
operation and every fault once, the kubelet churn of engine pods on the real node included, with
both clients listing by LIST and then both streaming their lists (WatchList), in about two to
four minutes each on two cores.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import pytest

from miles.utils.k8s_testenv.testing.differential.config import HarnessConfig
from miles.utils.k8s_testenv.testing.differential.environment import DifferentialEnvironment
from miles.utils.k8s_testenv.testing.differential.errors import HarnessAborted
from miles.utils.k8s_testenv.testing.differential.harness import DifferentialHarness
from miles.utils.k8s_testenv.testing.differential.lifecycle import logs_to
from miles.utils.k8s_testenv.testing.differential.oracle_client import process_gone
from miles.utils.k8s_testenv.testing.differential.pool_writer import PoolOp
from miles.utils.k8s_testenv.testing.differential.scenario import (
    KUBELET_CHURN,
    FaultKind,
    OpKind,
    ci_plan,
)

_AGREED_KUBELET_STATES = ("restarted-with-exit-code", "not-ready", "gone", "recreated-new-uid")
"""The churn's states that last until the next write, so a checkpoint always settles on them;
CrashLoopBackOff (at most 5 s here) and a terminating pod (its 3 s SIGTERM handler) are counted
when a checkpoint caught them, not required."""
_EVERY_REQUEST = 1_000_000
"""Enough for every request of a CI run: client-go with WatchList on asks for thousands of
watch-list streams while every watch is rejected."""


def _to_terminal(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)


def _harness(
    env: DifferentialEnvironment, seed: int, work_dir: Path, *, watch_list: bool = False
) -> DifferentialHarness:
    config = HarnessConfig(
        seed=seed,
        oracle_watch_list=watch_list,
        streaming_list=watch_list,
        proxy_history=_EVERY_REQUEST,
    )
    return DifferentialHarness.on(env, config=config, log=_to_terminal, work_dir=work_dir)


def _streamed_its_lists(harness: DifferentialHarness, user_agent: str) -> bool:
    """Whether the client whose user agent starts so synced by streaming lists
    (`sendInitialEvents=true`), rather than by LIST. Go names its user agent after the binary
    (`oracle/`), `kubernetes_asyncio` after its generator (`OpenAPI-Generator/`)."""
    requests = harness.http_proxy.seen(lambda r: r.user_agent.startswith(user_agent))
    assert requests, f"no request of {user_agent}* went through the HTTP proxy"
    return any("sendinitialevents=true" in r.target.lower() for r in requests)


@pytest.mark.parametrize("watch_list", [False, True], ids=["list", "streaming-list"])
async def test_seeded_scenario_agrees_with_client_go_after_every_step(
    differential_env: DifferentialEnvironment,
    differential_seed: int,
    tmp_path: Path,
    watch_list: bool,
) -> None:
    """Every operation and fault of the plan, then a checkpoint: our store equals a fresh LIST
    (minus the parent-less pods our store evicts by design) and so does client-go's, for pods and
    for engine pools (a custom resource: ours a second source of the same loop decoding
    `DynamicObject`, client-go's dynamic informer in a second oracle), written beside every pod
    operation (spec, status subresource, parent and selector label moves, deletes), and the
    compaction fault is a real 410 that makes both relist. Run with both clients listing by LIST,
    and with both streaming their lists (client-go's WatchListClient, its default since v0.35, and
    our `streaming_list`); the proxy's log shows which protocol each spoke. On the real node the
    engine pods' crashes, readiness flips, graceful deletes and recreations are among the steps,
    and every view agrees on each state the kubelet wrote; without one they are skipped, saying
    why."""
    plan = ci_plan(random.Random(differential_seed))
    with logs_to(tmp_path / "runtime.log"):
        async with _harness(
            differential_env, differential_seed, tmp_path, watch_list=watch_list
        ) as harness:
            try:
                stats = await harness.run(plan)
            finally:
                _to_terminal(harness.stats.report())
            oracle_pid = harness.oracle.pid
            pool_oracle = harness.pool_oracle
            pool_oracle_pid = None if pool_oracle is None else pool_oracle.pid
            assert _streamed_its_lists(harness, "oracle/") is watch_list
            assert _streamed_its_lists(harness, "OpenAPI-Generator/") is watch_list
    assert stats.divergences == 0
    assert stats.checkpoints >= len(plan) - len(stats.skipped)
    assert stats.pool_checkpoints == stats.checkpoints
    assert {PoolOp.CREATE, PoolOp.SPEC, PoolOp.STATUS, PoolOp.DELETE} <= set(stats.pool_ops)
    injected = set(stats.faults)
    for fault in FaultKind:
        assert fault in injected or fault.value in stats.skipped, f"{fault} neither ran nor skipped"
    for op in OpKind:
        assert op in stats.ops or op.value in stats.skipped, f"{op} neither ran nor skipped"
    if differential_env.real_node is not None:
        assert set(stats.ops) >= KUBELET_CHURN, stats.report()
        for state in _AGREED_KUBELET_STATES:
            assert stats.kubelet[state] >= 1, f"no checkpoint agreed on {state}: {stats.report()}"
    else:
        for op in KUBELET_CHURN:
            assert stats.skipped[op.value] == differential_env.real_node_unavailable
    if FaultKind.COMPACT_410 in injected:
        assert stats.our_relists[FaultKind.COMPACT_410] >= 1
        assert stats.oracle_relists[FaultKind.COMPACT_410] >= 1
    assert oracle_pid is not None
    assert process_gone(oracle_pid)
    assert pool_oracle_pid is not None
    assert process_gone(pool_oracle_pid)


async def test_oracle_dying_mid_run_aborts_the_comparison_naming_its_exit_code(
    differential_env: DifferentialEnvironment, tmp_path: Path
) -> None:
    """Bad input: the oracle killed mid-run ends the run with a clear message, never a pass, and
    leaves no process behind."""
    async with _harness(differential_env, 7, tmp_path) as harness:
        await harness.run_step(OpKind.CREATE, label="before the kill")
        pid = harness.oracle.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(HarnessAborted, match=r"oracle died.*exited with code -9"):
            await harness.run_step(OpKind.RELABEL, label="after the kill")
    assert process_gone(pid)


async def test_proxy_dying_mid_run_aborts_the_comparison(
    differential_env: DifferentialEnvironment, tmp_path: Path
) -> None:
    """Bad input: the TCP proxy dying mid-run ends the run with a clear message, never a pass."""
    async with _harness(differential_env, 8, tmp_path) as harness:
        await harness.run_step(OpKind.CREATE, label="before the kill")
        pid = harness.oracle.pid
        harness.proxy.kill()
        with pytest.raises(HarnessAborted, match="TCP proxy died"):
            await harness.run_step(OpKind.MOVE, label="after the kill")
    assert pid is not None
    assert process_gone(pid)
