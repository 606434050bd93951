"""A kube-apiserver on a loopback port (Go: envtest's `controlplane.APIServer`)."""

from __future__ import annotations

from pathlib import Path

from miles.utils.k8s_testenv.certs import Credentials
from miles.utils.k8s_testenv.http import get_status, tls_context
from miles.utils.k8s_testenv.kubeconfig import write_kubeconfig
from miles.utils.k8s_testenv.ports import LOOPBACK, SERVICE_CLUSTER_IP_RANGE
from miles.utils.k8s_testenv.process import ManagedProcess


def apiserver_argv(
    *, binary: Path, port: int, etcd_url: str, credentials: Credentials, watch_cache: bool
) -> list[str]:
    """envtest's default flags, with token authentication and no background compaction; the Node
    authorizer lets a real node's kubelet work under its own identity."""
    return [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--etcd-compaction-interval=0",
        f"--watch-cache={'true' if watch_cache else 'false'}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--tls-cert-file={credentials.serving_cert}",
        f"--tls-private-key-file={credentials.serving_key}",
        f"--token-auth-file={credentials.token_file}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={credentials.service_account_key}",
        f"--service-account-signing-key-file={credentials.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        "--disable-admission-plugins=ServiceAccount",
    ]


class KubeApiServer:
    """One kube-apiserver; `restart()` keeps its port, so clients and kubeconfigs stay valid."""

    def __init__(
        self,
        *,
        name: str,
        binary: Path,
        port: int,
        etcd_url: str,
        credentials: Credentials,
        watch_cache: bool,
        work_dir: Path,
    ) -> None:
        self.name = name
        self.url = f"https://{LOOPBACK}:{port}"
        self.watch_cache = watch_cache
        self._token = credentials.admin_token
        self._tls = tls_context(credentials.ca_cert)
        self.kubeconfig = write_kubeconfig(
            work_dir / f"{name}.kubeconfig",
            name=name,
            server=self.url,
            ca_cert=credentials.ca_cert,
            token=credentials.admin_token,
        )
        argv = apiserver_argv(
            binary=binary,
            port=port,
            etcd_url=etcd_url,
            credentials=credentials,
            watch_cache=watch_cache,
        )
        self.process = ManagedProcess(
            name=f"kube-apiserver ({name})",
            argv=argv,
            log_path=work_dir / f"{name}.log",
            ready=self._ready,
        )

    def _status(self, path: str) -> int | None:
        return get_status(f"{self.url}{path}", token=self._token, context=self._tls)

    def _ready(self) -> bool:
        return self._status("/readyz") == 200 and self._status("/api/v1/namespaces/default") == 200

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def restart(self) -> None:
        self.stop()
        self.start()
