"""Layer k8s_apiserver: the local control plane alone (etcd + cached and uncached kube-apiserver).

Proves the environment the other e2e tests stand on: pods round-trip through both apiservers, a
stale cursor on the cache-less apiserver gets a real 410 after compaction, restarts keep data,
etcd can be stopped and started, bad input fails with one clear error and no orphan, `down`
cleans up after a killed run, the client-go oracle LISTs once then WATCHes, and the provisioner
imports nothing from the runtime under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import (
    ApiClientFactory,
    BinaryPaths,
    ClusterUnreachableError,
    ComponentStartError,
    EnvSettings,
    LocalControlPlane,
    PrerequisiteError,
    api_client,
    check_reachable,
)
from miles.utils.k8s_testenv.binaries import go_executable
from miles.utils.k8s_testenv.etcd import Etcd
from miles.utils.k8s_testenv.kubeconfig import write_kubeconfig
from miles.utils.k8s_testenv.ports import LOOPBACK, free_ports

pytestmark = pytest.mark.k8s_apiserver


def _pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name="node-a", containers=[client.V1Container(name="main", image="busybox")]
        ),
    )


async def _pod_names(api: Any, namespace: str) -> list[str]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(namespace)
    return sorted(pod.metadata.name for pod in pods.items)


async def test_pods_created_on_one_apiserver_are_listed_by_both(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as cached, k8s_api_client("uncached") as uncached:
        await client.CoreV1Api(cached).create_namespaced_pod(k8s_namespace, _pod("p-1"))
        await client.CoreV1Api(uncached).create_namespaced_pod(k8s_namespace, _pod("p-2"))
        assert await _pod_names(uncached, k8s_namespace) == ["p-1", "p-2"]
        for _ in range(50):
            if await _pod_names(cached, k8s_namespace) == ["p-1", "p-2"]:
                break
            await asyncio.sleep(0.1)
        assert await _pod_names(cached, k8s_namespace) == ["p-1", "p-2"]


async def _first_watch_frame(api: Any, namespace: str, resource_version: str) -> dict[str, Any]:
    core: Any = client.CoreV1Api(api)
    response = await core.list_namespaced_pod(
        namespace,
        watch=True,
        resource_version=resource_version,
        timeout_seconds=5,
        _preload_content=False,
    )
    async with response:
        line = await response.content.readline()
    frame: dict[str, Any] = json.loads(line)
    return frame


async def test_stale_cursor_on_uncached_apiserver_gets_410_after_compaction(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    """Recipe §3: make the RV stale, compact etcd to its head, then LIST/WATCH from it → 410."""
    async with k8s_api_client("uncached") as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(k8s_namespace, _pod("p-1"))
        stale_rv = (await core.list_namespaced_pod(k8s_namespace)).metadata.resource_version
        for i in range(3):
            body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"bump-{i}"))
            await core.create_namespaced_config_map(k8s_namespace, body)
        compacted = k8s_local_control_plane.compact_etcd()
        assert compacted > int(stale_rv) + 1

        frame = await _first_watch_frame(api, k8s_namespace, stale_rv)
        assert frame["type"] == "ERROR"
        assert frame["object"]["code"] == 410
        assert frame["object"]["reason"] == "Expired"

        with pytest.raises(ApiException) as exact_list:
            await core.list_namespaced_pod(
                k8s_namespace, resource_version=stale_rv, resource_version_match="Exact"
            )
        assert exact_list.value.status == 410


async def test_apiserver_restart_keeps_port_and_data(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    async with k8s_api_client("cached") as api:
        created = await client.CoreV1Api(api).create_namespaced_pod(k8s_namespace, _pod("p-1"))
    k8s_local_control_plane.restart_apiserver("cached")
    async with k8s_api_client("cached") as api:
        read = await client.CoreV1Api(api).read_namespaced_pod("p-1", k8s_namespace)
    assert read.metadata.uid == created.metadata.uid


async def _list_until_answered(api: Any, namespace: str, attempts: int = 100) -> list[str]:
    for _ in range(attempts - 1):
        try:
            return await _pod_names(api, namespace)
        except ApiException:
            await asyncio.sleep(0.2)
    return await _pod_names(api, namespace)


async def test_etcd_stop_and_start_keeps_data(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    async with k8s_api_client("uncached") as api:
        await client.CoreV1Api(api).create_namespaced_pod(k8s_namespace, _pod("p-1"))
    k8s_local_control_plane.stop_etcd()
    k8s_local_control_plane.start_etcd()
    async with k8s_api_client("uncached") as api:
        assert await _list_until_answered(api, k8s_namespace) == ["p-1"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_etcd_on_a_port_in_use_fails_naming_it_and_leaves_no_process(
    k8s_binaries: BinaryPaths, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        peer_port = free_ports(1)[0]
        etcd = Etcd(
            binary=k8s_binaries.etcd,
            data_dir=tmp_path / "etcd",
            log_path=tmp_path / "etcd.log",
            client_port=taken_port,
            peer_port=peer_port,
        )
        etcd.process.launch()
        pid = etcd.process.pid
        assert pid is not None
        with pytest.raises(ComponentStartError) as failure:
            etcd.process.wait_ready()
    message = str(failure.value)
    assert message.startswith("etcd failed to start: exited with code")
    assert f"--listen-client-urls=http://{LOOPBACK}:{taken_port}" in message
    assert "address already in use" in message
    assert not _alive(pid)


def test_missing_binary_fails_naming_component_and_command(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-etcd"
    etcd = Etcd(
        binary=missing, data_dir=tmp_path, log_path=tmp_path / "e.log", client_port=1, peer_port=2
    )
    with pytest.raises(ComponentStartError, match=r"^etcd failed to start: cannot execute"):
        etcd.start()


def test_missing_go_toolchain_is_a_prerequisite_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(PrerequisiteError, match="Go toolchain not found on PATH"):
        go_executable()


async def test_kubeconfig_pointing_nowhere_is_one_clear_error(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    kubeconfig = write_kubeconfig(
        tmp_path / "nowhere.kubeconfig",
        name="nowhere",
        server=f"https://{LOOPBACK}:{port}",
        ca_cert=None,
        token="t",
    )
    with pytest.raises(ClusterUnreachableError, match=rf"server https://{LOOPBACK}:{port} does"):
        await check_reachable(kubeconfig)


def test_importing_the_testenv_imports_nothing_from_the_runtime() -> None:
    probe = (
        "import sys, miles.utils.k8s_testenv, miles.utils.k8s_testenv.__main__\n"
        "print([m for m in sys.modules if m.startswith('miles.utils.workers')])"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    )
    assert result.stdout.strip() == "[]"


def _oracle_snapshot(oracle: subprocess.Popen[str]) -> dict[str, Any]:
    assert oracle.stdin is not None
    assert oracle.stdout is not None
    oracle.stdin.write("\n")
    oracle.stdin.flush()
    snapshot: dict[str, Any] = json.loads(oracle.stdout.readline())
    return snapshot


async def _create_pod(kubeconfig: Path, namespace: str, name: str, app: str) -> str:
    pod = _pod(name)
    pod.metadata.labels = {"app": app}
    async with api_client(kubeconfig) as api:
        created = await client.CoreV1Api(api).create_namespaced_pod(namespace, pod)
    uid: str = created.metadata.uid
    return uid


def _oracle_until(
    oracle: subprocess.Popen[str], done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    snapshot = _oracle_snapshot(oracle)
    for _ in range(100):
        if done(snapshot):
            break
        time.sleep(0.1)
        snapshot = _oracle_snapshot(oracle)
    return snapshot


def test_oracle_reflector_lists_once_then_watches_selected_pods(
    k8s_binaries: BinaryPaths, cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    """tools/k8s/oracle: client-go's Reflector+Store with WatchListClient off (LIST, then WATCH)."""
    asyncio.run(_create_pod(cached_kubeconfig, k8s_namespace, "a-0", "a"))
    asyncio.run(_create_pod(cached_kubeconfig, k8s_namespace, "b-0", "b"))
    argv = [
        str(k8s_binaries.oracle),
        f"--kubeconfig={cached_kubeconfig}",
        f"--namespace={k8s_namespace}",
        "--selector=app=a",
    ]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as oracle:
        try:
            synced = _oracle_until(oracle, lambda s: bool(s["resourceVersion"]))
            assert [p["name"] for p in synced["pods"]] == ["a-0"]
            uid = asyncio.run(_create_pod(cached_kubeconfig, k8s_namespace, "a-1", "a"))
            watched = _oracle_until(oracle, lambda s: len(s["pods"]) == 2)
            late = watched["pods"][1]
            assert (late["name"], late["uid"], late["labels"]) == ("a-1", uid, {"app": "a"})
            assert int(late["resourceVersion"]) > int(synced["resourceVersion"])
            assert watched["lists"] == 1
        finally:
            assert oracle.stdin is not None
            oracle.stdin.close()
        assert oracle.wait(timeout=10) == 0


def _processes_naming(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_down_stops_the_orphans_of_a_killed_owner(k8s_binaries: BinaryPaths) -> None:
    """`python -m miles.utils.k8s_testenv down NAME` cleans up after a SIGKILLed test run."""
    owner = (
        "import os, signal\n"
        "from miles.utils.k8s_testenv import LocalControlPlane\n"
        "plane = LocalControlPlane(keep=False)\n"
        "plane.start()\n"
        "print(plane.work_dir, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", owner], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    work_dir = Path(killed.stdout.strip())
    assert len(_processes_naming(str(work_dir))) == 3
    subprocess.run(
        [sys.executable, "-m", "miles.utils.k8s_testenv", "down", work_dir.name], check=True
    )
    assert _processes_naming(str(work_dir)) == []
    assert not work_dir.exists()


@pytest.mark.parametrize(
    ("environ", "require"),
    [
        ({}, False),
        ({"CI": "true"}, True),
        ({"CI": "true", "MILES_K8S_REQUIRE": "0"}, False),
        ({"MILES_K8S_REQUIRE": "1"}, True),
    ],
)
def test_missing_prerequisites_fail_under_ci_unless_overridden(
    environ: dict[str, str], require: bool
) -> None:
    assert EnvSettings.from_env(environ).require is require
