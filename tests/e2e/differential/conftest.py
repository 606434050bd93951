"""Layer k8s_apiserver, differential part: a control plane, KWOK and (where it can run) the real
node of the harness's own.

`differential_env` is module-scoped: the harness stops etcd and restarts an apiserver, so it never
shares the session's control plane. MILES_DIFF_SEED picks the seed (default 1).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import BinaryPaths, EnvSettings
from miles.utils.k8s_testenv.testing.differential.environment import (
    DifferentialEnvironment,
    differential_environment,
)

_LAYER_DIR = Path(__file__).parent
SEED_ENV = "MILES_DIFF_SEED"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _LAYER_DIR in item.path.parents:
            item.add_marker(pytest.mark.k8s_apiserver)


def _to_terminal(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)


@pytest.fixture(scope="module")
def differential_env(
    k8s_settings: EnvSettings,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DifferentialEnvironment]:
    binaries: BinaryPaths = request.getfixturevalue("k8s_binaries")
    with differential_environment(
        binaries=binaries,
        settings=k8s_settings,
        work_dir=tmp_path_factory.mktemp("differential"),
        log=_to_terminal,
    ) as env:
        yield env


@pytest.fixture
def differential_seed() -> int:
    return int(os.environ.get(SEED_ENV, "1"))
