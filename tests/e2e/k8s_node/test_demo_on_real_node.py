"""`miles-reconcile demo --short` on the real node (here, not in k8s_kind, whose own node would hold
the machine): it says it runs on the real node, its story has a real crash loop and a real graceful
delete, the verdict matches, and the host is as it was afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import EnvSettings
from miles.utils.k8s_testenv.host_state import HostSnapshot
from miles.utils.k8s_testenv.real_node import real_node_unavailable

pytestmark = pytest.mark.k8s_kind

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_demo_runs_on_the_real_node_with_a_crash_loop_and_a_graceful_delete(
    k8s_settings: EnvSettings,
) -> None:
    if (reason := real_node_unavailable(k8s_settings.node)) is not None:
        if k8s_settings.require:
            pytest.fail(f"{reason}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
        pytest.skip(reason)
    before = HostSnapshot.take()
    result = subprocess.run(
        [sys.executable, "-m", "miles.utils.workers.reconcile", "demo", "--short"],
        capture_output=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
        timeout=600,
        check=False,
    )
    stdout, stderr = result.stdout.decode(), result.stderr.decode()
    output = f"stdout (tail):\n{stdout[-3000:]}\nstderr (tail):\n{stderr[-3000:]}"
    assert "kubelet: the real node" in stderr, output
    assert "a real crash loop: CrashLoopBackOff" in stdout, output
    assert "gets SIGTERM and exits" in stdout, output
    verdicts = [line for line in stdout.splitlines() if line.startswith("verdict:")]
    assert verdicts, output
    assert verdicts[-1].startswith("verdict: match"), output
    assert result.returncode == 0, output
    assert "Traceback" not in stderr
    assert before.differences() == []
    assert real_node_unavailable() is None, "the demo's node still holds the machine"
