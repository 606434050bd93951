"""The kubelet layer of the k8s_kind tests, chosen once for the package:

1. `MILES_K8S_KUBECONFIG` set: that cluster, taken to run real kubelets ("kubeconfig");
2. `MILES_K8S_NODE=kwok`: KWOK against the session's local control plane ("kwok");
3. otherwise (`auto`, the default, or `real`) the real node on the session's control plane:
   containerd, the kubelet, kube-scheduler and kube-controller-manager ("real-node");
4. `auto` only, when the real node's prerequisites are missing (no root, no packages) and
   MILES_K8S_REQUIRE is off: kind if a Docker daemon answers, else KWOK, saying why.

Each test prints the layer it ran on, and the session summary names it. A missing prerequisite
skips, or fails under `MILES_K8S_REQUIRE=1` (the default when `CI` is set); a real node or KWOK
that crashes or whose node never becomes Ready is a failure, never a skip or a fallback. The layer
is package-scoped, so the real node is gone (and the host clean) before other packages run theirs.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest

from miles.utils.k8s_testenv import (
    EnvSettings,
    LocalControlPlane,
    PrerequisiteError,
    bin_dir,
    check_reachable,
    ensure_node_binaries,
)
from miles.utils.k8s_testenv.kind import docker_daemon_available, ensure_pinned_kind, kind_cluster
from miles.utils.k8s_testenv.kubelet import KubeletLayer, LayerName
from miles.utils.k8s_testenv.kwok import Kwok
from miles.utils.k8s_testenv.real_node import RealNode, real_node_unavailable

_LAYERS_RUN: pytest.StashKey[dict[str, int]] = pytest.StashKey()
_FALLBACK: pytest.StashKey[str] = pytest.StashKey()


def _skip_or_fail(settings: EnvSettings, reason: str) -> None:
    if settings.require:
        pytest.fail(f"{reason}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
    pytest.skip(reason)


@pytest.fixture(scope="package")
def kubelet_layer(
    k8s_settings: EnvSettings,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KubeletLayer]:
    if k8s_settings.kubeconfig is not None:
        asyncio.run(check_reachable(k8s_settings.kubeconfig))
        yield KubeletLayer(name=LayerName.KUBECONFIG, kubeconfig=k8s_settings.kubeconfig)
        return
    if k8s_settings.node != "kwok":
        reason = _real_node_unavailable(k8s_settings)
        if reason is None:
            plane = request.getfixturevalue("k8s_local_control_plane_session")
            yield from _real_node_layer(plane, request.getfixturevalue("k8s_terminal"))
            return
        print(f"k8s_kind: the real node is unavailable ({reason}); falling back", file=sys.stderr)
        request.config.stash[_FALLBACK] = reason
    if k8s_settings.node != "kwok" and docker_daemon_available():
        yield from _kind_layer(k8s_settings, tmp_path_factory)
    else:
        plane = request.getfixturevalue("k8s_local_control_plane_session")
        yield from _kwok_layer(k8s_settings, plane)


def _real_node_unavailable(settings: EnvSettings) -> str | None:
    """Why the real node cannot run here, or None; under `real` or MILES_K8S_REQUIRE that fails."""
    reason = real_node_unavailable(settings.node)
    if reason is not None and (settings.node == "real" or settings.require):
        pytest.fail(
            f"{reason}\n(MILES_K8S_NODE={settings.node}, MILES_K8S_REQUIRE="
            f"{int(settings.require)}: the real node is required, so this fails)"
        )
    return reason


def _real_node_layer(
    plane: LocalControlPlane, say: Callable[[str], None]
) -> Iterator[KubeletLayer]:
    node = RealNode.on(plane, binaries=ensure_node_binaries(log=say))
    node.start()
    say(f"k8s_kind: real node {node.node_name} up in {node.started_seconds:.1f}s")
    try:
        yield KubeletLayer(
            name=LayerName.REAL, kubeconfig=plane.cached_kubeconfig, failure=node.failure
        )
    finally:
        node.stop()


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
    if (reason := config.stash.get(_FALLBACK, None)) is not None:
        terminalreporter.write_line(f"k8s_kind: not on the real node: {reason}")
