"""The connection a command opens: kubeconfig or in-cluster, and the pod API over it. Go:
``clientcmd.DeferredLoadingClientConfig`` (``ClientConfig``, ``Namespace``) plus
``rest.InClusterConfig``.

The client itself is reached only through ``k8s_api`` (``in_cluster_configuration``,
``kubeconfig_configuration``, ``core_v1_api_session``), whose errors are our own.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.utils.workers.reconcile.cli.failures import CliError
from miles.utils.workers.reconcile.cli.kubeconfig import (
    KubeconfigError,
    check_certificates,
    find_kubeconfig,
    resolve_context,
)
from miles.utils.workers.reconcile.k8s_api import (
    SERVICE_ACCOUNT,
    SERVICE_HOST,
    core_v1_api_session,
    in_cluster_configuration,
    in_cluster_possible,
    kubeconfig_configuration,
    require_client,
)
from miles.utils.workers.reconcile.k8s_errors import InClusterConfigError, KubernetesConfigError

DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class KubeTarget:
    """What the user asked for: ``--kubeconfig``, ``--context`` and ``-n`` (each may be unset)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class KubeSession:
    """An open ``CoreV1Api``, the namespace to use, and the server it talks to (for errors)."""

    core_v1_api: Any
    namespace: str
    server: str
    context: str | None


async def _configure(
    target: KubeTarget,
    environ: Mapping[str, str],
    temp_dir: str,
    service_account: Path = SERVICE_ACCOUNT,
) -> tuple[Any, str, str, str | None]:
    """controller-runtime's order (``config.GetConfig``): ``--kubeconfig``; else, unless
    ``KUBECONFIG`` is set (or ``--context`` names a kubeconfig context), the service account when
    in a pod; else ``KUBECONFIG`` or ``~/.kube/config``."""
    require_client()
    in_cluster_first = not (target.kubeconfig or target.context or environ.get("KUBECONFIG"))
    if in_cluster_first and in_cluster_possible(environ, service_account):
        return _in_cluster(target, environ, service_account)
    source = find_kubeconfig(target.kubeconfig, environ)
    if source is None:
        if not environ.get(SERVICE_HOST):
            raise CliError(
                "no Kubernetes configuration: no kubeconfig (--kubeconfig, $KUBECONFIG,"
                f" ~/.kube/config) and not in a pod ({SERVICE_HOST} unset,"
                f" no {service_account / 'token'})"
            )
        if target.context:
            raise CliError(f"--context {target.context}: no kubeconfig to find it in")
        return _in_cluster(target, environ, service_account)
    resolved = resolve_context(source, target.context)
    check_certificates(resolved)
    try:
        configuration = await kubeconfig_configuration(resolved.config, temp_dir)
    except KubernetesConfigError as err:
        raise KubeconfigError(
            f"kubeconfig {source.shown}: context {resolved.context!r}: {err}"
        ) from None
    namespace = target.namespace or resolved.namespace or DEFAULT_NAMESPACE
    return configuration, namespace, resolved.server, resolved.context


def _in_cluster(
    target: KubeTarget, environ: Mapping[str, str], service_account: Path
) -> tuple[Any, str, str, str | None]:
    try:
        configuration = in_cluster_configuration(environ, service_account)
    except InClusterConfigError as err:
        raise CliError(f"{err}; pass --kubeconfig when not running in a pod") from None
    namespace = target.namespace or _service_account_namespace(service_account)
    return configuration, namespace, str(configuration.host), None


def _service_account_namespace(service_account: Path) -> str:
    try:
        return (service_account / "namespace").read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


@asynccontextmanager
async def kube_session(
    target: KubeTarget, environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT
) -> AsyncIterator[KubeSession]:
    """A ``CoreV1Api`` on its own client session, closed on exit; the certificate data the client
    writes to files lives in a temporary folder removed on exit. ``service_account`` is where a
    pod's service account is mounted."""
    with tempfile.TemporaryDirectory(prefix="miles-reconcile-") as temp_dir:
        configured = await _configure(target, environ, temp_dir, service_account)
        configuration, namespace, server, context = configured
        async with core_v1_api_session(configuration) as api:
            yield KubeSession(api, namespace, server, context)


@asynccontextmanager
async def core_v1_api(explicit: str | None, environ: Mapping[str, str]) -> AsyncIterator[Any]:
    """A ``CoreV1Api`` from ``--kubeconfig``-style resolution alone (no context, no namespace)."""
    async with kube_session(KubeTarget(kubeconfig=explicit), environ) as session:
        yield session.core_v1_api
