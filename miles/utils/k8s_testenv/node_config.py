"""The real node's configuration files and command lines (Go: kubeadm's generated kubelet and
control-plane manifests, reduced to one loopback node without systemd).

Every path lives under the node's folder, so nothing outside it is configured; the few host paths
the runtime writes anyway are listed in `host_state.HOST_PATHS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv.node_images import PAUSE_IMAGE
from miles.utils.k8s_testenv.ports import KUBERNETES_SERVICE_IP, LOOPBACK

CNI_NETWORK = "milescni"
NFT_TABLE = "milesnode"
CNI_BRIDGE = "milescni0"
POD_SUBNET = "10.244.0.0/24"
MAX_RESTART_BACKOFF = "5s"
"""The kubelet's crash-loop back-off cap (KubeletCrashLoopBackOffMax; 300 s on a real cluster), so
a crash loop shows CrashLoopBackOff and still restarts every 5 s."""


@dataclass(frozen=True)
class NodeLayout:
    """The node's folder: `etc` for configuration, `state` for what the components write."""

    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.etc / "containerd.toml"

    @property
    def cni_dir(self) -> Path:
        return self.etc / "cni" / "net.d"

    @property
    def kubelet_config(self) -> Path:
        return self.etc / "kubelet.json"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    def kubeconfig(self, user: str) -> Path:
        return self.etc / f"{user}.kubeconfig"


def containerd_toml(layout: NodeLayout, *, runc: str, cni_bin_dir: Path) -> str:
    containerd = layout.state / "containerd"
    disabled = [
        "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.zfs",
        "io.containerd.snapshotter.v1.devmapper",
        "io.containerd.snapshotter.v1.aufs",
        "io.containerd.tracing.processor.v1.otlp",
        "io.containerd.internal.v1.tracing",
    ]
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    # restrict_oom_score_adj: without CAP_SYS_RESOURCE runc cannot lower a score below 0 and the
    # pause container fails to start ("can't get final child's PID from pipe").
    return f"""version = 2
root = "{containerd / "root"}"
state = "{containerd / "state"}"
disabled_plugins = {json.dumps(disabled)}
[grpc]
  address = "{layout.containerd_socket}"
[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "{containerd / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  restrict_oom_score_adj = true
  max_container_log_line_size = 16384
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{cni_bin_dir}"
    conf_dir = "{layout.cni_dir}"
    max_conf_num = 1
"""


def cni_conflist(layout: NodeLayout) -> dict[str, Any]:
    """A bridge without masquerading: no iptables rules; the plugin sets net.ipv4.ip_forward=1."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.state / "cni-ipam"),
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def kubelet_configuration(layout: NodeLayout, *, port: int, healthz_port: int) -> dict[str, Any]:
    endpoint = f"unix://{layout.containerd_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        # kubelet >= 1.35 refuses a cgroup v1 host unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False,
        "address": LOOPBACK,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": LOOPBACK,
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # Eviction and image GC off: a collected image could not be pulled back.
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "podLogsDir": str(layout.state / "pod-logs"),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "makeIPTablesUtilChains": False,
        "volumePluginDir": str(layout.kubelet_root / "volume-plugins"),
        "crashLoopBackOff": {"maxContainerRestartPeriod": MAX_RESTART_BACKOFF},
    }


def kubelet_argv(layout: NodeLayout, *, binary: Path) -> list[str]:
    return [
        str(binary),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        "--v=2",
    ]


def scheduler_argv(layout: NodeLayout, *, binary: Path, port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={layout.kubeconfig('admin')}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
    ]


def controller_manager_argv(
    layout: NodeLayout, *, binary: Path, port: int, service_account_key: Path, ca_cert: Path
) -> list[str]:
    """Admin credentials for every controller (no per-controller service accounts), the signing
    key for service-account tokens, and the CA published into each namespace."""
    return [
        str(binary),
        f"--kubeconfig={layout.kubeconfig('admin')}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        "--use-service-account-credentials=false",
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={ca_cert}",
        "--allocate-node-cidrs=false",
        "--controllers=*,-bootstrapsigner,-tokencleaner,-csrsigning,-csrapproving,-csrcleaner",
    ]


def kubernetes_service_nft(*, apiserver_port: int) -> str:
    """An nftables table sending the `kubernetes` Service's ClusterIP:443 to the loopback apiserver
    (needs `route_localnet`, as kube-proxy's localhost NodePorts do)."""
    return f"""table ip {NFT_TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {KUBERNETES_SERVICE_IP} tcp dport 443 dnat to {LOOPBACK}:{apiserver_port}
  }}
}}
"""
