"""k8s_kind layer, bad input: KWOK crashing at start or mid-run, a fake node that never becomes
Ready, and a pod that is never scheduled all end in a clear failure naming what was awaited and for
how long, never in a hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miles.utils.k8s_testenv import ComponentStartError, LocalControlPlane, api_client
from miles.utils.k8s_testenv.kubelet import (
    KubeletLayer,
    LayerName,
    WaitTimeout,
    create_namespace,
    read_pod_or_none,
    wait_for_pod_phase,
)
from miles.utils.k8s_testenv.kwok import ApiAccess, Kwok, fake_node_manifest

pytestmark = pytest.mark.k8s_kind

UNMANAGED = "not-managed-by-the-session-kwok"
"""The selector value of the kwoks started here, so the session's kwok leaves their nodes alone."""


def _fake_kwok(directory: Path, script: str) -> Path:
    binary = directory / "kwok"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    return binary


@pytest.fixture
def plane(k8s_local_control_plane_session: LocalControlPlane) -> LocalControlPlane:
    return k8s_local_control_plane_session


@pytest.fixture
def node_name(plane: LocalControlPlane) -> Iterator[str]:
    """A node name of this test's own, deleted afterwards."""
    name = f"bad-input-{uuid.uuid4().hex[:6]}"
    yield name
    with contextlib.suppress(urllib.error.HTTPError):
        ApiAccess.from_kubeconfig(plane.cached_kubeconfig).request(
            "DELETE", f"/api/v1/nodes/{name}"
        )


def _kwok(
    plane: LocalControlPlane, binary: Path, work_dir: Path, node: str, timeout: float
) -> Kwok:
    return Kwok(
        binary=binary,
        kubeconfig=plane.cached_kubeconfig,
        work_dir=work_dir,
        node_name=node,
        selector_value=UNMANAGED,
        start_timeout=timeout,
    )


def _failed_start(
    plane: LocalControlPlane, tmp_path: Path, node_name: str, script: str, *, timeout: float
) -> tuple[str, float]:
    """A fake KWOK running ``script`` started on its own node: the start's error message, and
    the seconds it took to fail."""
    binary = _fake_kwok(tmp_path, script)
    started = time.monotonic()
    with pytest.raises(ComponentStartError) as failed:
        _kwok(plane, binary, tmp_path, node_name, timeout=timeout).start()
    return str(failed.value), time.monotonic() - started


def test_kwok_crashing_at_start_fails_with_its_exit_code_and_log(
    plane: LocalControlPlane, tmp_path: Path, node_name: str
) -> None:
    crash = 'echo "kwok: simulated crash" >&2; exit 3'
    message, seconds = _failed_start(plane, tmp_path, node_name, crash, timeout=30)
    assert f"waiting for fake node {node_name} to report Ready" in message
    assert "exited with code 3" in message
    assert "simulated crash" in message
    assert seconds < 15


def test_node_that_never_becomes_ready_fails_naming_node_and_time(
    plane: LocalControlPlane, tmp_path: Path, node_name: str
) -> None:
    message, seconds = _failed_start(plane, tmp_path, node_name, "exec sleep 600", timeout=3)
    assert f"waiting for fake node {node_name} to report Ready" in message
    assert "not ready after 3s" in message
    assert seconds < 20


async def test_kwok_dying_mid_run_fails_a_wait_at_once(
    plane: LocalControlPlane, tmp_path: Path, node_name: str
) -> None:
    api = ApiAccess.from_kubeconfig(plane.cached_kubeconfig)
    await asyncio.to_thread(_create_ready_node, api, node_name)
    kwok = _kwok(plane, _fake_kwok(tmp_path, "exec sleep 600"), tmp_path, node_name, timeout=10)
    with kwok:
        layer = KubeletLayer(
            name=LayerName.KWOK,
            kubeconfig=plane.cached_kubeconfig,
            node_name=node_name,
            failure=kwok.failure,
        )
        assert kwok.pid is not None
        os.killpg(kwok.pid, signal.SIGKILL)
        started = asyncio.get_running_loop().time()
        with pytest.raises(
            WaitTimeout, match=r"gave up after .* waiting for a pod to run: kwok is"
        ):
            await layer.eventually(lambda: None, what="a pod to run", timeout_seconds=60)
        assert asyncio.get_running_loop().time() - started < 5


async def test_pod_never_scheduled_fails_naming_what_and_how_long(
    kubelet_layer: KubeletLayer,
) -> None:
    from kubernetes_asyncio import client

    manifest = kubelet_layer.pod_manifest(name="unbound", labels={})
    manifest["spec"].pop("nodeName", None)
    manifest["spec"]["nodeSelector"] = {"miles.test/nowhere": "true"}
    namespace = f"miles-e2e-{uuid.uuid4().hex[:8]}"
    async with api_client(kubelet_layer.kubeconfig) as api:
        core_v1: Any = client.CoreV1Api(api)
        await create_namespace(kubelet_layer, core_v1, namespace)
        await core_v1.create_namespaced_pod(namespace, manifest)
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(WaitTimeout) as timed_out:
                await wait_for_pod_phase(
                    kubelet_layer,
                    core_v1,
                    namespace=namespace,
                    name="unbound",
                    phase="Running",
                    timeout_seconds=3,
                )
            elapsed = asyncio.get_running_loop().time() - started
            message = str(timed_out.value)
            assert f"waited 3.0 s for pod {namespace}/unbound to reach phase Running" in message
            assert "never scheduled (spec.nodeName is empty)" in message
            assert elapsed < 10
            pod = await read_pod_or_none(core_v1, namespace=namespace, name="unbound")
            assert pod is not None
            assert pod.status.phase == "Pending"
        finally:
            await core_v1.delete_namespaced_pod("unbound", namespace, grace_period_seconds=0)


def _create_ready_node(api: ApiAccess, name: str) -> None:
    node = api.request("POST", "/api/v1/nodes", fake_node_manifest(name, selector_value=UNMANAGED))
    node["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Test"}]}
    # Unconditional: a controller manager (real node) may have tainted the node since the POST.
    node["metadata"].pop("resourceVersion")
    api.request("PUT", f"/api/v1/nodes/{name}/status", node)
