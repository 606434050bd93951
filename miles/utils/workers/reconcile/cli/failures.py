"""Failures a person will hit, each turned into one readable line. Go: ``kubectl``'s
``cmdutil.CheckErr``, which prints a single ``error: ...`` line and exits non-zero.

Only our own error types are read here: ``k8s_api`` translates the client's exceptions into them,
including those raised by a request made outside it (``as_kubernetes_error``).
"""

from __future__ import annotations

import ssl

from miles.utils.workers.reconcile.k8s_api import as_kubernetes_error
from miles.utils.workers.reconcile.k8s_config import ConfigurationError, tls_failure_reason
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConfigError,
    KubernetesConnectionError,
)

USAGE_EXIT = 2
KUBERNETES_EXTRA = frozenset({"kubernetes_asyncio", "aiohttp"})


class CliError(Exception):
    """A failure whose message is already the line to show."""


def describe_failure(exc: BaseException) -> str | None:
    """The line for a failure the user can act on; ``None`` for a bug, which keeps its traceback."""
    if isinstance(exc, CliError | ConfigurationError):
        return str(exc)
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] in KUBERNETES_EXTRA:
        return f"{exc.name} is not installed: pip install 'miles-reconcile[k8s]'"
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the apiserver"
    described = _describe_kubernetes_failure(exc)
    if described is None:
        ours = as_kubernetes_error(exc)
        described = None if ours is None else _describe_kubernetes_failure(ours)
    if described is None and isinstance(exc, ssl.SSLError):
        return f"TLS setup failed: {tls_failure_reason(exc)}; check the kubeconfig's certificates"
    return described


def _describe_kubernetes_failure(exc: BaseException) -> str | None:
    if isinstance(exc, KubernetesApiError):
        return _describe_status(exc.code, exc.message or exc.reason)
    if isinstance(exc, KubernetesConfigError):
        return f"kubeconfig: {exc}"
    if isinstance(exc, KubernetesConnectionError):
        return _describe_connection(exc)
    return None


def _describe_status(code: int | None, message: str | None) -> str:
    message = message or "no reason given"
    if code == 403:
        return f"forbidden by RBAC: {message}"
    if code == 401:
        return f"unauthorized: the apiserver rejected the credentials ({message})"
    return f"the apiserver answered {code}: {message}"


def _describe_connection(exc: KubernetesConnectionError) -> str:
    server, reason = exc.server, exc.reason
    if exc.kind is ConnectionFailure.TLS_VERIFICATION:
        return (
            f"TLS verification of the apiserver at {server} failed: {reason}; "
            "check the kubeconfig's certificate-authority"
        )
    if exc.kind is ConnectionFailure.TLS_HANDSHAKE:
        return (
            f"TLS handshake with the apiserver at {server} failed: {reason}; "
            "check the kubeconfig's certificates and the server URL"
        )
    if exc.kind in (ConnectionFailure.REFUSED, ConnectionFailure.UNREACHABLE) and server:
        return f"cannot reach the apiserver at {server}: {reason}"
    if exc.kind is ConnectionFailure.TIMEOUT:
        return "timed out waiting for the apiserver"
    return f"talking to the apiserver failed: {reason or exc}"
