"""Layer k8s_apiserver: every test here runs against real etcd and kube-apiservers.

The shared fixtures (control plane, kubeconfigs, clients, namespaces) are in tests/e2e/conftest.py;
this file marks the layer so `-m k8s_apiserver` selects it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_LAYER_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _LAYER_DIR in item.path.parents:
            item.add_marker(pytest.mark.k8s_apiserver)
