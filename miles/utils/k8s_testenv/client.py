"""`kubernetes_asyncio` clients for a kubeconfig (Go: client-go's `clientcmd.BuildConfigFromFlags`).

The kubeconfig is read by the runtime's `k8s_config` (as the command reads it) and the client opened
by its `k8s_api`; both, and `kubernetes_asyncio`, are imported lazily: building and starting the
environment needs neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv.control_plane import ApiServerName
from miles.utils.k8s_testenv.errors import ClusterUnreachableError

ApiClientFactory = Callable[[ApiServerName], AbstractAsyncContextManager[Any]]
"""Opens a `kubernetes_asyncio` ApiClient for the cached or the uncached apiserver."""

_REACHABLE_TIMEOUT = 10.0


@asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[Any]:
    """An `ApiClient` for the current context of `kubeconfig`, closed on exit."""
    from miles.utils.workers.reconcile.k8s_api import api_client_session
    from miles.utils.workers.reconcile.k8s_config import KubeTarget, resolve_config

    config = resolve_config(KubeTarget(kubeconfig=str(kubeconfig)), {})
    async with api_client_session(config) as client:
        yield client


async def check_reachable(kubeconfig: Path) -> None:
    """Raises `ClusterUnreachableError` unless the kubeconfig's server answers `/version`."""
    from kubernetes_asyncio import client

    try:
        async with api_client(kubeconfig) as api:
            server = api.configuration.host
            try:
                await asyncio.wait_for(
                    client.VersionApi(api).get_code(), timeout=_REACHABLE_TIMEOUT
                )
            except Exception as err:
                raise ClusterUnreachableError(
                    f"kubeconfig {kubeconfig}: server {server} does not answer /version: "
                    f"{type(err).__name__}: {err}"
                ) from err
    except ClusterUnreachableError:
        raise
    except Exception as err:
        raise ClusterUnreachableError(
            f"kubeconfig {kubeconfig} cannot be loaded: {type(err).__name__}: {err}"
        ) from err
