"""One leader-election candidate as a child process: ours (`python -m ...leader_candidate`) or
client-go's (`tools/k8s/leader-candidate`), the same command line and the same JSON lines.

Go counterpart: none; this drives the process and collects its lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from miles.utils.k8s_testenv.process import spawn_piped
from miles.utils.k8s_testenv.testing.leader_interop.records import CandidateLine, Side, Timing

_log = logging.getLogger(__name__)
OURS_MODULE = "miles.utils.k8s_testenv.testing.leader_candidate"
_EXIT_GRACE = 15.0


def ours_available() -> bool:
    return importlib.util.find_spec(OURS_MODULE) is not None


@dataclass(frozen=True)
class CandidateCommand:
    """How to start a candidate of either side against one Lease."""

    go_binary: Path
    namespace: str
    lease: str
    timing: Timing

    def argv(self, side: Side, kubeconfig: Path, identity: str) -> list[str]:
        program = [sys.executable, "-m", OURS_MODULE] if side == "ours" else [str(self.go_binary)]
        return [
            *program,
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            self.namespace,
            "--lease",
            self.lease,
            "--identity",
            identity,
            *self.timing.flags(),
        ]


class CandidateProcess:
    """A running candidate: its lines go to `sink`, its stderr to `log_path`."""

    def __init__(
        self,
        argv: list[str],
        identity: str,
        log_path: Path,
        sink: Callable[[CandidateLine], None],
    ) -> None:
        self.identity = identity
        self._argv = argv
        self._log_path = log_path
        self._sink = sink
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.bad_lines: list[str] = []

    async def start(self) -> None:
        self._process = await spawn_piped(
            self._argv, self._log_path, stdin=asyncio.subprocess.DEVNULL
        )
        self._reader = asyncio.create_task(self._read(), name=f"candidate-{self.identity}")

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    def signal(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    async def wait(self, seconds: float) -> int | None:
        """The exit status, or None if it still runs after `seconds`."""
        assert self._process is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._process.wait(), seconds)
        return self._process.returncode

    async def stop(self) -> int | None:
        """SIGCONT (it may be stopped), SIGTERM, then SIGKILL after a grace period; returns
        the exit status, and drains its lines."""
        if self._process is None:
            return None
        if self._process.returncode is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            if await self.wait(_EXIT_GRACE) is None:
                self.signal(signal.SIGKILL)
                await self.wait(_EXIT_GRACE)
        if self._reader is not None:
            await self._reader
        return self._process.returncode

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        async for raw in self._process.stdout:
            text = raw.decode(errors="replace").strip()
            if not text:
                continue
            try:
                self._sink(CandidateLine.parse(json.loads(text)))
            except ValueError as err:
                self.bad_lines.append(text)
                _log.warning("candidate %s printed a bad line: %s", self.identity, err)
