"""Errors of the local control plane (Go: controller-runtime envtest's start-up errors)."""

from __future__ import annotations

from collections.abc import Sequence


class K8sTestEnvError(Exception):
    """Base class of every error this package raises."""


class PrerequisiteError(K8sTestEnvError):
    """Something the environment needs is missing: no Go toolchain, a failed build, no binary."""


class BuildError(PrerequisiteError):
    """`go build` of one pinned binary failed."""

    def __init__(self, *, binary: str, argv: Sequence[str], log_tail: str) -> None:
        super().__init__(
            f"building {binary} failed\n  command: {' '.join(argv)}\n  output (tail):\n{log_tail}"
        )


class ComponentStartError(K8sTestEnvError):
    """A component exited or did not become ready during start-up."""

    def __init__(self, *, component: str, reason: str, argv: Sequence[str], log_tail: str) -> None:
        super().__init__(
            f"{component} failed to start: {reason}\n"
            f"  command: {' '.join(argv)}\n"
            f"  log (tail):\n{log_tail}"
        )


class UnknownPlaneError(K8sTestEnvError):
    """`down NAME` names no control plane of this user's that is running."""

    def __init__(self, *, name: str, running: Sequence[str]) -> None:
        known = f"running: {', '.join(running)}" if running else "none is running"
        super().__init__(f"no control plane named {name!r} ({known}); `env down` lists them")
        self.name = name


class FaultUnsupportedError(K8sTestEnvError):
    """A fault needs processes this environment does not own (e.g. a reused cluster)."""


class ClusterUnreachableError(K8sTestEnvError):
    """A reused cluster (MILES_K8S_KUBECONFIG) cannot be loaded or does not answer."""
