"""Writes a kubeconfig for one apiserver (Go: envtest's `KubeConfigFromREST`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path


def write_kubeconfig(
    path: Path, *, name: str, server: str, ca_cert: Path | None, token: str
) -> Path:
    """A self-contained kubeconfig (JSON is valid YAML) with TLS verification against `ca_cert`;
    without one, a kubeconfig naming only the server and the token (for a server that is not
    there, or that never answers)."""
    cluster = {"server": server}
    if ca_cert is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": f"{name}-admin", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
        "preferences": {},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


def with_token(kubeconfig: Path, token: str, path: Path) -> Path:
    """A copy of ``kubeconfig`` at ``path`` whose every user authenticates by ``token`` alone (a
    service account's, from a TokenRequest)."""
    config = json.loads(kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path
