"""Drives `tools/k8s/oracle` (client-go's Reflector and Store) as a child process.

Go counterpart: the oracle itself is client-go; this is only its stdin/stdout protocol. Every read
has a deadline, a dead oracle is reported with its exit code and log tail, and `aclose()` leaves no
process behind: the oracle runs in its own process group, which is killed if closing its stdin does
not end it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv.process import exit_failure, spawn_piped

_EXIT_GRACE = 5.0
ORACLE_USER_AGENT = "oracle/"
"""How the oracle's requests' User-Agent begins: Go's default names the binary."""
_LOG_TAIL_LINES = 20
_LINE_LIMIT = 256 * 2**20
"""One snapshot is one line: about 150 bytes a pod, so this is far above any soak's store."""


class OracleError(RuntimeError):
    """The oracle died, hung, or printed something that is not a snapshot."""


@dataclass(frozen=True)
class OraclePod:
    uid: str
    resource_version: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class OracleSnapshot:
    """client-go's store: `resource_version` is `LastSyncResourceVersion()` ("" before the first
    LIST), `lists` the LIST requests made so far."""

    resource_version: str
    lists: int
    pods: Mapping[str, OraclePod]

    @property
    def synced(self) -> bool:
        return self.resource_version != ""


def process_gone(pid: int) -> bool:
    """No process `pid` is left, or only its zombie (Linux /proc)."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


async def end_process_group(process: asyncio.subprocess.Process, grace: float) -> None:
    """Closes the child's stdin (it exits), then kills its process group if it lingers."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), _EXIT_GRACE)


def log_tail(path: Path, label: str) -> str:
    """The last lines of a child's log, each prefixed with `label`."""
    try:
        lines = path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return f"  (no {label} at {path})"
    return "\n".join(f"  {label}: {line}" for line in lines)


def parse_snapshot(line: bytes) -> OracleSnapshot:
    try:
        raw: Any = json.loads(line)
        pods = {
            pod["name"]: OraclePod(
                uid=pod["uid"],
                resource_version=pod["resourceVersion"],
                labels=dict(pod["labels"] or {}),
            )
            for pod in raw["pods"]
        }
        return OracleSnapshot(
            resource_version=str(raw["resourceVersion"]), lists=int(raw["lists"]), pods=pods
        )
    except (ValueError, KeyError, TypeError) as err:
        raise OracleError(f"oracle printed a line that is not a snapshot: {line[:200]!r}") from err


class OracleProcess:
    """`async with OracleProcess(...) as oracle: snap = await oracle.snapshot()`; with
    `resource` (GROUP/VERSION/RESOURCE) the oracle watches that resource as client-go's dynamic
    informer does, and its snapshot's `pods` are that resource's objects."""

    def __init__(
        self,
        *,
        binary: Path,
        kubeconfig: Path,
        namespace: str,
        selector: str,
        log_path: Path,
        watch_list: bool = False,
        resource: str = "",
        read_timeout: float = 10.0,
        exit_grace: float = _EXIT_GRACE,
    ) -> None:
        self.log_path = log_path
        self._argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--selector={selector}",
            f"--watch-list={'true' if watch_list else 'false'}",
            *([f"--resource={resource}"] if resource else []),
        ]
        self._read_timeout = read_timeout
        self._exit_grace = exit_grace
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def __aenter__(self) -> OracleProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        self._require_binary()
        self._process = await spawn_piped(self._argv, self.log_path, limit=_LINE_LIMIT)

    def _require_binary(self) -> None:
        if not Path(self._argv[0]).is_file():
            raise OracleError(
                f"oracle binary not found at {self._argv[0]}: "
                "build it with `python -m miles.utils.k8s_testenv build`"
            )

    def failure(self) -> str | None:
        """Why the oracle is not running (exit code and log tail), or None while it runs."""
        return exit_failure(self._process, "client-go oracle", self._log_tail)

    async def snapshot(self) -> OracleSnapshot:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise OracleError("the oracle is not started")
        if (problem := self.failure()) is not None:
            raise OracleError(problem)
        try:
            process.stdin.write(b"\n")
            await asyncio.wait_for(process.stdin.drain(), self._read_timeout)
            line = await asyncio.wait_for(process.stdout.readline(), self._read_timeout)
        except TimeoutError as err:
            raise OracleError(
                f"client-go oracle did not answer within {self._read_timeout:.0f}s\n"
                f"{self._log_tail()}"
            ) from err
        except (ConnectionError, BrokenPipeError) as err:
            await self._reap()
            raise OracleError(self.failure() or f"client-go oracle pipe broke: {err}") from err
        except ValueError as err:
            raise OracleError(f"client-go oracle printed an unreadable line: {err}") from err
        if not line:
            await self._reap()
            raise OracleError(self.failure() or "client-go oracle closed its stdout")
        return parse_snapshot(line)

    async def aclose(self) -> None:
        """Closes stdin (the oracle exits), then kills its process group if it lingers."""
        process, self._process = self._process, None
        if process is not None:
            await end_process_group(process, self._exit_grace)

    async def _reap(self) -> None:
        if self._process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._process.wait(), 1.0)

    def _log_tail(self) -> str:
        return log_tail(self.log_path, "oracle log")
