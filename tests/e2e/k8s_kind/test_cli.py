"""k8s_kind layer: the ``miles-reconcile`` command run as a user runs it, against a real apiserver.

``watch -o jsonl`` is parsed and checked against a fresh LIST; ``watch`` is driven in a real
pseudo-terminal and must show the pool and mark a change; the errors a person hits end in one line
and exit 2; ``demo --short`` runs end to end and must print ``verdict: match``. Pod status is
written through ``pods/status`` on a node no kubelet manages, so these tests see the same pods on
KWOK, kind or a reused cluster; ``demo`` brings its own control plane and KWOK.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from miles.utils.k8s_testenv import BinaryPaths, EnvSettings, api_client
from miles.utils.k8s_testenv.kubeconfig import with_token

pytestmark = pytest.mark.k8s_kind

REPO_ROOT = Path(__file__).resolve().parents[3]
CELL_LABEL = "miles.test/cell"
APP_SELECTOR = "miles.test/cli=engine"
UNMANAGED_NODE = "cli-test-node"
"""No kubelet or KWOK manages it, so only the test writes these pods' status."""
WAIT_SECONDS = 30.0
DEMO_SECONDS = 600.0


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "miles.utils.workers.reconcile", *args]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}


def watch_args(kubeconfig: Path, namespace: str, *extra: str) -> list[str]:
    return cli_argv(
        "watch",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        namespace,
        "--selector",
        APP_SELECTOR,
        "--parent-label",
        CELL_LABEL,
        *extra,
    )


def engine_pod(name: str, cell: str) -> dict[str, Any]:
    key, value = APP_SELECTOR.split("=")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {key: value, CELL_LABEL: cell}},
        "spec": {
            "nodeName": UNMANAGED_NODE,
            "containers": [{"name": "engine", "image": "miles/engine:test"}],
        },
    }


def running(ip: str, restarts: int) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "containerStatuses": [
                {
                    "name": "engine",
                    "image": "miles/engine:test",
                    "imageID": "",
                    "ready": True,
                    "restartCount": restarts,
                    "state": {"running": {}},
                }
            ],
        }
    }


@dataclass
class Pool:
    """Engine pods in one namespace, written through the cached apiserver."""

    core: Any
    namespace: str

    async def create(self, name: str, cell: str, ip: str) -> None:
        await self.core.create_namespaced_pod(self.namespace, engine_pod(name, cell))
        await self.set_status(name, ip, restarts=0)

    async def set_status(self, name: str, ip: str, *, restarts: int) -> None:
        await self.core.patch_namespaced_pod_status(name, self.namespace, running(ip, restarts))

    async def delete(self, name: str) -> None:
        await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    async def listed(self) -> dict[str, dict[str, str]]:
        """A fresh LIST as the view groups it: per cell, each member's name and resourceVersion."""
        pods = await self.core.list_namespaced_pod(self.namespace, label_selector=APP_SELECTOR)
        view: dict[str, dict[str, str]] = {}
        for pod in pods.items:
            cell = (pod.metadata.labels or {}).get(CELL_LABEL)
            if cell:
                view.setdefault(cell, {})[pod.metadata.name] = pod.metadata.resource_version
        return view


@contextlib.asynccontextmanager
async def pool_in(kubeconfig: Path, namespace: str) -> AsyncIterator[Pool]:
    from kubernetes_asyncio import client

    async with api_client(kubeconfig) as api:
        yield Pool(core=client.CoreV1Api(api), namespace=namespace)


@dataclass
class Running:
    """A CLI process whose output is collected as it comes."""

    process: asyncio.subprocess.Process
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not condition():
            if self.process.returncode is not None:
                raise AssertionError(f"CLI exited ({self.process.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {what} after {WAIT_SECONDS:.0f}s\nstdout tail:\n"
                    f"{self.stdout[-3000:].decode(errors='replace')}\nstderr:\n"
                    f"{self.stderr.decode(errors='replace')}"
                )
            await asyncio.sleep(0.05)

    async def interrupt(self) -> int:
        """Ctrl-C, as a terminal sends it; returns the exit code."""
        self.process.send_signal(signal.SIGINT)
        async with asyncio.timeout(WAIT_SECONDS):
            return await self.process.wait()


async def _pump(stream: asyncio.StreamReader | None, into: bytearray) -> None:
    assert stream is not None
    while chunk := await stream.read(65536):
        into.extend(chunk)


@contextlib.asynccontextmanager
async def running_cli(argv: list[str]) -> AsyncIterator[Running]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=cli_env(),
    )
    run = Running(process)
    pumps = [
        asyncio.create_task(_pump(process.stdout, run.stdout)),
        asyncio.create_task(_pump(process.stderr, run.stderr)),
    ]
    try:
        yield run
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await asyncio.gather(*pumps)


def last_record_per_parent(stdout: bytes | bytearray) -> dict[str, dict[str, str]]:
    latest: dict[str, dict[str, str]] = {}
    for line in stdout.decode().splitlines():
        record = json.loads(line)
        latest[record["parent"]] = {m["name"]: m["resourceVersion"] for m in record["members"]}
    return {parent: members for parent, members in latest.items() if members}


async def test_watch_jsonl_records_end_equal_to_a_fresh_list(
    cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    """The ``jsonl`` output parsed and checked against the cluster, after a restart,
    a deletion and a new member."""
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        for name, cell, ip in (("a-0", "a", "10.9.0.1"), ("a-1", "a", "10.9.0.2")):
            await pool.create(name, cell, ip)
        await pool.create("b-0", "b", "10.9.0.3")
        argv = watch_args(cached_kubeconfig, k8s_namespace, "--output", "jsonl")
        async with running_cli(argv) as cli:
            await cli.until(lambda: cli.stdout.count(b"\n") >= 2, "records for both cells")
            await pool.set_status("a-0", "10.9.0.1", restarts=1)
            await pool.delete("a-1")
            await pool.create("b-1", "b", "10.9.0.4")
            listed = await pool.listed()
            await cli.until(
                lambda: last_record_per_parent(cli.stdout) == listed, "records equal to a LIST"
            )
            code = await cli.interrupt()
    records = [json.loads(line) for line in cli.stdout.decode().splitlines()]
    restarted = [m for r in records for m in r["members"] if m["name"] == "a-0"][-1]
    assert restarted["restarts"] == 1
    assert restarted["status"] == "Running"
    assert restarted["ip"] == "10.9.0.1"
    assert code == 130
    assert b"Traceback" not in cli.stderr


@contextlib.contextmanager
def pty_cli(argv: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``argv`` with a pseudo-terminal as stdin and stdout; yields the process and the master fd."""
    master, slave = os.openpty()
    os.set_blocking(master, False)
    process = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env={**cli_env(), "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(slave)
    try:
        yield process, master
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        os.close(master)


class Screen:
    """What the CLI wrote to the terminal; ``latest`` is the last frame since cursor-home."""

    def __init__(self, master: int) -> None:
        self._master = master
        self.raw = bytearray()

    def read(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._master, 65536):
                self.raw.extend(chunk)

    @property
    def latest(self) -> str:
        frames = self.raw.decode(errors="replace").split("\x1b[H")
        complete = [f for f in frames if f.endswith("\x1b[J")]
        return complete[-1] if complete else ""

    async def until(self, condition: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            self.read()
            if condition(self.latest):
                return self.latest
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} on screen; last frame:\n{self.latest}")
            await asyncio.sleep(0.05)


async def test_watch_in_a_pseudo_terminal_redraws_the_pool_and_marks_the_change(
    cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    """``watch`` in a real pty shows the pool, redraws in place and marks a change;
    Ctrl-C stops it with exit 130, shows the cursor again, and no traceback."""
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        await pool.create("a-0", "a", "10.9.1.1")
        await pool.create("a-1", "a", "10.9.1.2")
        with pty_cli(watch_args(cached_kubeconfig, k8s_namespace)) as (process, master):
            screen = Screen(master)
            first = await screen.until(
                lambda s: "a  (2 members)" in s and "Running" in s, "the pool"
            )
            await pool.set_status("a-1", "10.9.1.2", restarts=3)
            changed = await screen.until(lambda s: "* a-1" in s, "a marked change")
            os.killpg(process.pid, signal.SIGINT)
            interrupted_at = time.monotonic()
            code = await asyncio.to_thread(process.wait, WAIT_SECONDS)
            stopped_after = time.monotonic() - interrupted_at
            screen.read()
            assert process.stderr is not None
            stderr = process.stderr.read().decode()
    raw = screen.raw.decode(errors="replace")
    assert "\x1b[2J" in raw
    assert raw.rstrip().endswith("\x1b[?25h")
    assert "* a-" not in first
    row = next(line for line in changed.splitlines() if "* a-1" in line)
    assert row.replace("\x1b[1m", "").split()[1:5] == ["a-1", "1/1", "Running", "3"]
    assert code == 130
    assert stopped_after < 5.0, f"took {stopped_after:.2f}s to stop (bound: see test_cli_terminal)"
    assert "Traceback" not in stderr


async def test_watch_forbidden_by_rbac_is_one_line_and_exit_2(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """A service account with no role gets one readable line, not a traceback."""
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        await pool.core.create_namespaced_service_account(
            k8s_namespace, {"metadata": {"name": "nobody"}}
        )
        token = await pool.core.create_namespaced_service_account_token(
            "nobody", k8s_namespace, {"spec": {"expirationSeconds": 600}}
        )
    nobody = with_token(cached_kubeconfig, token.status.token, tmp_path / "nobody.kubeconfig")
    result = await asyncio.to_thread(
        subprocess.run,
        watch_args(nobody, k8s_namespace),
        capture_output=True,
        cwd=REPO_ROOT,
        env=cli_env(),
        timeout=WAIT_SECONDS,
    )
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2
    assert len(lines) == 1
    assert lines[0].startswith("miles-reconcile: error: forbidden by RBAC: pods is forbidden")


async def test_watch_with_a_selector_matching_nothing_says_so_and_keeps_watching(
    cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    """An empty selection is reported once, and a pod created later still shows."""
    async with running_cli(
        watch_args(cached_kubeconfig, k8s_namespace, "--output", "jsonl")
    ) as cli:
        await cli.until(lambda: b"watching for them" in cli.stderr, "the empty-selector line")
        async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
            await pool.create("late-0", "late", "10.9.2.1")
        await cli.until(lambda: b'"late-0"' in cli.stdout, "the pod created later")
        code = await cli.interrupt()
    assert cli.stderr.decode().splitlines()[0] == (
        f"miles-reconcile: no pods in namespace {k8s_namespace!r} match selector "
        f"{APP_SELECTOR!r}; watching for them"
    )
    assert code == 130


async def test_demo_short_ends_with_a_matching_verdict(
    k8s_binaries: BinaryPaths, k8s_settings: EnvSettings
) -> None:
    """``demo --short`` end to end on its own control plane and KWOK; its verdict
    (the loop's view against a fresh LIST) must be a match and the exit code 0."""
    if k8s_settings.kubeconfig is not None:
        pytest.skip("demo starts and restarts its own apiserver; MILES_K8S_KUBECONFIG reuses one")
    result = await asyncio.to_thread(
        subprocess.run,
        cli_argv("demo", "--short"),
        capture_output=True,
        cwd=REPO_ROOT,
        env=cli_env(),
        timeout=DEMO_SECONDS,
    )
    stdout = result.stdout.decode()
    verdicts = [line for line in stdout.splitlines() if line.startswith("verdict:")]
    assert verdicts, f"{stdout[-4000:]}\n{result.stderr.decode()[-4000:]}"
    assert verdicts[-1].startswith("verdict: match"), stdout[-4000:]
    for step in ("scale-up", "container restart", "graceful delete", "apiserver restart"):
        assert step in stdout
    assert result.returncode == 0
    assert "Traceback" not in result.stderr.decode()
