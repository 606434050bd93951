"""The differential harness built on an environment (`DifferentialHarness.on`): each part of the
environment reaches the harness under its own name, and `work_dir` may be another folder. No
cluster."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import cast

from miles.utils.k8s_testenv import ControlPlane
from miles.utils.k8s_testenv.testing.differential.config import HarnessConfig
from miles.utils.k8s_testenv.testing.differential.environment import DifferentialEnvironment
from miles.utils.k8s_testenv.testing.differential.harness import DifferentialHarness


def _environment(tmp_path: Path) -> DifferentialEnvironment:
    return DifferentialEnvironment(
        plane=cast(ControlPlane, object()),
        oracle_binary=tmp_path / "oracle",
        work_dir=tmp_path / "env",
        kwok=None,
        kwok_unavailable="no KWOK in this test",
        real_node=None,
        real_node_unavailable="no real node in this test",
    )


def test_every_field_of_the_environment_is_a_parameter_of_the_harness() -> None:
    parameters = inspect.signature(DifferentialHarness).parameters
    assert {part.name for part in fields(DifferentialEnvironment)} <= parameters.keys()


def test_on_hands_the_harness_each_part_of_the_environment(tmp_path: Path) -> None:
    env = _environment(tmp_path)
    harness = DifferentialHarness.on(env, config=HarnessConfig(seed=3))
    assert harness._rig.plane is env.plane
    assert harness._rig.oracle_binary == env.oracle_binary
    assert harness._rig.work_dir == env.work_dir
    assert harness._kwok_unavailable == "no KWOK in this test"
    assert harness._real_node_unavailable == "no real node in this test"
    assert harness.config.seed == 3


def test_on_writes_under_another_folder_when_told(tmp_path: Path) -> None:
    harness = DifferentialHarness.on(
        _environment(tmp_path), config=HarnessConfig(seed=3), work_dir=tmp_path / "elsewhere"
    )
    assert harness._rig.work_dir == tmp_path / "elsewhere"
