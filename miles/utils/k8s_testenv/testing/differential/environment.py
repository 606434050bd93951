"""A control plane of the differential harness's own, with KWOK when it can start and the real
node when it can run here.

The harness stops etcd, restarts an apiserver and compacts history, so it gets a control plane no
other test shares, and its own KWOK node (kwok manages every node carrying the fake-node annotation,
so two kwoks on one cluster would fight over pods). The real node (`RealNodeAddon`: containerd, a
kubelet, kube-scheduler and kube-controller-manager on the cached apiserver) runs the kubelet
churn; it is left out, with the reason, under MILES_K8S_NODE=kwok, when a prerequisite is missing or
another real node holds the machine, and then required under MILES_K8S_NODE=real or
MILES_K8S_REQUIRE, as in the kubelet layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from miles.utils.k8s_testenv import (
    BinaryPaths,
    ComponentStartError,
    ControlPlane,
    EnvSettings,
    ExternalControlPlane,
    LocalControlPlane,
    PrerequisiteError,
    RealNodeAddon,
)
from miles.utils.k8s_testenv.binaries import ensure_node_binaries
from miles.utils.k8s_testenv.kwok import Kwok
from miles.utils.k8s_testenv.real_node import RealNode, real_node_unavailable

KWOK_NODE = "kwok-differential"


@dataclass(frozen=True)
class DifferentialEnvironment:
    plane: ControlPlane
    oracle_binary: Path
    work_dir: Path
    kwok: Kwok | None
    kwok_unavailable: str | None
    real_node: RealNode | None = None
    real_node_unavailable: str | None = None


@contextlib.contextmanager
def differential_environment(
    *,
    binaries: BinaryPaths,
    settings: EnvSettings,
    work_dir: Path,
    log: Callable[[str], None],
) -> Iterator[DifferentialEnvironment]:
    """A fresh local control plane plus KWOK and, where it can run, the real node; with
    MILES_K8S_KUBECONFIG, that cluster instead (faults that need our own processes are then
    skipped, and so are graceful deletes and the kubelet churn)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    if settings.kubeconfig is not None:
        yield DifferentialEnvironment(
            plane=ExternalControlPlane(kubeconfig=settings.kubeconfig),
            oracle_binary=binaries.oracle,
            work_dir=work_dir,
            kwok=None,
            kwok_unavailable="MILES_K8S_KUBECONFIG reuses a cluster with no KWOK node of ours",
            real_node_unavailable="MILES_K8S_KUBECONFIG reuses a cluster with no real node of ours",
        )
        return
    no_node = _real_node_unavailable(settings)
    node_addon = (
        None
        if no_node is not None
        else RealNodeAddon(binaries=ensure_node_binaries(settings=settings, log=log))
    )
    addons = [node_addon] if node_addon is not None else []
    with LocalControlPlane(
        binaries=binaries, settings=settings, announce=log, addons=addons
    ) as plane:
        kwok: Kwok | None = Kwok(
            binary=binaries.kwok,
            kubeconfig=plane.cached_kubeconfig,
            work_dir=work_dir / "kwok",
            node_name=KWOK_NODE,
        )
        unavailable = None
        try:
            assert kwok is not None
            kwok.start()
        except (PrerequisiteError, ComponentStartError) as err:
            kwok, unavailable = None, f"KWOK could not start: {err}"
            log(f"differential: graceful deletes will be skipped: {unavailable}")
        try:
            yield DifferentialEnvironment(
                plane=plane,
                oracle_binary=binaries.oracle,
                work_dir=work_dir,
                kwok=kwok,
                kwok_unavailable=unavailable,
                real_node=node_addon.node if node_addon is not None else None,
                real_node_unavailable=no_node,
            )
        finally:
            if kwok is not None:
                kwok.stop()


def _real_node_unavailable(settings: EnvSettings) -> str | None:
    """Why the real node is left out, or None; a PrerequisiteError where it is required."""
    reason = real_node_unavailable(settings.node)
    required = settings.node == "real" or (settings.require and settings.node != "kwok")
    if reason is not None and required:
        raise PrerequisiteError(
            f"{reason} (MILES_K8S_NODE={settings.node}, MILES_K8S_REQUIRE="
            f"{int(settings.require)}: the real node is required)"
        )
    return reason
