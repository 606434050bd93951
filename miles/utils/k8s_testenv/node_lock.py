"""One real node per machine: a lock file held while it runs, naming its owner and folder (Go: none;
kubelets collide on ports, `/run/containerd`, `/kubepods`, the bridge and the sysctls).

The lock is an `flock` on a file in /tmp, released by the kernel when its holder dies. The file
also records the node's folder and the host snapshot taken before it started, until its teardown
finished: so the next start can tell a node left behind by a killed run, and `down` can undo it
even when the folder is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from miles.utils.k8s_testenv.errors import PrerequisiteError
from miles.utils.k8s_testenv.host_state import HostSnapshot

LOCK_PATH = Path("/tmp/miles-k8s-real-node.lock")


@dataclass(frozen=True)
class NodeRecord:
    owner_pid: int
    node_dir: Path
    snapshot: HostSnapshot | None

    def processes(self) -> list[int]:
        """Processes whose command line names the node's folder (containerd, kubelet, shims)."""
        marker = str(self.node_dir).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if marker in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
        return found

    def left_behind(self) -> bool:
        return self.snapshot is not None or bool(self.processes())


def _read(handle: IO[str]) -> NodeRecord | None:
    handle.seek(0)
    try:
        raw = json.loads(handle.read() or "null")
        snapshot = raw.get("snapshot")
        return NodeRecord(
            owner_pid=int(raw["owner_pid"]),
            node_dir=Path(raw["node_dir"]),
            snapshot=HostSnapshot.from_json(snapshot) if snapshot is not None else None,
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _write(handle: IO[str], record: dict[str, object]) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(record))
    handle.flush()


class NodeLock:
    """`acquire` refuses, in one line, while another real node runs or a killed one's remains are
    still on the host; `release` lets the next one start."""

    def __init__(self, path: Path = LOCK_PATH) -> None:
        self.path = path
        self._handle: IO[str] | None = None
        self._record: dict[str, object] = {}

    def acquire(self, node_dir: Path) -> None:
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = _read(handle)
            handle.close()
            holder = f" (owner pid {record.owner_pid}, {record.node_dir})" if record else ""
            raise PrerequisiteError(
                f"a real node is already running on this machine{holder}; only one runs at a "
                "time: wait for it, or stop it with `python -m miles.utils.k8s_testenv down --all`"
            ) from None
        previous = _read(handle)
        if previous is not None and previous.left_behind():
            handle.close()
            raise PrerequisiteError(
                f"a real node left by a killed run or by `env up` is still on this host "
                f"({previous.node_dir}, owner pid {previous.owner_pid} gone): stop it with "
                "`python -m miles.utils.k8s_testenv down`"
            )
        self._record = {"owner_pid": os.getpid(), "node_dir": str(node_dir), "snapshot": None}
        _write(handle, self._record)
        self._handle = handle

    def record_snapshot(self, snapshot: HostSnapshot | None) -> None:
        """Keeps what to undo beside the lock until teardown finished (None: nothing left)."""
        if self._handle is None:
            raise RuntimeError("the real-node lock is not held")
        self._record["snapshot"] = snapshot.to_json() if snapshot is not None else None
        _write(self._handle, self._record)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.truncate(0)
            self._handle.close()
            self._handle = None


@contextlib.contextmanager
def _try_lock(path: Path) -> Iterator[tuple[IO[str] | None, NodeRecord | None]]:
    """The lock file's handle if the lock could be taken (held for the block), else None, and
    its record either way."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None, _read(handle)
            return
        yield handle, _read(handle)


def lock_holder(path: Path = LOCK_PATH) -> str | None:
    """Why a real node cannot start now (one runs, or a killed run's is left), or None."""
    if not path.exists():
        return None
    with _try_lock(path) as (handle, record):
        if handle is None:
            owner = f" (owner pid {record.owner_pid})" if record is not None else ""
            return f"a real node is already running on this machine{owner}"
        if record is not None and record.left_behind():
            return f"a real node left by a killed run or by `env up` is still in {record.node_dir}"
        return None


def clean_leftover_node(
    log: Callable[[str], None], *, within: Sequence[Path] | None = None, path: Path = LOCK_PATH
) -> bool:
    """Stops what a real node whose owner is gone left (its processes, cgroups, bridge, sysctls,
    host folders), if its folder is under one of `within` (any, when None); False when there is
    none, or a live node holds the lock."""
    if not path.exists():
        return False
    with _try_lock(path) as (handle, record):
        if handle is None or record is None or not record.left_behind():
            return False
        if within is not None and not any(record.node_dir.is_relative_to(d) for d in within):
            return False
        for pid in record.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        remaining = record.snapshot.restore() if record.snapshot is not None else []
        handle.truncate(0)
        log(f"k8s_testenv: cleaned up the real node left in {record.node_dir}")
        for what in remaining:
            log(f"k8s_testenv: still on the host after cleaning up: {what}")
        return True
