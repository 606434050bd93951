"""The kubelet layer of the k8s_kind tests, chosen once per session:

1. `MILES_K8S_KUBECONFIG` set: that cluster, taken to run real kubelets ("kubeconfig");
2. a Docker daemon answers: a kind cluster from the pinned kind and node image ("kind");
3. otherwise KWOK against the session's local control plane, cached apiserver ("kwok").

Each test prints the layer it ran on, and the session summary names it. A missing prerequisite
skips, or fails under `MILES_K8S_REQUIRE=1` (the default when `CI` is set); KWOK that crashes or
whose node never becomes Ready is a failure, never a skip.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from miles.utils.k8s_testenv import (
    EnvSettings,
    LocalControlPlane,
    PrerequisiteError,
    bin_dir,
    check_reachable,
)
from miles.utils.k8s_testenv.kind import docker_daemon_available, ensure_pinned_kind, kind_cluster
from miles.utils.k8s_testenv.kubelet import KubeletLayer, LayerName
from miles.utils.k8s_testenv.kwok import Kwok

_LAYERS_RUN: pytest.StashKey[dict[str, int]] = pytest.StashKey()


def _skip_or_fail(settings: EnvSettings, reason: str) -> None:
    if settings.require:
        pytest.fail(f"{reason}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kubelet_layer(
    k8s_settings: EnvSettings,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KubeletLayer]:
    if k8s_settings.kubeconfig is not None:
        asyncio.run(check_reachable(k8s_settings.kubeconfig))
        yield KubeletLayer(name=LayerName.KUBECONFIG, kubeconfig=k8s_settings.kubeconfig)
    elif docker_daemon_available():
        yield from _kind_layer(k8s_settings, tmp_path_factory)
    else:
        plane = request.getfixturevalue("k8s_local_control_plane_session")
        yield from _kwok_layer(k8s_settings, plane)


def _kind_layer(
    settings: EnvSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletLayer]:
    try:
        kind = ensure_pinned_kind(cache_dir=bin_dir(settings))
    except PrerequisiteError as error:
        _skip_or_fail(settings, str(error))
        return
    with kind_cluster(
        kind=kind,
        name=f"miles-e2e-{uuid.uuid4().hex[:6]}",
        work_dir=tmp_path_factory.mktemp("kind"),
        keep=settings.keep,
    ) as kubeconfig:
        yield KubeletLayer(name=LayerName.KIND, kubeconfig=kubeconfig)


def _kwok_layer(settings: EnvSettings, plane: LocalControlPlane) -> Iterator[KubeletLayer]:
    kwok = Kwok(
        binary=plane.binaries.kwok,
        kubeconfig=plane.cached_kubeconfig,
        work_dir=plane.work_dir / "kwok",
    )
    try:
        kwok.start()
    except PrerequisiteError as error:
        _skip_or_fail(settings, str(error))
        return
    try:
        yield KubeletLayer(
            name=LayerName.KWOK,
            kubeconfig=plane.cached_kubeconfig,
            node_name=kwok.node_name,
            failure=kwok.failure,
        )
    finally:
        kwok.stop()


@pytest.fixture(scope="session")
def k8s_local_control_plane_session(request: pytest.FixtureRequest) -> LocalControlPlane:
    """The session's own control plane (KWOK needs its apiserver; never a reused cluster)."""
    plane = request.getfixturevalue("k8s_control_plane")
    if not isinstance(plane, LocalControlPlane):
        pytest.skip("needs the local control plane, but MILES_K8S_KUBECONFIG reuses a cluster")
    return plane


@pytest.fixture(autouse=True)
def _announce_kubelet_layer(request: pytest.FixtureRequest) -> None:
    if "kubelet_layer" not in request.fixturenames:
        return
    layer: KubeletLayer = request.getfixturevalue("kubelet_layer")
    print(f"k8s_kind: {request.node.name} ran on {layer.name}")
    counts = request.config.stash.setdefault(_LAYERS_RUN, {})
    counts[layer.name] = counts.get(layer.name, 0) + 1


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    counts = config.stash.get(_LAYERS_RUN, {})
    if counts:
        ran_on = ", ".join(f"{name} ({n} tests)" for name, n in sorted(counts.items()))
        terminalreporter.write_line(f"k8s_kind kubelet layer: {ran_on}")
