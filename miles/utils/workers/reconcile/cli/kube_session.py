"""Kubeconfig resolution and the pod API it opens. Go: ``clientcmd``'s loading rules plus
``rest.InClusterConfig``.

``kubernetes_asyncio`` is imported inside the functions: the runtime stays importable without it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from miles.utils.workers.reconcile.cli.failures import CliError

DEFAULT_KUBECONFIG = Path("~/.kube/config")


def kubeconfig_path(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The kubeconfig to load: ``--kubeconfig``, then ``$KUBECONFIG``, then ``~/.kube/config``;
    ``None`` when none exists (the caller then tries in-cluster)."""
    if explicit:
        if not Path(explicit).expanduser().is_file():
            raise CliError(f"no kubeconfig at {explicit} (from --kubeconfig)")
        return str(Path(explicit).expanduser())
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        if not any(Path(p).expanduser().is_file() for p in listed):
            raise CliError(f"no kubeconfig at {environ['KUBECONFIG']} (from $KUBECONFIG)")
        return environ["KUBECONFIG"]
    default = DEFAULT_KUBECONFIG.expanduser()
    return str(default) if default.is_file() else None


async def load_configuration(explicit: str | None, environ: Mapping[str, str]) -> Any:
    """A ``kubernetes_asyncio`` ``Configuration`` from a kubeconfig, or in-cluster."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    path = kubeconfig_path(explicit, environ)
    if path is not None:
        await config.load_kube_config(
            config_file=path, client_configuration=configuration, persist_config=False
        )
    elif environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        raise CliError(
            "no kubeconfig: pass --kubeconfig, set KUBECONFIG, create ~/.kube/config, "
            "or run inside a cluster"
        )
    return configuration


@asynccontextmanager
async def core_v1_api(explicit: str | None, environ: Mapping[str, str]) -> AsyncIterator[Any]:
    """A ``CoreV1Api`` on its own client session, closed on exit."""
    from kubernetes_asyncio import client

    configuration = await load_configuration(explicit, environ)
    async with client.ApiClient(configuration=configuration) as api_client:
        yield client.CoreV1Api(api_client)
