"""Layer k8s_apiserver: a whole controller process (``examples/pod_counter.py`` under a
``Manager``) against the real etcd and kube-apiserver (watch cache on), run as a subprocess.

Its probes and metrics answer over HTTP; SIGTERM in the middle of a reconcile lets that reconcile
finish, releases the Lease when electing (``--leader-elect``), and the process exits 0; a
reconcile longer than the grace period is cut and the process exits 1 with CR's one line.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory
from tests.e2e.k8s_apiserver.harness import eventually
from tests.fast.utils.workers.reconcile.http_probe import get

EXAMPLE = "miles.utils.workers.reconcile.examples.pod_counter"
PROCESS_SECONDS = 60.0
LEASE = "pod-counter"


class Controller:
    """The example's process, with its stderr collected line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode().rstrip())

    def port(self, server: str) -> int | None:
        for line in self.lines:
            found = re.search(rf"{server} server listening on port (\d+)", line)
            if found:
                return int(found.group(1))
        return None

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def log(self) -> str:
        return "\n".join(self.lines[-40:])

    async def exit_status(self) -> int:
        """Waits for the process to end and its stderr to be read to the end."""
        status = await asyncio.wait_for(self.process.wait(), PROCESS_SECONDS)
        await self._reader
        return status


@asynccontextmanager
async def controller(kubeconfig: Path, namespace: str, *args: str) -> AsyncIterator[Controller]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        EXAMPLE,
        "--kubeconfig",
        str(kubeconfig),
        "-n",
        namespace,
        "--parent-label",
        "app",
        "--health-probe-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
        *args,
        stderr=asyncio.subprocess.PIPE,
    )
    running = Controller(process)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.kill()
        await running.exit_status()


async def _create_pod(k8s_api_client: ApiClientFactory, namespace: str) -> None:
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-0", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox"}]},
    }
    async with k8s_api_client("cached") as api:
        core_v1: Any = client.CoreV1Api(api)
        await core_v1.create_namespaced_pod(namespace, manifest)


@pytest.mark.parametrize("electing", [False, True], ids=["alone", "electing"])
async def test_probes_metrics_and_sigterm_mid_reconcile_finish_it_and_exit_0(
    cached_kubeconfig: Path,
    k8s_namespace: str,
    k8s_api_client: ApiClientFactory,
    electing: bool,
) -> None:
    await _create_pod(k8s_api_client, k8s_namespace)
    args = ("--reconcile-seconds", "3", *(("--leader-elect",) if electing else ()))
    async with controller(cached_kubeconfig, k8s_namespace, *args) as running:
        probe = await eventually(
            lambda: running.port("health probe"), what="the probe server", context=running.log
        )
        metrics = await eventually(
            lambda: running.port("metrics"), what="the metrics server", context=running.log
        )
        assert (await get(probe, "/healthz")).body == "ok"
        await eventually(
            lambda: running.saw("reconcile of web started"), what="a reconcile", context=running.log
        )
        checks = ["[+]leader-election ok"] if electing else []
        checks += [f"[+]{k8s_namespace} ok", "healthz check passed"]
        ready = await get(probe, "/readyz?verbose")
        assert (ready.status, ready.body) == (200, "\n".join(checks) + "\n")
        if electing:
            assert await _lease_holder(k8s_api_client, k8s_namespace) not in (None, "")
        scraped = await get(metrics, "/metrics")
        assert f'workqueue_depth{{controller="{k8s_namespace}"' in scraped.body
        assert "process_resident_memory_bytes" in scraped.body
        running.process.send_signal(signal.SIGTERM)
        assert await running.exit_status() == 0, running.log()
    assert running.saw("reconcile of web finished: 1 pods"), running.log()
    assert running.saw("SIGTERM: stopping")
    if electing:
        assert running.saw("released lease")
        assert await _lease_holder(k8s_api_client, k8s_namespace) == ""


async def _lease_holder(k8s_api_client: ApiClientFactory, namespace: str) -> str | None:
    async with k8s_api_client("cached") as api:
        coordination: Any = client.CoordinationV1Api(api)
        lease = await coordination.read_namespaced_lease(LEASE, namespace)
    holder = lease.spec.holder_identity
    return None if holder is None else str(holder)


async def test_a_reconcile_longer_than_the_grace_is_cut_and_the_process_exits_1(
    cached_kubeconfig: Path, k8s_namespace: str, k8s_api_client: ApiClientFactory
) -> None:
    await _create_pod(k8s_api_client, k8s_namespace)
    args = ("--reconcile-seconds", "120", "--graceful-shutdown-timeout", "1")
    async with controller(cached_kubeconfig, k8s_namespace, *args) as running:
        await eventually(
            lambda: running.saw("reconcile of web started"), what="a reconcile", context=running.log
        )
        running.process.send_signal(signal.SIGTERM)
        assert await running.exit_status() == 1, running.log()
    assert not running.saw("reconcile of web finished")
    assert running.lines[-1].endswith(
        "failed waiting for all runnables to end within grace period of 1.0s"
    ), running.log()
