"""k8s_kind layer: `KwokAddon` is the control plane's hook for KWOK. Started after the apiservers
it leaves a Ready fake node behind it; leaving the control plane stops kwok first."""

from __future__ import annotations

import os

import pytest

from miles.utils.k8s_testenv import BinaryPaths, EnvSettings, LocalControlPlane
from miles.utils.k8s_testenv.kwok import ApiAccess, KwokAddon, node_ready

pytestmark = pytest.mark.k8s_kind


def test_kwok_addon_starts_with_the_control_plane_and_stops_before_it(
    k8s_binaries: BinaryPaths,
) -> None:
    addon = KwokAddon(node_name="addon-node")
    with LocalControlPlane(
        binaries=k8s_binaries, settings=EnvSettings(), addons=[addon], keep=False
    ) as plane:
        assert addon.kwok is not None
        assert node_ready(ApiAccess.from_kubeconfig(plane.cached_kubeconfig), "addon-node")
        pid = addon.kwok.pid
        assert pid is not None
    assert addon.kwok is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
