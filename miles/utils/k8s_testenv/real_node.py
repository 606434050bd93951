"""A real node beside a local control plane: containerd, runc and a kubelet in a private mount
namespace, plus kube-scheduler and kube-controller-manager (Go: kubeadm's single-node cluster,
without systemd or a registry).

The kubelet registers this host (node name = hostname) under its own identity
(`system:node:<hostname>`, Node authorization); the scheduler binds pods that name no node, and
the controller manager creates service accounts and runs Deployments and StatefulSets. Pods reach
the apiserver at the `kubernetes` Service's ClusterIP (one nftables DNAT rule, kube-proxy's job).
Pods use the images built here (`node_images`), never pulled.

Start-up refuses, in one line, when a prerequisite is missing (root, the Debian packages, cgroups,
overlayfs), when another real node runs on the machine, or when a killed run's node is still on
the host; a failed start stops everything it began. Teardown deletes the pods, stops every process
by its recorded PID, and undoes the host changes recorded in `host_state.HostSnapshot`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miles.utils.k8s_testenv.binaries import NodeBinaryPaths, ensure_node_binaries, print_stderr
from miles.utils.k8s_testenv.certs import Credentials
from miles.utils.k8s_testenv.component import Component
from miles.utils.k8s_testenv.errors import PrerequisiteError
from miles.utils.k8s_testenv.host_state import (
    KUBELET_START_SYSCTLS,
    ROUTE_LOCALNET,
    HostSnapshot,
    write_sysctl,
)
from miles.utils.k8s_testenv.http import get_status
from miles.utils.k8s_testenv.kubeconfig import write_kubeconfig
from miles.utils.k8s_testenv.kwok import ApiAccess
from miles.utils.k8s_testenv.node_config import (
    NodeLayout,
    cni_conflist,
    containerd_toml,
    controller_manager_argv,
    kubelet_argv,
    kubelet_configuration,
    kubernetes_service_nft,
    scheduler_argv,
)
from miles.utils.k8s_testenv.node_images import write_image_archives
from miles.utils.k8s_testenv.node_lock import LOCK_PATH, NodeLock, lock_holder
from miles.utils.k8s_testenv.ports import LOOPBACK, free_ports
from miles.utils.k8s_testenv.process import ManagedProcess, log_tail, stop_process

if TYPE_CHECKING:
    from miles.utils.k8s_testenv.control_plane import LocalControlPlane

LogFn = Callable[[str], None]

DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "nftables")
_INSTALL_HINT = (
    "run scripts/bootstrap as root, or apt-get install -y --no-install-recommends "
    + " ".join(DEBIAN_PACKAGES)
    + "; or choose KWOK with MILES_K8S_NODE=kwok"
)
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
_COMMANDS = ("containerd", "ctr", "runc", "unshare", "nsenter", "ip", "nft")
_POD_DRAIN_SECONDS = 60.0
_KUBELET_STOP_GRACE = 30.0


def node_name() -> str:
    """The kubelet registers the host under its hostname, which exec and logs resolve."""
    return socket.gethostname()


def _cni_bin_dir() -> Path | None:
    return next((d for d in CNI_BIN_DIRS if (d / "bridge").is_file()), None)


def check_prerequisites() -> None:
    """Raises `PrerequisiteError` naming the first missing prerequisite and what to do."""
    if os.geteuid() != 0:
        raise PrerequisiteError(
            "the real node needs root (containerd, runc, mount namespaces, cgroups): "
            "run as root, or choose KWOK with MILES_K8S_NODE=kwok"
        )
    missing = [command for command in _COMMANDS if shutil.which(command) is None]
    if missing:
        raise PrerequisiteError(f"the real node needs {', '.join(missing)}: {_INSTALL_HINT}")
    if _cni_bin_dir() is None:
        raise PrerequisiteError(f"no CNI bridge plugin in /usr/lib/cni: {_INSTALL_HINT}")
    mounts = Path("/proc/self/mountinfo").read_text()
    if " - cgroup" not in mounts:
        raise PrerequisiteError(
            "no cgroup filesystem is mounted (the kubelet needs cgroup v1 or v2 under "
            "/sys/fs/cgroup): mount it, or choose KWOK with MILES_K8S_NODE=kwok"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise PrerequisiteError(
            "the kernel has no overlay filesystem (containerd's snapshotter): "
            "`modprobe overlay`, or choose KWOK with MILES_K8S_NODE=kwok"
        )
    try:
        socket.gethostbyname(node_name())
    except OSError as error:
        raise PrerequisiteError(
            f"the hostname {node_name()!r} does not resolve ({error}); the apiserver reaches the "
            "kubelet by it: add it to /etc/hosts"
        ) from error


def real_node_unavailable(node_setting: str = "auto") -> str | None:
    """Why a real node cannot start here now (MILES_K8S_NODE=kwok, a missing prerequisite,
    another node holding the machine), or None."""
    if node_setting == "kwok":
        return "MILES_K8S_NODE=kwok"
    try:
        check_prerequisites()
    except PrerequisiteError as error:
        return str(error)
    return lock_holder()


def ctr(layout: NodeLayout, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """`ctr` against the node's containerd, in the kubelet's `k8s.io` namespace."""
    argv = ["ctr", "--address", str(layout.containerd_socket), "-n", "k8s.io", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def import_image(layout: NodeLayout, archive: Path) -> None:
    """`ctr images import` of an OCI archive into the node's containerd (`oci_image`)."""
    result = ctr(layout, "images", "import", str(archive), timeout=300.0)
    if result.returncode != 0:
        raise PrerequisiteError(
            f"ctr images import {archive} failed: {result.stderr.strip() or result.stdout}"
        )


class RealNode(Component):
    """The node's processes around one apiserver; `with` starts and stops them.

    `server`/`credentials` name the apiserver and hold the admin and node tokens (a
    `LocalControlPlane`'s, see `RealNode.on`). `failure()` says which component died, so waits in
    tests fail at once.
    """

    def __init__(
        self,
        *,
        binaries: NodeBinaryPaths,
        server: str,
        credentials: Credentials,
        work_dir: Path,
        start_timeout: float = 90.0,
        log: LogFn = print_stderr,
        lock_path: Path = LOCK_PATH,
    ) -> None:
        if credentials.node_token is None:
            raise ValueError("credentials carry no node token: generate them with a node_name")
        self.binaries = binaries
        self.server = server
        self.node_name = node_name()
        self.layout = NodeLayout(work_dir)
        self._credentials = credentials
        self._start_timeout = start_timeout
        self._log = log
        self._lock = NodeLock(lock_path)
        self._snapshot: HostSnapshot | None = None
        self._processes: dict[str, ManagedProcess] = {}
        self._api: ApiAccess | None = None
        self.started_seconds: float | None = None

    @classmethod
    def on(cls, plane: LocalControlPlane, *, binaries: NodeBinaryPaths | None = None) -> RealNode:
        """A node on `plane`'s cached apiserver, in `<plane folder>/node`."""
        return cls(
            binaries=binaries or ensure_node_binaries(),
            server=plane.apiserver("cached").url,
            credentials=plane.credentials,
            work_dir=plane.work_dir / "node",
        )

    @property
    def api(self) -> ApiAccess:
        if self._api is None:
            raise RuntimeError("the real node is not started")
        return self._api

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self._processes.items() if p.pid is not None}

    def start(self) -> None:
        check_prerequisites()
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self._lock.acquire(self.layout.root)
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - started

    def _start(self) -> None:
        self._snapshot = HostSnapshot.take()
        self._lock.record_snapshot(self._snapshot)
        self._write_configuration()
        self._start_runtime()
        self._import_images()
        self._start_kubelet()
        # The kubelet sets these once at start-up (KernelTunableModify); nothing needs them.
        self._snapshot.restore_sysctls(KUBELET_START_SYSCTLS)
        self._route_kubernetes_service()
        self._start_controllers()
        self._wait_schedulable()

    def _write_configuration(self) -> None:
        layout = self.layout
        for directory in (layout.etc, layout.cni_dir, layout.state):
            directory.mkdir(parents=True, exist_ok=True)
        cni_bin_dir = _cni_bin_dir()
        runc = shutil.which("runc")
        if cni_bin_dir is None or runc is None:
            raise PrerequisiteError(f"runc or the CNI plugins went missing: {_INSTALL_HINT}")
        layout.containerd_config.write_text(
            containerd_toml(layout, runc=runc, cni_bin_dir=cni_bin_dir)
        )
        (layout.cni_dir / "10-milescni.conflist").write_text(json.dumps(cni_conflist(layout)))
        port, healthz_port = free_ports(2)
        layout.kubelet_config.write_text(
            json.dumps(kubelet_configuration(layout, port=port, healthz_port=healthz_port))
        )
        ca = self._credentials.ca_cert
        node_token = self._credentials.node_token
        assert node_token is not None
        for user, token in (("kubelet", node_token), ("admin", self._credentials.admin_token)):
            write_kubeconfig(
                layout.kubeconfig(user), name=user, server=self.server, ca_cert=ca, token=token
            )
        self._api = ApiAccess.from_kubeconfig(layout.kubeconfig("admin"))

    def _process(
        self, name: str, argv: Sequence[str], ready: Callable[[], bool], timeout: float
    ) -> ManagedProcess:
        process = ManagedProcess(
            name=name,
            argv=argv,
            log_path=self.layout.root / f"{name.split()[0]}.log",
            ready=ready,
            start_timeout=timeout,
        )
        self._processes[name.split()[0]] = process
        process.start()
        return process

    def _in_namespace(self, argv: Sequence[str]) -> list[str]:
        holder = self._processes["holder"].pid
        return ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", *argv]

    def _start_runtime(self) -> None:
        holder_file = self.layout.root / "holder"
        holder_file.touch()
        own_namespace = os.readlink("/proc/self/ns/mnt")

        def holder_ready() -> bool:
            pid = self._processes["holder"].pid
            with contextlib.suppress(OSError):
                return os.readlink(f"/proc/{pid}/ns/mnt") != own_namespace
            return False

        # `tail -f` on a file of the node's folder: its command line names the folder (`down`
        # finds it), and it lives until stopped, holding the mount namespace.
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        self._process(
            "holder (private mount namespace)",
            [*unshare, "tail", "-f", str(holder_file)],
            holder_ready,
            10.0,
        )
        argv = ["containerd", "--config", str(self.layout.containerd_config)]
        self._process("containerd", self._in_namespace(argv), self._ctr_answers, 30.0)

    def _ctr_answers(self) -> bool:
        return ctr(self.layout, "version", timeout=5).returncode == 0

    def _import_images(self) -> None:
        for archive in write_image_archives(self.binaries, self.layout.root / "images"):
            self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        """`ctr images import` of an OCI archive into the node's containerd (`oci_image`)."""
        import_image(self.layout, archive)

    def _start_kubelet(self) -> None:
        argv = kubelet_argv(self.layout, binary=self.binaries.kubelet)
        self._process(
            f"kubelet (waiting for node {self.node_name} to report Ready)",
            self._in_namespace(argv),
            self._node_ready,
            self._start_timeout,
        )

    def _node(self) -> dict[str, Any] | None:
        try:
            node: dict[str, Any] = self.api.request("GET", f"/api/v1/nodes/{self.node_name}")
        except OSError:
            return None
        return node

    def _node_ready(self) -> bool:
        node = self._node() or {}
        conditions = node.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _route_kubernetes_service(self) -> None:
        """What kube-proxy does for the `kubernetes` Service, reduced to one rule: a pod dialing
        its ClusterIP (`KUBERNETES_SERVICE_HOST`) reaches the loopback apiserver, whose certificate
        names that IP; the table and the sysctl are undone with the host snapshot."""
        port = urllib.parse.urlsplit(self.server).port
        write_sysctl(ROUTE_LOCALNET, "1")
        rules = kubernetes_service_nft(apiserver_port=port or 443)
        result = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if result.returncode != 0:
            raise PrerequisiteError(f"nft could not route the kubernetes Service: {result.stderr}")

    def _start_controllers(self) -> None:
        scheduler_port, manager_port = free_ports(2)
        layout = self.layout
        self._process(
            "kube-scheduler",
            scheduler_argv(layout, binary=self.binaries.kube_scheduler, port=scheduler_port),
            _healthz(scheduler_port),
            self._start_timeout,
        )
        argv = controller_manager_argv(
            layout,
            binary=self.binaries.kube_controller_manager,
            port=manager_port,
            service_account_key=self._credentials.service_account_key,
            ca_cert=self._credentials.ca_cert,
        )
        self._process("kube-controller-manager", argv, _healthz(manager_port), self._start_timeout)

    def _wait_schedulable(self) -> None:
        """Until the node lifecycle controller lifted the not-ready taint and the service-account
        controller created `default/default`: then pods without nodeName get scheduled here."""
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            if (problem := self.failure()) is not None:
                raise PrerequisiteError(f"the real node stopped during start-up: {problem}")
            node = self._node() or {}
            taints = node.get("spec", {}).get("taints") or []
            if not taints and self._has_default_service_account():
                return
            time.sleep(0.1)
        raise PrerequisiteError(
            f"node {self.node_name} still tainted or no default service account after "
            f"{self._start_timeout:.0f}s; logs in {self.layout.root}"
        )

    def _has_default_service_account(self) -> bool:
        try:
            self.api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
        except OSError:
            return False
        return True

    def failure(self) -> str | None:
        """Which component is not running any more (with its log tail), or None."""
        for name, process in self._processes.items():
            if process.pid is not None and not process.running:
                return f"{name} is not running\n  log (tail):\n{log_tail(process.log_path)}"
        return None

    def stop(self) -> None:
        """Deletes the pods, stops every component, undoes the host changes; idempotent."""
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._stop(name)
        if "kubelet" in self._processes:
            self._drain_pods()
        self._stop("kubelet", grace=_KUBELET_STOP_GRACE)
        if "containerd" in self._processes:
            self._remove_leftover_containers()
        self._stop("containerd")
        self._kill_leftover_shims()
        self._stop("holder", grace=5.0)
        if self._snapshot is not None:
            for what in self._snapshot.restore():
                self._log(f"k8s_testenv: the real node left behind: {what}")
            self._lock.record_snapshot(None)
            self._snapshot = None
        self._processes.clear()
        self._lock.release()

    def _stop(self, name: str, *, grace: float = 10.0) -> None:
        process = self._processes.get(name)
        if process is not None:
            process.stop(grace=grace)

    def _drain_pods(self) -> None:
        """Graceful deletion with 1 s of grace, so the kubelet stops each sandbox and CNI frees
        its address and veth; waits until no pod is bound to the node."""
        selector = f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node_name}"
        deadline = time.monotonic() + _POD_DRAIN_SECONDS
        try:
            while time.monotonic() < deadline and self._processes["kubelet"].running:
                pods = self.api.request("GET", selector)["items"]
                if not pods:
                    return
                for pod in pods:
                    meta = pod["metadata"]
                    if meta.get("deletionTimestamp") is None:
                        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                        with contextlib.suppress(urllib.error.HTTPError):
                            self.api.request("DELETE", path, {"gracePeriodSeconds": 1})
                time.sleep(0.2)
        except OSError as error:
            self._log(f"k8s_testenv: could not delete the real node's pods ({error}); killing them")

    def _remove_leftover_containers(self) -> None:
        tasks = ctr(self.layout, "tasks", "list", "-q", timeout=10).stdout.split()
        for task in tasks:
            ctr(self.layout, "tasks", "kill", "-s", "SIGKILL", task, timeout=10)
            ctr(self.layout, "tasks", "delete", "-f", task, timeout=10)
        containers = ctr(self.layout, "containers", "list", "-q", timeout=10).stdout.split()
        if containers:
            ctr(self.layout, "containers", "delete", *containers, timeout=10)

    def _kill_leftover_shims(self) -> None:
        """Shims outlive containerd by design; each names the node's socket on its command line."""
        marker = str(self.layout.root).encode()
        own = {p.pid for p in self._processes.values() if p.pid is not None}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in own:
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"containerd-shim" in cmdline and marker in cmdline:
                    stop_process(int(entry.name), grace=5.0)


def _healthz(port: int) -> Callable[[], bool]:
    import ssl

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return lambda: get_status(f"https://{LOOPBACK}:{port}/healthz", context=insecure) == 200


class RealNodeAddon:
    """`ControlPlaneAddon` running a `RealNode` on the plane's cached apiserver:
    `LocalControlPlane(addons=[RealNodeAddon()])` starts it after the apiservers, stops it first."""

    def __init__(self, *, binaries: NodeBinaryPaths | None = None) -> None:
        self._binaries = binaries
        self.node: RealNode | None = None

    def start(self, plane: LocalControlPlane) -> None:
        self.node = RealNode.on(plane, binaries=self._binaries)
        self.node.start()

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
            self.node = None
