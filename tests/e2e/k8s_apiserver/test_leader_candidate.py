"""Layer: real apiserver, no kubelet (the cached kube-apiserver). ``leader_candidate``, the program
the interop harness runs beside client-go's, as two subprocesses on one Lease: one leads and acts,
the other stands by; SIGTERM makes the leader stop acting, release, print ``stopped`` and exit 0,
and the other takes the released lease at its next poll. Asserted on the lines they print and on
the Lease read from the apiserver."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory

pytestmark = pytest.mark.k8s_apiserver

TIMING = ["--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"]


class Candidate:
    def __init__(self, kubeconfig: Path, namespace: str, identity: str) -> None:
        self.identity = identity
        self.lines: list[dict[str, Any]] = []
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "miles.utils.k8s_testenv.testing.leader_candidate",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                namespace,
                "--lease",
                "interop",
                "--identity",
                identity,
                *TIMING,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    async def until(self, event: str, within: float) -> dict[str, Any]:
        """Reads lines until one with ``event``; returns it."""
        assert self.process.stdout is not None
        stdout = self.process.stdout
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(
                asyncio.to_thread(stdout.readline), deadline - time.monotonic()
            )
            if not raw:
                break
            line: dict[str, Any] = json.loads(raw)
            assert set(line) == {"t", "id", "event", "leader"}
            assert line["id"] == self.identity
            self.lines.append(line)
            if line["event"] == event:
                return line
        raise AssertionError(f"{self.identity}: no {event!r} line within {within}s: {self.lines}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def _holder(factory: ApiClientFactory, namespace: str) -> Any:
    async with factory("cached") as api:
        lease = await client.CoordinationV1Api(api).read_namespaced_lease("interop", namespace)
        return lease.spec.holder_identity


async def test_two_candidates_one_leads_and_sigterm_hands_over(
    cached_kubeconfig: Path, k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    first = Candidate(cached_kubeconfig, k8s_namespace, "py-1")
    second: Candidate | None = None
    try:
        leading = await first.until("leading", 30)
        assert leading["leader"] == "py-1"
        assert (await first.until("acting", 5))["leader"] == "py-1"
        second = Candidate(cached_kubeconfig, k8s_namespace, "py-2")
        assert (await second.until("new_leader", 30))["leader"] == "py-1"
        assert await _holder(k8s_api_client, k8s_namespace) == "py-1"
        first.process.send_signal(signal.SIGTERM)
        stopped = await first.until("stopped", 15)
        assert first.process.wait(timeout=15) == 0
        assert not [
            line for line in first.lines if line["event"] == "acting" and line["t"] > stopped["t"]
        ]
        took = await second.until("leading", 5)
        assert took["t"] >= stopped["t"] - 0.2
        assert took["t"] - stopped["t"] < 3, "a released lease is taken before it would expire"
        assert await _holder(k8s_api_client, k8s_namespace) == "py-2"
    finally:
        first.stop()
        if second is not None:
            second.stop()
