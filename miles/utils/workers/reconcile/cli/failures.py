"""Failures a person will hit, each turned into one readable line. Go: ``kubectl``'s
``cmdutil.CheckErr``, which prints a single ``error: ...`` line and exits non-zero."""

from __future__ import annotations

import json
import ssl
from typing import Any

from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError, KubernetesConnectionError

USAGE_EXIT = 2
KUBERNETES_EXTRA = frozenset({"kubernetes_asyncio", "aiohttp"})


class CliError(Exception):
    """A failure whose message is already the line to show."""


def describe_failure(exc: BaseException) -> str | None:
    """The line for a failure the user can act on; ``None`` for a bug, which keeps its traceback."""
    if isinstance(exc, CliError):
        return str(exc)
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] in KUBERNETES_EXTRA:
        return f"{exc.name} is not installed: pip install 'miles-reconcile[k8s]'"
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the apiserver"
    if isinstance(exc, KubernetesApiError):
        return _describe_status(exc.code, exc.message or exc.reason)
    if isinstance(exc, KubernetesConnectionError):
        cause = exc.__cause__
        described = describe_failure(cause) if cause is not None else None
        return described or f"talking to the apiserver failed: {exc}"
    described = _describe_kubernetes_failure(exc) or _describe_connection_failure(exc)
    if described is None and isinstance(exc, ssl.SSLError):
        return f"TLS setup failed: {_ssl_reason(exc)}; check the kubeconfig's certificates"
    return described


def _describe_kubernetes_failure(exc: BaseException) -> str | None:
    try:
        from kubernetes_asyncio.client.exceptions import ApiException
        from kubernetes_asyncio.config.config_exception import ConfigException
    except ImportError:
        return None
    if isinstance(exc, ConfigException):
        return f"kubeconfig: {exc}"
    if not isinstance(exc, ApiException):
        return None
    return _describe_status(exc.status, _status_message(exc.body) or exc.reason)


def _describe_status(code: int | None, message: str | None) -> str:
    message = message or "no reason given"
    if code == 403:
        return f"forbidden by RBAC: {message}"
    if code == 401:
        return f"unauthorized: the apiserver rejected the credentials ({message})"
    return f"the apiserver answered {code}: {message}"


def _status_message(body: Any) -> str | None:
    if isinstance(body, bytes | bytearray):
        body = body.decode(errors="replace")
    if not isinstance(body, str) or not body:
        return None
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip().splitlines()[0]
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else None


def _describe_connection_failure(exc: BaseException) -> str | None:
    try:
        import aiohttp
    except ImportError:
        return None
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return (
            f"TLS verification of the apiserver at {_server(exc)} failed: "
            f"{_ssl_reason(exc.certificate_error)}; check the kubeconfig's certificate-authority"
        )
    if isinstance(exc, aiohttp.ClientConnectorSSLError):
        return (
            f"TLS handshake with the apiserver at {_server(exc)} failed: "
            f"{_ssl_reason(exc.os_error)}; check the kubeconfig's certificates and the server URL"
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
        return f"cannot reach the apiserver at {_server(exc)}: {reason}"
    if isinstance(exc, aiohttp.ClientError):
        return f"talking to the apiserver failed: {exc or type(exc).__name__}"
    return None


def _server(exc: Any) -> str:
    return f"{exc.host}:{exc.port}"


def _ssl_reason(err: BaseException) -> str:
    reason = getattr(err, "verify_message", None) or getattr(err, "reason", None)
    return str(reason or err or type(err).__name__)
