"""Layer k8s_apiserver: leader election, ours against client-go's (`tools/k8s/leader-candidate`),
on one Lease of the real kube-apiserver (the cached one), each candidate behind its own TCP proxy.

A minute of faults on the holder (SIGKILL, SIGSTOP past the takeover bound, an apiserver cut as
long, SIGTERM), with short durations (LeaseDuration 4 s, RenewDeadline 3 s, RetryPeriod 1 s) so
that each kind happens at least once; `bench/leader_interop.py` is the five-minute run with
client-go's defaults. Until ours is importable the candidates are client-go's only.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import EnvSettings, PrerequisiteError
from miles.utils.k8s_testenv.binaries import ensure_tool_binary
from miles.utils.k8s_testenv.testing.leader_interop.analysis import ACTING_MAX_GAP, analyse
from miles.utils.k8s_testenv.testing.leader_interop.candidates import ours_available
from miles.utils.k8s_testenv.testing.leader_interop.harness import (
    FAULT_KINDS,
    InteropConfig,
    InteropRun,
    LeaderInterop,
)
from miles.utils.k8s_testenv.testing.leader_interop.records import Side, Timing, side_of
from miles.utils.k8s_testenv.testing.leader_interop.report import render

TIMING = Timing(lease_duration=4, renew_deadline=3, retry_period=1)


@pytest.fixture(scope="module")
def go_candidate(k8s_settings: EnvSettings) -> Path:
    try:
        return ensure_tool_binary("leader-candidate", settings=k8s_settings)
    except PrerequisiteError as err:
        if k8s_settings.require:
            pytest.fail(str(err))
        pytest.skip(str(err))


async def _run(config: InteropConfig) -> InteropRun:
    async with LeaderInterop(config) as interop:
        return await interop.run()


def test_at_most_one_leader_acts_and_takeovers_keep_their_bounds(
    cached_kubeconfig: Path, k8s_namespace: str, go_candidate: Path, tmp_path: Path
) -> None:
    sides: tuple[Side, ...] = ("ours", "go", "ours", "go") if ours_available() else ("go",) * 3
    run = asyncio.run(
        _run(
            InteropConfig(
                kubeconfig=cached_kubeconfig,
                namespace=k8s_namespace,
                go_binary=go_candidate,
                work_dir=tmp_path,
                sides=sides,
                timing=TIMING,
                duration=60.0,
            )
        )
    )
    report = analyse(run.lines, run.records, run.faults, run.timing, run.until)
    summary = render(run, report)
    print(summary)
    run.write(tmp_path / "run.json")

    assert run.problems == (), summary
    assert {f.kind for f in run.faults if f.holder} == set(FAULT_KINDS), summary
    assert report.missing == (), summary
    assert all(code == 0 for _, code in run.term_exits), summary
    assert report.failures("ours") == [], summary
    assert report.early == (), summary
    assert all(t.latency <= t.bound for t in report.takeovers), summary
    for acted in report.acted_on:
        if side_of(acted.target) == "ours":
            limit = TIMING.renew_deadline + ACTING_MAX_GAP if acted.fault == "cut" else 0.0
            assert acted.seconds <= limit, summary
    # client-go does not fence: a candidate acts on after a SIGSTOP (a fresh RenewDeadline once it
    # resumes) or a cut (RenewDeadline, then release()'s own, before Run cancels the context).
    for overlap in report.overlaps:
        for offender in overlap.offenders:
            assert side_of(offender) == "go", summary
            assert any(
                f.target == offender
                and f.kind in ("stop", "cut")
                and f.start <= overlap.start <= f.end + 2 * TIMING.renew_deadline + 1
                for f in run.faults
            ), summary
