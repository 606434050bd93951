"""Failures a person will hit, each one line (``cli/failures``): the apiserver's refusals,
connection failures by kind, a missing extra; a bug keeps its traceback."""

from __future__ import annotations

import json

import pytest

from miles.utils.workers.reconcile.cli.failures import describe_failure
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConnectionError,
)


def test_failures_become_one_line() -> None:
    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config.config_exception import ConfigException

    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = json.dumps(
        {"kind": "Status", "message": 'pods is forbidden: User "x"'}
    ).encode()
    assert describe_failure(forbidden) == 'forbidden by RBAC: pods is forbidden: User "x"'
    assert describe_failure(ConfigException("Invalid kube-config file.")) == (
        "kubeconfig: Invalid kube-config file."
    )
    key = ConnectionKey("127.0.0.1", 1, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))
    assert (
        describe_failure(refused) == "cannot reach the apiserver at 127.0.0.1:1: Connection refused"
    )
    assert describe_failure(KubernetesApiError(403, "Forbidden", "no list")) == (
        "forbidden by RBAC: no list"
    )
    assert describe_failure(ValueError("a bug")) is None


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        (
            ConnectionFailure.TLS_VERIFICATION,
            "TLS verification of the apiserver at h:6443 failed: why; "
            "check the kubeconfig's certificate-authority",
        ),
        (
            ConnectionFailure.TLS_HANDSHAKE,
            "TLS handshake with the apiserver at h:6443 failed: why; "
            "check the kubeconfig's certificates and the server URL",
        ),
        (ConnectionFailure.REFUSED, "cannot reach the apiserver at h:6443: why"),
        (ConnectionFailure.UNREACHABLE, "cannot reach the apiserver at h:6443: why"),
        (ConnectionFailure.TIMEOUT, "timed out waiting for the apiserver"),
        (ConnectionFailure.BROKEN, "talking to the apiserver failed: why"),
    ],
)
def test_a_connection_failure_is_described_from_our_own_error(
    kind: ConnectionFailure, line: str
) -> None:
    """The command reads the kind, server and reason the transport put on the error."""
    failure = KubernetesConnectionError("pod LIST failed", kind=kind, server="h:6443", reason="why")
    assert describe_failure(failure) == line
    assert describe_failure(KubernetesConnectionError("nothing read for 90s", idle=True)) == (
        "talking to the apiserver failed: nothing read for 90s"
    )


def test_a_missing_kubernetes_extra_is_one_line() -> None:
    missing = ModuleNotFoundError("No module named 'kubernetes_asyncio'", name="kubernetes_asyncio")
    assert describe_failure(missing) == (
        "kubernetes_asyncio is not installed: pip install 'miles-reconcile[k8s]'"
    )
    assert describe_failure(ModuleNotFoundError("x", name="numpy")) is None
