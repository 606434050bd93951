"""Free loopback ports (Go: envtest's `addr.Suggest`)."""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service's ClusterIP (the range's first address), which pods' in-cluster
configuration dials (`KUBERNETES_SERVICE_HOST`); in the serving certificate, as kubeadm puts it."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports the kernel just handed out on 127.0.0.1, free until someone binds."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(sock.getsockname()[1])
        return ports
