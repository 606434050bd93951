"""k8s_kind layer: ``miles-reconcile watch`` in a real terminal (tmux) and a pty, its signals, a
closed pipe, and what it says about a bad selector, a TLS failure and a kubeconfig's context,
against the real local control plane.

Pod status is written through ``pods/status`` on a node nothing manages (see ``test_cli.py``), so
these run the same on KWOK, kind or a reused cluster.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miles.utils.k8s_testenv import EnvSettings
from miles.utils.k8s_testenv.kubeconfig import write_kubeconfig
from tests.e2e.k8s_kind.test_cli import (
    APP_SELECTOR,
    CELL_LABEL,
    REPO_ROOT,
    WAIT_SECONDS,
    Screen,
    cli_argv,
    cli_env,
    pool_in,
    pty_cli,
    running_cli,
    watch_args,
)

pytestmark = pytest.mark.k8s_kind

STOP_WITHIN = 5.0
"""Ctrl-C used to be ignored for ~10 s while connecting. Measured idle: 0.07-0.3 s from the signal
to exit; the bound is loose because the machine is shared (load averages of 20 on 2 cores seen),
so it catches a signal that is not honoured, not a slow machine."""


def kubeconfig_with(source: Path, path: Path, **changes: object) -> Path:
    """A copy of ``source`` with context, cluster or user fields replaced."""
    config = json.loads(source.read_text())
    for key, value in changes.items():
        section, field = key.split("__")
        for entry in config[f"{section}s"]:
            entry[section][field.replace("_", "-")] = value
    path.write_text(json.dumps(config))
    return path


@contextlib.contextmanager
def silent_server() -> Iterator[socket.socket]:
    """A loopback port that accepts connections and never answers: the LIST hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(WAIT_SECONDS)
        yield server


async def first_connection(server: socket.socket) -> socket.socket:
    """The command's connection, once it made one: it is past its imports and listing."""
    connection, _ = await asyncio.to_thread(server.accept)
    return connection


def silent_kubeconfig(path: Path, port: int) -> Path:
    server = f"http://127.0.0.1:{port}"
    return write_kubeconfig(path, name="silent", server=server, ca_cert=None, token="t")


def stranger_certificate(folder: Path) -> str:
    """A self-signed CA of our own (openssl), base64 as a kubeconfig carries it."""
    cert, key = folder / "stranger.pem", folder / "stranger.key"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ),
            *(
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=stranger",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return base64.b64encode(cert.read_bytes()).decode()


async def wait_exit(process: subprocess.Popen[bytes]) -> tuple[int, float]:
    started = time.monotonic()
    code = await asyncio.to_thread(process.wait, WAIT_SECONDS)
    return code, time.monotonic() - started


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_a_signal_while_the_first_list_hangs_stops_at_once(
    signum: int, code: int, tmp_path: Path
) -> None:
    """Ctrl-C (or SIGTERM) while connecting and listing is honoured at once."""
    with silent_server() as server:
        kubeconfig = silent_kubeconfig(tmp_path / "silent.kubeconfig", server.getsockname()[1])
        with pty_cli(watch_args(kubeconfig, "default")) as (process, _master):
            with await first_connection(server):
                assert process.poll() is None, "watch ended before it was signalled"
                os.killpg(process.pid, signum)
                exit_code, took = await wait_exit(process)
            assert process.stderr is not None
            stderr = process.stderr.read().decode()
    assert exit_code == code
    assert took < STOP_WITHIN, f"took {took:.2f}s to stop"
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "miles-reconcile: interrupted"


async def test_sigterm_while_watching_exits_143_and_shows_the_cursor(
    cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        await pool.create("a-0", "a", "10.9.3.1")
        with pty_cli(watch_args(cached_kubeconfig, k8s_namespace)) as (process, master):
            screen = Screen(master)
            await screen.until(lambda s: "a  (1 member)" in s, "the pool")
            os.killpg(process.pid, signal.SIGTERM)
            exit_code, took = await wait_exit(process)
            screen.read()
    assert exit_code == 143
    assert took < STOP_WITHIN, f"took {took:.2f}s to stop"
    assert screen.raw.decode(errors="replace").rstrip().endswith("\x1b[?25h")


async def test_a_closed_pipe_ends_quietly(cached_kubeconfig: Path, k8s_namespace: str) -> None:
    """``watch -o jsonl | head -1``: the reader leaves, watch exits 0 with nothing on stderr."""
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        for cell in ("a", "b", "c"):
            await pool.create(f"{cell}-0", cell, "10.9.4.1")
        argv = " ".join(watch_args(cached_kubeconfig, k8s_namespace, "-o", "jsonl"))
        script = f'{argv} 2>{k8s_namespace}.err | head -1 >/dev/null; echo "${{PIPESTATUS[0]}}"'
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            script,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            env=cli_env(),
        )
        communicate = asyncio.ensure_future(process.communicate())
        for restarts in range(1, 200):
            if communicate.done():
                break
            await pool.set_status("a-0", "10.9.4.1", restarts=restarts)
            await asyncio.sleep(0.1)
        async with asyncio.timeout(WAIT_SECONDS):
            stdout, _ = await communicate
    err_file = REPO_ROOT / f"{k8s_namespace}.err"
    stderr = err_file.read_text()
    err_file.unlink()
    assert stdout.decode().strip() == "0"
    assert stderr == ""


async def test_a_bad_selector_is_named_as_the_selector(
    cached_kubeconfig: Path, k8s_namespace: str
) -> None:
    argv = cli_argv(
        "watch",
        "--kubeconfig",
        str(cached_kubeconfig),
        "-n",
        k8s_namespace,
        "-l",
        "app=a=b",
        "--parent-label",
        CELL_LABEL,
    )
    result = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, cwd=REPO_ROOT, env=cli_env(), timeout=30
    )
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2
    assert len(lines) == 1
    assert lines[0].startswith(
        "miles-reconcile: error: selector 'app=a=b' rejected by the apiserver: found '='"
    )


async def test_a_certificate_the_server_does_not_match_is_a_tls_failure(
    cached_kubeconfig: Path, tmp_path: Path
) -> None:
    """The CA is replaced by a certificate that did not sign the server's: one line that says
    TLS verification failed and names the server, not "cannot reach"."""
    config = json.loads(await asyncio.to_thread(cached_kubeconfig.read_text))
    stranger = stranger_certificate(tmp_path)
    wrong_ca = kubeconfig_with(
        cached_kubeconfig, tmp_path / "wrong-ca", cluster__certificate_authority_data=stranger
    )
    server = config["clusters"][0]["cluster"]["server"].removeprefix("https://")
    result = await asyncio.to_thread(
        subprocess.run,
        watch_args(wrong_ca, "default"),
        capture_output=True,
        cwd=REPO_ROOT,
        env=cli_env(),
        timeout=30,
    )
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2
    assert len(lines) == 1
    assert lines[0].startswith(
        f"miles-reconcile: error: TLS verification of the apiserver at {server}"
    )
    assert "failed: unable to get local issuer certificate" in lines[0]


async def test_the_contexts_namespace_is_used_unless_n_is_given(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        await pool.create("ctx-0", "ctx", "10.9.5.1")
    scoped = kubeconfig_with(
        cached_kubeconfig, tmp_path / "scoped", context__namespace=k8s_namespace
    )
    base = cli_argv(
        "watch", "--kubeconfig", str(scoped), "-l", APP_SELECTOR, "--parent-label", CELL_LABEL
    )
    async with running_cli([*base, "-o", "jsonl"]) as cli:
        await cli.until(lambda: b'"ctx-0"' in cli.stdout, "the context namespace's pod")
        assert await cli.interrupt() == 130
    async with running_cli([*base, "-o", "jsonl", "-n", "default"]) as cli:
        await cli.until(lambda: b"watching for them" in cli.stderr, "the empty selection")
        assert await cli.interrupt() == 130
    assert b"ctx-0" not in cli.stdout
    assert "namespace 'default'" in cli.stderr.decode()


async def reset_the_held_watch(proxy: Any) -> None:
    """Reset the watch connection once the proxy holds it (the next bytes on it are swallowed)."""
    for _ in range(int(WAIT_SECONDS / 0.05)):
        if await proxy.reset_held():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the proxy never held the watch")


class Tmux:
    """A tmux server of this test's own (its own socket), sized like a person's terminal."""

    def __init__(self, socket_name: str) -> None:
        self.socket_name = socket_name

    def run(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket_name, *args],
            capture_output=True,
            check=True,
            timeout=10,
        )
        return result.stdout.decode()

    def screen(self) -> list[str]:
        return self.run("capture-pane", "-p", "-t", "watch").rstrip("\n").split("\n")

    async def until(self, condition: object, what: str) -> list[str]:
        assert callable(condition)
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            lines = self.screen()
            if condition(lines):
                return lines
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} in the tmux pane:\n" + "\n".join(lines))
            await asyncio.sleep(0.1)


@contextlib.contextmanager
def tmux_session(command: str, *, width: int, height: int, settings: EnvSettings) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        reason = "tmux is not installed (Debian: tmux)"
        if settings.require:
            pytest.fail(f"{reason}; MILES_K8S_REQUIRE is on, so this fails instead of skipping")
        pytest.skip(reason)
    tmux = Tmux(f"miles-test-{uuid.uuid4().hex[:8]}")
    tmux.run("new-session", "-d", "-s", "watch", "-x", str(width), "-y", str(height), command)
    try:
        yield tmux
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            tmux.run("kill-server")


async def test_watch_in_tmux_fits_80x24_then_40_columns_and_ctrl_c_exits_130(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path, k8s_settings: EnvSettings
) -> None:
    """In a real terminal: at 80x24 a pool taller than the screen keeps its
    header and says how many parents are hidden; resized to 40 columns (SIGWINCH) no line wraps;
    Ctrl-C typed into the terminal exits 130 and leaves a shell-usable terminal."""
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        for cell in range(8):
            for member in range(3):
                await pool.create(f"engine-{cell}-{member}", f"cell-{cell}", f"10.9.6.{member}")
    exit_file = tmp_path / "exit"
    argv = " ".join(watch_args(cached_kubeconfig, k8s_namespace))
    env = " ".join(f"{k}={v}" for k, v in cli_env().items() if k in ("PYTHONPATH", "PATH"))
    command = f"cd {REPO_ROOT} && env {env} {argv}; echo $? > {exit_file}; sleep 60"
    with tmux_session(command, width=80, height=24, settings=k8s_settings) as tmux:
        wide = await tmux.until(
            lambda lines: any("more parents" in line for line in lines), "the hidden-parents line"
        )
        tmux.run("resize-window", "-t", "watch", "-x", "40", "-y", "24")
        narrow = await tmux.until(
            lambda lines: (
                lines
                and lines[0].startswith("miles-reconcile watch")
                and all(len(line) <= 40 for line in lines)
                and any(line.split()[:1] == ["NAME"] for line in lines)
            ),
            "a 40-column frame",
        )
        tmux.run("send-keys", "-t", "watch", "C-c")
        await tmux.until(lambda _: exit_file.exists(), "the exit status")
        after = tmux.screen()
    print("80x24:", *wide, sep="\n")
    print("40x24:", *narrow, sep="\n")
    assert len(wide) == 24
    assert max(len(line) for line in wide) <= 80
    assert wide[0].startswith("miles-reconcile watch")
    assert wide[2].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    hidden = next(line for line in wide if "more parents" in line)
    shown = sum(1 for line in wide if line.startswith("cell-"))
    assert hidden.startswith(f"... {8 - shown} more parents ({3 * (8 - shown)} pods) hidden")
    assert exit_file.read_text().strip() == "130"
    assert not any("Traceback" in line for line in after)


async def test_the_status_line_follows_the_connection_and_warnings_clear(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """Through the HTTP fault proxy, the status line reads
    ``connected``; the open watch is black-holed (a pod change puts bytes on it) and reset, and
    while every LIST and WATCH is answered 503 it reads ``reconnecting since HH:MM:SS local``; then
    ``connected`` again, and the log lines shown meanwhile are gone."""
    from miles.utils.k8s_testenv.http_fault_proxy import (
        LIST,
        WATCH,
        BlackHole,
        HttpFaultProxy,
        Respond,
    )
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.loop import ReconcileLoop

    if not hasattr(ReconcileLoop, "status") or not hasattr(KubernetesReflector, "source_status"):
        pytest.skip(
            "needs ReconcileLoop.status() and the reflector's source_status(): the loop alone "
            "sees the reflector's retries as one open stream"
        )
    async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
        await pool.create("a-0", "a", "10.9.7.1")
    async with HttpFaultProxy(kubeconfig=cached_kubeconfig) as proxy:
        proxied = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        with pty_cli(watch_args(proxied, k8s_namespace)) as (process, master):
            screen = Screen(master)
            await screen.until(lambda s: "connected |" in s and "a-0" in s, "connected")
            hole = proxy.add(WATCH, BlackHole())
            async with pool_in(cached_kubeconfig, k8s_namespace) as pool:
                await pool.set_status("a-0", "10.9.7.1", restarts=1)
            refused = [proxy.add(LIST, Respond(503)), proxy.add(WATCH, Respond(503))]
            await reset_the_held_watch(proxy)
            proxy.remove(hole)
            # the reset shows first; the 503s follow one backoff step later
            down = await screen.until(
                lambda s: "503" in _reconnecting_line(s), "reconnecting on a 503"
            )
            for fault in refused:
                proxy.remove(fault)
            back = await screen.until(
                lambda s: "connected |" in s and "log:" not in s, "connected without warnings"
            )
            os.killpg(process.pid, signal.SIGINT)
            assert await asyncio.to_thread(process.wait, WAIT_SECONDS) == 130
    line = _reconnecting_line(down)
    print("while refused:", *down.splitlines(), "after:", *back.splitlines(), sep="\n")
    assert " local" in line
    assert "503" in line
    assert "a-0" in back


def _reconnecting_line(screen: str) -> str:
    """The status line while reconnecting, or "" (a log line below it may name the 503 first)."""
    return next((row for row in screen.splitlines() if "reconnecting since" in row), "")
