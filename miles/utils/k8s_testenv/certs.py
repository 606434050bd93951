"""Certificates and credentials for loopback apiservers (Go: envtest's `internal/testing/certs`).

Uses the `openssl` command line: a throwaway CA, a serving certificate for 127.0.0.1/localhost
(and the `kubernetes` Service's ClusterIP and names, which pods on the real node dial) signed by
it, a service-account signing key, and a static token file with one admin token and,
given a node name, the token of that node's kubelet (user `system:node:<name>`, group
`system:nodes`, what the Node authorizer and NodeRestriction admission expect).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from miles.utils.k8s_testenv.errors import PrerequisiteError
from miles.utils.k8s_testenv.ports import KUBERNETES_SERVICE_IP

ADMIN_USER = "admin"
ADMIN_GROUP = "system:masters"
NODES_GROUP = "system:nodes"

_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
_SERVING_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt_names
authorityKeyIdentifier = keyid
subjectKeyIdentifier = hash
[alt_names]
IP.1 = 127.0.0.1
DNS.1 = localhost
IP.2 = {service_ip}
DNS.2 = kubernetes
DNS.3 = kubernetes.default
DNS.4 = kubernetes.default.svc
DNS.5 = kubernetes.default.svc.cluster.local
"""


@dataclass(frozen=True)
class Credentials:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    service_account_key: Path
    token_file: Path
    admin_token: str
    node_token: str | None = None


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PrerequisiteError(
            "openssl not found on PATH: it generates the apiserver certificates"
        )
    result = subprocess.run(
        [openssl, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if result.returncode != 0:
        raise PrerequisiteError(f"openssl {' '.join(args)} failed:\n{result.stdout}")


@dataclass(frozen=True)
class ServingPair:
    """A throwaway CA and a serving certificate for 127.0.0.1/localhost signed by it."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path


def generate_serving_pair(directory: Path) -> ServingPair:
    """Writes `ca.crt`, `ca.key`, `serving.crt` and `serving.key` into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    days = "3650"
    _openssl(
        "req", "-x509", *_EC_KEY, "-days", days, "-subj", "/CN=miles-k8s-testenv-ca",
        "-keyout", "ca.key", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-new", *_EC_KEY, "-subj", "/CN=kube-apiserver",
        "-keyout", "serving.key", "-out", "serving.csr", cwd=directory,
    )  # fmt: skip
    (directory / "serving.ext").write_text(
        _SERVING_EXTENSIONS.format(service_ip=KUBERNETES_SERVICE_IP)
    )
    _openssl(
        "x509", "-req", "-in", "serving.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", days, "-extfile", "serving.ext", "-out", "serving.crt",
        cwd=directory,
    )  # fmt: skip
    for secret in ("ca.key", "serving.key"):
        (directory / secret).chmod(0o600)
    return ServingPair(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "serving.crt",
        serving_key=directory / "serving.key",
    )


def generate_credentials(directory: Path, *, node_name: str | None = None) -> Credentials:
    """Writes the CA, serving certificate, service-account key and token file into `directory`."""
    pair = generate_serving_pair(directory)
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
        "-out", "service-account.key", cwd=directory,
    )  # fmt: skip
    token = secrets.token_hex(24)
    token_file = directory / "token.csv"
    lines = [f'{token},{ADMIN_USER},{ADMIN_USER}-uid,"{ADMIN_GROUP}"']
    node_token = None
    if node_name is not None:
        node_token = secrets.token_hex(24)
        user = f"system:node:{node_name}"
        lines.append(f'{node_token},{user},{user}-uid,"{NODES_GROUP}"')
    token_file.write_text("\n".join(lines) + "\n")
    for secret in ("service-account.key", "token.csv"):
        (directory / secret).chmod(0o600)
    return Credentials(
        ca_cert=pair.ca_cert,
        serving_cert=pair.serving_cert,
        serving_key=pair.serving_key,
        service_account_key=directory / "service-account.key",
        token_file=token_file,
        admin_token=token,
        node_token=node_token,
    )
