"""Layer install: the wheel built from this checkout, installed in a fresh virtualenv outside it.

Marks the layer so `-m install` selects it. It needs pip to reach its cache or PyPI (for
`kubernetes_asyncio` and the build backend) and the built binaries of the session (`k8s_binaries`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

_LAYER_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _LAYER_DIR in item.path.parents:
            item.add_marker(pytest.mark.install)
