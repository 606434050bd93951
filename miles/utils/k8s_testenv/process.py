"""One child process in its own process group (Go: envtest's `internal/testing/process.State`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from miles.utils.k8s_testenv.errors import ComponentStartError

ReadyCheck = Callable[[], bool]

_LOG_TAIL_LINES = 30
_POLL_INTERVAL = 0.1


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "    (no log written)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def exit_failure(
    process: asyncio.subprocess.Process | None, who: str, tail: Callable[[], str]
) -> str | None:
    """Why ``process`` is not running: ``who`` exited with its code, then ``tail()`` (its log);
    None before it started and while it runs."""
    if process is None or process.returncode is None:
        return None
    return f"{who} exited with code {process.returncode}\n{tail()}"


def stop_process_group(pid: int, *, grace: float = 10.0) -> None:
    """SIGTERM to the group led by `pid`, then SIGKILL once `grace` seconds have passed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _group_alive(pid):
            return
        time.sleep(_POLL_INTERVAL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop_process(pid: int, *, grace: float = 10.0) -> None:
    """SIGTERM to `pid` alone (one we did not start as a group leader), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(_POLL_INTERVAL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def spawn_piped(
    argv: Sequence[str],
    log_path: Path,
    *,
    stdin: int = asyncio.subprocess.PIPE,
    limit: int = 2**16,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Starts `argv` as the leader of its own session, its stdout a pipe of `limit`-byte lines and
    its stderr appended to `log_path`."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            limit=limit,
            env=env,
        )


class ManagedProcess:
    """Starts `argv` with its output in `log_path`, waits until `ready()` holds, stops the group.

    A process that exits, or is not ready within `start_timeout`, fails the start with
    `ComponentStartError` naming the component, its command line and the tail of its log; the
    process group is killed before the error is raised.
    """

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ready: ReadyCheck,
        start_timeout: float = 90.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._ready = ready
        self._start_timeout = start_timeout
        self._env = env
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Starts the process without waiting for it to become ready."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=self._env,
                )
            except OSError as err:
                raise self._start_error(f"cannot execute: {err}") from err

    def wait_ready(self) -> None:
        if self._popen is None:
            raise RuntimeError(f"{self.name} was not launched")
        deadline = time.monotonic() + self._start_timeout
        while True:
            code = self._popen.poll()
            if code is not None:
                self.stop()
                raise self._start_error(f"exited with code {code} during start-up")
            if self._ready():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise self._start_error(f"not ready after {self._start_timeout:.0f}s")
            time.sleep(_POLL_INTERVAL)

    def _start_error(self, reason: str) -> ComponentStartError:
        return ComponentStartError(
            component=self.name, reason=reason, argv=self.argv, log_tail=log_tail(self.log_path)
        )

    def stop(self, *, grace: float = 10.0) -> None:
        if self._popen is None:
            return
        stop_process_group(self._popen.pid, grace=grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=grace)
        self._popen = None
