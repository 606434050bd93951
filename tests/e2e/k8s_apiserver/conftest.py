"""Layer k8s_apiserver: every test here runs against real etcd and kube-apiservers.

The shared fixtures (control plane, kubeconfigs, clients, namespaces) are in tests/e2e/conftest.py;
this file marks the layer so `-m k8s_apiserver` selects it, and says where a fault test ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import BinaryPaths, EnvSettings, LocalControlPlane

_LAYER_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _LAYER_DIR in item.path.parents:
            item.add_marker(pytest.mark.k8s_apiserver)


@pytest.fixture(params=["http2", "http11", "aiohttp"])
def write_transport_name(request: pytest.FixtureRequest) -> str:
    """Each write-client test runs through each transport (``harness.WRITE_TRANSPORTS``)."""
    return str(request.param)


@pytest.fixture
def behind_the_fault_proxy(request: pytest.FixtureRequest) -> Iterator[None]:
    """For the tests that reach the apiserver through `HttpFaultProxy`: their docstring's layer."""
    yield
    print(
        f"k8s_apiserver: {request.node.name} ran on the cached kube-apiserver (watch cache on) "
        "behind the HTTP fault proxy"
    )


@pytest.fixture(scope="module")
def own_plane(
    k8s_settings: EnvSettings, request: pytest.FixtureRequest
) -> Iterator[LocalControlPlane]:
    """A control plane of the test module's own, for the tests that restore its etcd."""
    if k8s_settings.kubeconfig is not None:
        pytest.skip("restoring etcd needs the local control plane's own etcd")
    binaries: BinaryPaths = request.getfixturevalue("k8s_binaries")
    with LocalControlPlane(binaries=binaries, settings=k8s_settings, keep=False) as plane:
        yield plane
