"""The real node with the controller image imported, for the tests of a controller deployed on
it: a local control plane (etcd + kube-apiserver) and a real node (containerd, runc, kubelet,
kube-scheduler, kube-controller-manager) per test module; the image is built once per source
(``python_image.cached_controller_image``, in the user's cache folder) and imported into the node.
Needs root and the node's packages; skips (fails under MILES_K8S_REQUIRE) without them; the host
is checked unchanged afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from miles.utils.k8s_testenv import (
    BinaryPaths,
    EnvSettings,
    LocalControlPlane,
    PrerequisiteError,
    RealNode,
    ensure_node_binaries,
)
from miles.utils.k8s_testenv.host_state import HostSnapshot
from miles.utils.k8s_testenv.python_image import cached_controller_image
from miles.utils.k8s_testenv.real_node import check_prerequisites
from miles.utils.k8s_testenv.user_dirs import user_cache_dir


@dataclass(frozen=True)
class NodeOnPlane:
    """A local control plane and the real node registered with it."""

    plane: LocalControlPlane
    node: RealNode


@pytest.fixture(scope="module")
def node_on_plane(k8s_settings: EnvSettings, k8s_binaries: BinaryPaths) -> Iterator[NodeOnPlane]:
    """A control plane of the module's own and a real node on it; the host checked unchanged
    after both are gone."""
    try:
        check_prerequisites()
        binaries = ensure_node_binaries(settings=k8s_settings)
    except PrerequisiteError as error:
        if k8s_settings.require:
            pytest.fail(f"{error}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
        pytest.skip(str(error))
    before = HostSnapshot.take()
    with (
        LocalControlPlane(binaries=k8s_binaries, settings=EnvSettings(), keep=False) as plane,
        RealNode.on(plane, binaries=binaries) as node,
    ):
        yield NodeOnPlane(plane=plane, node=node)
    assert before.differences() == []


@pytest.fixture(scope="module")
def controller_node(node_on_plane: NodeOnPlane) -> RealNode:
    node_on_plane.node.import_image(cached_controller_image(user_cache_dir() / "images"))
    return node_on_plane.node
