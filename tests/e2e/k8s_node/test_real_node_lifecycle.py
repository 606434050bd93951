"""Real node start and teardown on this host (tests/e2e/k8s_node, after the kubelet layer's own
node is gone): teardown leaves no process, mount, cgroup, network link or nftables table and puts
back every sysctl; a second node is refused in one line; a start that fails, and a node whose
owner was killed, are cleaned up. Skips (fails under MILES_K8S_REQUIRE) without root or packages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import (
    BinaryPaths,
    ComponentStartError,
    EnvSettings,
    LocalControlPlane,
    NodeBinaryPaths,
    PrerequisiteError,
    RealNode,
    ensure_node_binaries,
)
from miles.utils.k8s_testenv.host_state import HostSnapshot, read_sysctl
from miles.utils.k8s_testenv.kwok import ApiAccess
from miles.utils.k8s_testenv.node_lock import NodeRecord
from miles.utils.k8s_testenv.real_node import check_prerequisites

pytestmark = pytest.mark.k8s_kind

REPO_ROOT = Path(__file__).resolve().parents[3]
CHANGED_SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "net.ipv4.ip_forward",
)


@pytest.fixture(scope="module")
def node_binaries(k8s_settings: EnvSettings) -> NodeBinaryPaths:
    try:
        check_prerequisites()
        return ensure_node_binaries(settings=k8s_settings)
    except PrerequisiteError as error:
        if k8s_settings.require:
            pytest.fail(f"{error}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
        pytest.skip(str(error))


@pytest.fixture
def plane(k8s_binaries: BinaryPaths) -> Iterator[LocalControlPlane]:
    with LocalControlPlane(binaries=k8s_binaries, settings=EnvSettings(), keep=False) as started:
        yield started


def _mounts_naming(path: Path) -> list[str]:
    return [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in line
    ]


def _assert_host_clean(before: HostSnapshot, node_dir: Path) -> None:
    assert before.differences() == []
    for name in CHANGED_SYSCTLS:
        assert read_sysctl(name) == before.sysctls[name], name
    record = NodeRecord(owner_pid=0, node_dir=node_dir, snapshot=None)
    assert record.processes() == []
    assert _mounts_naming(node_dir) == []
    assert not any(Path(h).joinpath("kubepods").exists() for h in before.cgroups)
    assert not Path("/sys/class/net/milescni0").exists()


def _run_pod(node: RealNode) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/miles-test/engine:1.0",
                    "imagePullPolicy": "Never",
                }
            ]
        },
    }
    node.api.request("POST", "/api/v1/namespaces/default/pods", pod)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = node.api.request("GET", "/api/v1/namespaces/default/pods/p")["status"]
        if status.get("phase") == "Running":
            return
        time.sleep(0.1)
    raise AssertionError(f"pod p not Running after 60 s: {status}")


def test_teardown_leaves_the_host_as_it_was(
    plane: LocalControlPlane, node_binaries: NodeBinaryPaths
) -> None:
    before = HostSnapshot.take()
    node = RealNode.on(plane, binaries=node_binaries)
    with node:
        _run_pod(node)
        assert Path("/sys/class/net/milescni0").exists()
        assert read_sysctl("net.ipv4.ip_forward") == "1"
        assert node.failure() is None
        with pytest.raises(PrerequisiteError) as refused:
            RealNode.on(plane, binaries=node_binaries).start()
        assert "\n" not in str(refused.value)
        assert "a real node is already running on this machine" in str(refused.value)
        pids = node.pids
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    _assert_host_clean(before, node.layout.root)


def test_a_kubelet_that_exits_at_start_fails_naming_it_and_cleans_up(
    plane: LocalControlPlane, node_binaries: NodeBinaryPaths, tmp_path: Path
) -> None:
    broken = tmp_path / "kubelet"
    broken.write_text('#!/bin/sh\necho "kubelet: simulated failure" >&2\nexit 5\n')
    broken.chmod(0o755)
    before = HostSnapshot.take()
    binaries = NodeBinaryPaths(**{**vars(node_binaries), "kubelet": broken})
    node = RealNode.on(plane, binaries=binaries)
    with pytest.raises(ComponentStartError) as failed:
        node.start()
    message = str(failed.value)
    assert "kubelet (waiting for node" in message
    assert "exited with code 5" in message
    assert "simulated failure" in message
    _assert_host_clean(before, node.layout.root)


_OWNER = textwrap.dedent(
    """
    import sys, time
    from miles.utils.k8s_testenv import EnvSettings, LocalControlPlane, RealNodeAddon
    plane = LocalControlPlane(addons=[RealNodeAddon()], settings=EnvSettings.from_env(), keep=False)
    plane.start()
    print(plane.work_dir, flush=True)
    time.sleep(600)
    """
)


def test_a_node_whose_owner_was_killed_is_refused_then_cleaned_by_down(
    plane: LocalControlPlane, node_binaries: NodeBinaryPaths
) -> None:
    before = HostSnapshot.take()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    folder = owner.stdout.readline().strip()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert folder, "the owner did not start its plane"
    with pytest.raises(PrerequisiteError) as refused:
        RealNode.on(plane, binaries=node_binaries).start()
    message = str(refused.value)
    assert "\n" not in message
    assert "left by a killed run" in message
    assert "python -m miles.utils.k8s_testenv down" in message
    down = subprocess.run(
        [sys.executable, "-m", "miles.utils.k8s_testenv", "down", Path(folder).name],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr
    assert "cleaned up the real node" in down.stdout + down.stderr
    _assert_host_clean(before, Path(folder) / "node")
    with RealNode.on(plane, binaries=node_binaries) as node:
        assert ApiAccess.from_kubeconfig(plane.cached_kubeconfig).request(
            "GET", f"/api/v1/nodes/{node.node_name}"
        )
