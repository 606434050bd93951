"""State files of running control planes, so `down` can stop kept or orphaned ones. Go: kwokctl's
per-user cluster folders (`~/.kwok/clusters/NAME`).

Every local control plane records itself in `planes/<name>.json` under the user's state folder
(`$XDG_STATE_HOME/miles-reconcile`, see `user_dirs`) while it runs, with the pid of the Python
process that owns it, or no owner once it was left running on purpose. Its name is the name of its
temporary folder (`miles-k8s-...`). Being per user, `down` sees only this user's planes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from miles.utils.k8s_testenv.errors import UnknownPlaneError
from miles.utils.k8s_testenv.node_lock import clean_leftover_node
from miles.utils.k8s_testenv.process import stop_process_group
from miles.utils.k8s_testenv.user_dirs import user_state_dir

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningPlane:
    state_file: Path
    work_dir: Path
    pids: dict[str, int]
    kubeconfigs: dict[str, str]
    owner_pid: int | None

    @property
    def name(self) -> str:
        return self.work_dir.name

    @property
    def owner(self) -> str:
        """Who holds the plane, in words, for a listing."""
        if self.owner_pid is None:
            return "left running"
        return f"owned by pid {self.owner_pid}" + ("" if _alive(self.owner_pid) else " (gone)")

    @property
    def abandoned(self) -> bool:
        """Left running on purpose, or its owner is gone (the orphans of a killed test run)."""
        return self.owner_pid is None or not _alive(self.owner_pid)


def state_dir() -> Path:
    return user_state_dir() / "planes"


def state_file(work_dir: Path) -> Path:
    return state_dir() / f"{work_dir.name}.json"


def write_state(
    *, work_dir: Path, pids: dict[str, int], kubeconfigs: dict[str, str], owner_pid: int | None
) -> Path:
    """Records one running control plane; its file is named after its temporary folder."""
    path = state_file(work_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "work_dir": str(work_dir),
        "owner_pid": owner_pid,
        "pids": pids,
        "kubeconfigs": kubeconfigs,
    }
    path.write_text(json.dumps(state, indent=2) + "\n")
    return path


def running_planes() -> list[RunningPlane]:
    directory = state_dir()
    if not directory.is_dir():
        return []
    planes = []
    for path in sorted(directory.glob("*.json")):
        try:
            planes.append(_read_state(path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            _log.warning(
                "ignoring unreadable state file %s (%s: %s); remove it",
                path,
                type(exc).__name__,
                exc,
            )
    return planes


def planes_named(names: Sequence[str]) -> list[RunningPlane]:
    """The running planes with these names, in the order given; an unknown name is an error."""
    running = {plane.name: plane for plane in running_planes()}
    unknown = [name for name in names if name not in running]
    if unknown:
        raise UnknownPlaneError(name=unknown[0], running=sorted(running))
    return [running[name] for name in names]


def _read_state(path: Path) -> RunningPlane:
    state = json.loads(path.read_text())
    owner = state.get("owner_pid")
    return RunningPlane(
        state_file=path,
        work_dir=Path(state["work_dir"]),
        pids={name: int(pid) for name, pid in state["pids"].items()},
        kubeconfigs=dict(state["kubeconfigs"]),
        owner_pid=int(owner) if owner is not None else None,
    )


def stop_plane(plane: RunningPlane) -> None:
    """Stops the recorded process groups (latest started first) and any other process whose
    command line names the plane's folder, then removes the folder and the state file. A real node
    in the folder whose owner is gone is stopped first and its host changes undone."""
    clean_leftover_node(_log.warning, within=[plane.work_dir])
    for pid in reversed(list(plane.pids.values())):
        if _runs_in(pid, plane.work_dir):
            stop_process_group(pid)
    for pid in _pids_running_in(plane.work_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(plane.work_dir, ignore_errors=True)
    plane.state_file.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _runs_in(pid: int, work_dir: Path) -> bool:
    """Whether `pid` still is one of ours: its command line names the plane's folder."""
    return str(work_dir).encode() in _cmdline(pid)


def _pids_running_in(work_dir: Path) -> list[int]:
    own = os.getpid()
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if pid != own and _runs_in(pid, work_dir)]
