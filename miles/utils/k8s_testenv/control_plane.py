"""etcd plus two kube-apiservers on loopback (Go: envtest's `controlplane.ControlPlane`).

The "cached" apiserver runs with the watch cache on (the default), the "uncached" one with
`--watch-cache=false`, both on the same etcd, so a test sees the same objects through either.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from miles.utils.k8s_testenv.apiserver import KubeApiServer
from miles.utils.k8s_testenv.binaries import BinaryPaths, ensure_binaries, print_stderr
from miles.utils.k8s_testenv.certs import Credentials, generate_credentials
from miles.utils.k8s_testenv.component import Component
from miles.utils.k8s_testenv.errors import FaultUnsupportedError
from miles.utils.k8s_testenv.etcd import Etcd
from miles.utils.k8s_testenv.ports import free_ports
from miles.utils.k8s_testenv.process import ManagedProcess, ReadyCheck
from miles.utils.k8s_testenv.settings import EnvSettings
from miles.utils.k8s_testenv.state import state_file, write_state

ApiServerName = Literal["cached", "uncached"]


class ControlPlane(Protocol):
    """What tests use: two kubeconfigs and the faults (which may be unsupported)."""

    @property
    def cached_kubeconfig(self) -> Path: ...

    @property
    def uncached_kubeconfig(self) -> Path: ...

    def restart_apiserver(self, name: ApiServerName) -> None: ...

    def etcd_revision(self) -> int: ...

    def compact_etcd(self) -> int: ...

    def stop_etcd(self) -> None: ...

    def start_etcd(self) -> None: ...

    def snapshot_etcd(self) -> Path: ...

    def restore_etcd(self, snapshot: Path, *, stop_apiservers: bool = False) -> None: ...


class ControlPlaneAddon(Protocol):
    """A component started after the apiservers and stopped before them (e.g. KWOK)."""

    def start(self, plane: LocalControlPlane) -> None: ...

    def stop(self) -> None: ...


class LocalControlPlane(Component):
    """Starts etcd and both apiservers in a temporary folder; `with` stops them and removes it.

    With `keep=True` (MILES_K8S_KEEP=1) leaving the `with` block leaves everything running,
    records it for `python -m miles.utils.k8s_testenv down` and prints how to reach it.
    """

    def __init__(
        self,
        *,
        binaries: BinaryPaths | None = None,
        settings: EnvSettings | None = None,
        addons: Sequence[ControlPlaneAddon] = (),
        keep: bool | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self._settings = settings or EnvSettings.from_env()
        self._binaries = binaries
        self._addons = list(addons)
        self.keep = self._settings.keep if keep is None else keep
        self._announce = announce or print_stderr
        self._processes: list[ManagedProcess] = []
        self._started_addons: list[ControlPlaneAddon] = []
        self._work_dir: Path | None = None
        self._etcd: Etcd | None = None
        self._credentials: Credentials | None = None
        self._apiservers: dict[ApiServerName, KubeApiServer] = {}

    def __exit__(self, *exc_info: object) -> None:
        if self.keep:
            self.leave_running()
        else:
            self.stop()

    @property
    def work_dir(self) -> Path:
        return _started(self._work_dir)

    @property
    def binaries(self) -> BinaryPaths:
        if self._binaries is None:
            self._binaries = ensure_binaries(settings=self._settings)
        return self._binaries

    @property
    def etcd(self) -> Etcd:
        return _started(self._etcd)

    @property
    def credentials(self) -> Credentials:
        """The plane's CA, keys and tokens, including a node token for this host's kubelet."""
        return _started(self._credentials)

    def apiserver(self, name: ApiServerName) -> KubeApiServer:
        return self._apiservers[name]

    @property
    def cached_kubeconfig(self) -> Path:
        return self.apiserver("cached").kubeconfig

    @property
    def uncached_kubeconfig(self) -> Path:
        return self.apiserver("uncached").kubeconfig

    def start(self) -> None:
        binaries = self.binaries
        self._work_dir = Path(tempfile.mkdtemp(prefix="miles-k8s-"))
        try:
            self._start_components(binaries)
            self._record(owner_pid=os.getpid())
        except BaseException:
            self.stop()
            raise

    def _record(self, *, owner_pid: int | None) -> Path:
        return write_state(
            work_dir=self.work_dir,
            pids={p.name: p.pid for p in self._processes if p.pid is not None},
            kubeconfigs={n: str(a.kubeconfig) for n, a in self._apiservers.items()},
            owner_pid=owner_pid,
        )

    def _start_components(self, binaries: BinaryPaths) -> None:
        work_dir = self.work_dir
        credentials = generate_credentials(work_dir / "pki", node_name=socket.gethostname())
        self._credentials = credentials
        etcd_client, etcd_peer, cached_port, uncached_port = free_ports(4)
        self._etcd = Etcd(
            binary=binaries.etcd,
            data_dir=work_dir / "etcd",
            log_path=work_dir / "etcd.log",
            client_port=etcd_client,
            peer_port=etcd_peer,
        )
        self._processes.append(self._etcd.process)
        self._etcd.start()
        ports: dict[ApiServerName, int] = {"cached": cached_port, "uncached": uncached_port}
        for name, port in ports.items():
            apiserver = KubeApiServer(
                name=name,
                binary=binaries.kube_apiserver,
                port=port,
                etcd_url=self._etcd.client_url,
                credentials=credentials,
                watch_cache=name == "cached",
                work_dir=work_dir,
            )
            self._apiservers[name] = apiserver
            self._processes.append(apiserver.process)
            apiserver.process.launch()
        for apiserver in self._apiservers.values():
            apiserver.process.wait_ready()
        for addon in self._addons:
            self._started_addons.append(addon)
            addon.start(self)

    def start_process(
        self, *, name: str, argv: Sequence[str], ready: ReadyCheck, start_timeout: float = 90.0
    ) -> ManagedProcess:
        """Starts an extra process (for an addon) that is stopped with the control plane."""
        process = ManagedProcess(
            name=name,
            argv=argv,
            log_path=self.work_dir / f"{name}.log",
            ready=ready,
            start_timeout=start_timeout,
        )
        self._processes.append(process)
        process.start()
        return process

    def stop(self) -> None:
        """Stops addons, extra processes, apiservers and etcd, then removes the folder."""
        while self._started_addons:
            self._started_addons.pop().stop()
        while self._processes:
            self._processes.pop().stop()
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            state_file(self._work_dir).unlink(missing_ok=True)
            self._work_dir = None

    def leave_running(self) -> Path:
        """Records the processes as having no owner, for `down`, and prints how to reach them."""
        state = self._record(owner_pid=None)
        self._announce(self.describe(state_file=state))
        return state

    def describe(self, *, state_file: Path | None = None) -> str:
        lines = [f"k8s_testenv: control plane in {self.work_dir}"]
        for name, apiserver in self._apiservers.items():
            lines.append(f"  {name:<8} {apiserver.url}  kubeconfig {apiserver.kubeconfig}")
        lines.append(f"  etcd     {self.etcd.client_url}")
        lines.append(f"export KUBECONFIG={self.cached_kubeconfig}")
        if state_file is not None:
            lines.append(
                f"stop it with: python -m miles.utils.k8s_testenv down {self.work_dir.name}"
            )
        return "\n".join(lines)

    def restart_apiserver(self, name: ApiServerName) -> None:
        self.apiserver(name).restart()

    def etcd_revision(self) -> int:
        return self.etcd.revision()

    def compact_etcd(self) -> int:
        return self.etcd.compact_to_head()

    def stop_etcd(self) -> None:
        self.etcd.stop()

    def start_etcd(self) -> None:
        self.etcd.start()

    def snapshot_etcd(self) -> Path:
        """An offline copy of etcd's data (etcd is stopped for it), for `restore_etcd`."""
        snapshots = self.work_dir / "etcd-snapshots"
        snapshots.mkdir(exist_ok=True)
        return self.etcd.snapshot(snapshots / f"snapshot-{len(list(snapshots.iterdir()))}")

    def restore_etcd(self, snapshot: Path, *, stop_apiservers: bool = False) -> None:
        """Rolls etcd back to `snapshot`; the apiservers keep running and reconnect, or, with
        `stop_apiservers`, are stopped before the restore and started after it (the documented
        procedure: a running apiserver keeps serving what it cached)."""
        apiservers = list(self._apiservers.values()) if stop_apiservers else []
        for apiserver in apiservers:
            apiserver.stop()
        try:
            self.etcd.restore(snapshot)
        finally:
            for apiserver in apiservers:
                apiserver.process.launch()
            for apiserver in apiservers:
                apiserver.process.wait_ready()


class ExternalControlPlane:
    """A cluster reused through MILES_K8S_KUBECONFIG: both kubeconfigs are that file; faults that
    need our own etcd or apiserver processes raise `FaultUnsupportedError`."""

    def __init__(self, *, kubeconfig: Path) -> None:
        self._kubeconfig = kubeconfig

    @property
    def cached_kubeconfig(self) -> Path:
        return self._kubeconfig

    @property
    def uncached_kubeconfig(self) -> Path:
        return self._kubeconfig

    def _unsupported(self, fault: str) -> FaultUnsupportedError:
        return FaultUnsupportedError(
            f"{fault} needs the local control plane's own processes, but MILES_K8S_KUBECONFIG="
            f"{self._kubeconfig} reuses an existing cluster"
        )

    def restart_apiserver(self, name: ApiServerName) -> None:
        raise self._unsupported(f"restarting the {name} apiserver")

    def etcd_revision(self) -> int:
        raise self._unsupported("reading the etcd revision")

    def compact_etcd(self) -> int:
        raise self._unsupported("compacting etcd")

    def stop_etcd(self) -> None:
        raise self._unsupported("stopping etcd")

    def start_etcd(self) -> None:
        raise self._unsupported("starting etcd")

    def snapshot_etcd(self) -> Path:
        raise self._unsupported("taking an etcd snapshot")

    def restore_etcd(self, snapshot: Path, *, stop_apiservers: bool = False) -> None:
        raise self._unsupported("restoring etcd from a snapshot")


_T = TypeVar("_T")


def _started(part: _T | None) -> _T:
    """A part the plane has once started, or the error of asking for it before."""
    if part is None:
        raise RuntimeError("the control plane is not started")
    return part
