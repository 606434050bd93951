"""The connection a command opens: kubeconfig or in-cluster, and the pod API over it. Go:
``clientcmd.DeferredLoadingClientConfig`` (``ClientConfig``, ``Namespace``) plus
``rest.InClusterConfig``.

``kubernetes_asyncio`` is imported inside the functions: the runtime stays importable without it.
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

DEFAULT_NAMESPACE = "default"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's service account is mounted: ``token``, ``ca.crt`` and ``namespace``."""


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
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config.config_exception import ConfigException
    from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

    configuration = client.Configuration()
    source = find_kubeconfig(target.kubeconfig, environ)
    if source is None:
        if not environ.get("KUBERNETES_SERVICE_HOST"):
            raise CliError(
                "no kubeconfig: pass --kubeconfig, set KUBECONFIG, create ~/.kube/config, "
                "or run inside a cluster"
            )
        if target.context:
            raise CliError(f"--context {target.context}: no kubeconfig to find it in")
        loader = InClusterConfigLoader(
            token_filename=str(service_account / "token"),
            cert_filename=str(service_account / "ca.crt"),
            environ=dict(environ),
        )
        try:
            loader.load_and_set(configuration)
        except ConfigException as err:
            raise CliError(
                f"in-cluster configuration ({service_account}): {str(err).rstrip('.')}; "
                "pass --kubeconfig when not running in a pod"
            ) from None
        namespace = target.namespace or _service_account_namespace(service_account)
        return configuration, namespace, str(configuration.host), None
    resolved = resolve_context(source, target.context)
    check_certificates(resolved)
    try:
        await config.load_kube_config_from_dict(
            resolved.config, client_configuration=configuration, temp_file_path=temp_dir
        )
    except ConfigException as err:
        raise KubeconfigError(
            f"kubeconfig {source.shown}: context {resolved.context!r}: {err}"
        ) from None
    namespace = target.namespace or resolved.namespace or DEFAULT_NAMESPACE
    return configuration, namespace, resolved.server, resolved.context


def _service_account_namespace(service_account: Path) -> str:
    try:
        return (service_account / "namespace").read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


@asynccontextmanager
async def kube_session(
    target: KubeTarget, environ: Mapping[str, str]
) -> AsyncIterator[KubeSession]:
    """A ``CoreV1Api`` on its own client session, closed on exit; the certificate data the client
    writes to files lives in a temporary folder removed on exit."""
    from kubernetes_asyncio import client

    with tempfile.TemporaryDirectory(prefix="miles-reconcile-") as temp_dir:
        configuration, namespace, server, context = await _configure(target, environ, temp_dir)
        async with client.ApiClient(configuration=configuration) as api_client:
            yield KubeSession(client.CoreV1Api(api_client), namespace, server, context)


@asynccontextmanager
async def core_v1_api(explicit: str | None, environ: Mapping[str, str]) -> AsyncIterator[Any]:
    """A ``CoreV1Api`` from ``--kubeconfig``-style resolution alone (no context, no namespace)."""
    async with kube_session(KubeTarget(kubeconfig=explicit), environ) as session:
        yield session.core_v1_api
