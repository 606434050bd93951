"""A control plane of the differential harness's own, with KWOK when it can start.

The harness stops etcd, restarts an apiserver and compacts history, so it gets a control plane no
other test shares, and its own KWOK node (kwok manages every node carrying the fake-node annotation,
so two kwoks on one cluster would fight over pods).
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
)
from miles.utils.k8s_testenv.kwok import Kwok

KWOK_NODE = "kwok-differential"


@dataclass(frozen=True)
class DifferentialEnvironment:
    plane: ControlPlane
    oracle_binary: Path
    work_dir: Path
    kwok: Kwok | None
    kwok_unavailable: str | None


@contextlib.contextmanager
def differential_environment(
    *,
    binaries: BinaryPaths,
    settings: EnvSettings,
    work_dir: Path,
    log: Callable[[str], None],
) -> Iterator[DifferentialEnvironment]:
    """A fresh local control plane plus KWOK; with MILES_K8S_KUBECONFIG, that cluster instead
    (faults that need our own processes are then skipped, and so are graceful deletes)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    if settings.kubeconfig is not None:
        yield DifferentialEnvironment(
            plane=ExternalControlPlane(kubeconfig=settings.kubeconfig),
            oracle_binary=binaries.oracle,
            work_dir=work_dir,
            kwok=None,
            kwok_unavailable="MILES_K8S_KUBECONFIG reuses a cluster with no KWOK node of ours",
        )
        return
    with LocalControlPlane(binaries=binaries, settings=settings, announce=log) as plane:
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
            )
        finally:
            if kwok is not None:
                kwok.stop()
