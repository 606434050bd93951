"""What a real node changes on the host, recorded before it starts and undone after it stops
(Go: none; the kubelet and the CNI plugins leave these behind by design).

Recorded: the sysctls the kubelet (KernelTunableModify) and the bridge plugin set, the host
folders the runtime writes outside its own state folder, the cgroups in each hierarchy, the
network links and the nftables tables. `restore` puts each back and returns what it could not;
`differences` says what still differs, so a test can assert a clean host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KUBELET_START_SYSCTLS = (
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
"""Set once when the kubelet starts (the bridge plugin sets ip_forward at each pod's setup)."""
ROUTE_LOCALNET = "net.ipv4.conf.all.route_localnet"
"""Set by the real node so the `kubernetes` Service's DNAT to the loopback apiserver routes (what
kube-proxy sets for its localhost NodePorts)."""
SYSCTLS = ("net.ipv4.ip_forward", ROUTE_LOCALNET, *KUBELET_START_SYSCTLS)

HOST_PATHS = (
    "/run/containerd",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/run/mount",
    "/usr/libexec/kubernetes",
    "/etc/cni",
    "/opt/cni",
)
"""Written by containerd's shims and runc (hard-coded `/run/containerd`), libcni's result cache,
the kubelet's device-plugin folder and log symlinks, and mount(8)."""

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_OWN_LINK_PREFIXES = ("milescni", "veth")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str:
    return _sysctl_path(name).read_text().strip()


def write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value + "\n")


def cgroup_hierarchies() -> list[Path]:
    """The mount points of every cgroup (v1) and cgroup2 hierarchy, from /proc/self/mountinfo."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        if len(fields) == 2 and fields[1].split()[0] in {"cgroup", "cgroup2"}:
            found.append(Path(fields[0].split()[4]))
    return sorted(set(found))


def _cgroup_children(hierarchy: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(entry.name for entry in hierarchy.iterdir() if entry.is_dir())
    return []


def _links() -> list[str]:
    return sorted(os.listdir("/sys/class/net"))


def _nft_tables() -> list[str]:
    nft = shutil.which("nft")
    if nft is None:
        return []
    listed = subprocess.run([nft, "list", "tables"], capture_output=True, text=True, check=False)
    return sorted(line.removeprefix("table ").strip() for line in listed.stdout.splitlines())


@dataclass(frozen=True)
class HostSnapshot:
    sysctls: dict[str, str]
    absent_paths: tuple[str, ...]
    cgroups: dict[str, list[str]]
    links: tuple[str, ...]
    nft_tables: tuple[str, ...]

    @classmethod
    def take(cls) -> HostSnapshot:
        return cls(
            sysctls={name: read_sysctl(name) for name in SYSCTLS if _sysctl_path(name).exists()},
            absent_paths=tuple(p for p in HOST_PATHS if not os.path.lexists(p)),
            cgroups={str(h): _cgroup_children(h) for h in cgroup_hierarchies()},
            links=tuple(_links()),
            nft_tables=tuple(_nft_tables()),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> HostSnapshot:
        return cls(
            sysctls=dict(raw["sysctls"]),
            absent_paths=tuple(raw["absent_paths"]),
            cgroups={k: list(v) for k, v in raw["cgroups"].items()},
            links=tuple(raw["links"]),
            nft_tables=tuple(raw["nft_tables"]),
        )

    def new_cgroups(self) -> list[Path]:
        """Cgroups created since the snapshot, below each hierarchy's root."""
        return [
            Path(hierarchy) / child
            for hierarchy, before in self.cgroups.items()
            for child in _cgroup_children(Path(hierarchy))
            if child not in before
        ]

    def new_links(self) -> list[str]:
        """New links named like the node's bridge and its pods' veths."""
        return [
            link
            for link in _links()
            if link not in self.links and link.startswith(_OWN_LINK_PREFIXES)
        ]

    def new_nft_tables(self) -> list[str]:
        return [table for table in _nft_tables() if table not in self.nft_tables]

    def restore_sysctls(self, names: tuple[str, ...] = SYSCTLS) -> None:
        for name in names:
            if name in self.sysctls and read_sysctl(name) != self.sysctls[name]:
                write_sysctl(name, self.sysctls[name])

    def differences(self) -> list[str]:
        """What still differs from the snapshot, one phrase each; empty when the host is clean."""
        found = [
            f"sysctl {name}={read_sysctl(name)} (was {value})"
            for name, value in self.sysctls.items()
            if read_sysctl(name) != value
        ]
        found += [f"path {p} exists (it did not)" for p in self.absent_paths if os.path.lexists(p)]
        found += [f"cgroup {path}" for path in self.new_cgroups()]
        found += [f"network link {link}" for link in self.new_links()]
        found += [f"nftables table {table}" for table in self.new_nft_tables()]
        return found

    def restore(self) -> list[str]:
        """Undoes every recorded change; returns what is still different afterwards."""
        for cgroup in self.new_cgroups():
            remove_cgroup_tree(cgroup)
        for link in self.new_links():
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        for table in self.new_nft_tables():
            subprocess.run(["nft", "delete", "table", *table.split()], capture_output=True)
        self.restore_sysctls()
        for path in self.absent_paths:
            if path == "/run/mount":
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
        return self.differences()


def cgroup_processes(cgroup: Path) -> list[int]:
    pids: list[int] = []
    for procs in cgroup.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(line) for line in procs.read_text().split()]
    return pids


def remove_cgroup_tree(cgroup: Path, *, grace: float = 5.0) -> None:
    """Kills what still runs in `cgroup` (container processes of a killed run), then removes it
    and its children deepest first."""
    deadline = time.monotonic() + grace
    while (pids := cgroup_processes(cgroup)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        for directory in sorted(
            (p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()
        cgroup.rmdir()
