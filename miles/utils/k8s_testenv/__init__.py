"""Local Kubernetes control planes for tests, built from pinned Go modules (Go: envtest).

Imports nothing from `miles.utils.workers.reconcile`: the environment under test stays independent
of the code under test.
"""

from miles.utils.k8s_testenv.binaries import (
    BinaryPaths,
    NodeBinaryPaths,
    bin_dir,
    ensure_binaries,
    ensure_node_binaries,
)
from miles.utils.k8s_testenv.client import ApiClientFactory, api_client, check_reachable
from miles.utils.k8s_testenv.control_plane import (
    ApiServerName,
    ControlPlane,
    ControlPlaneAddon,
    ExternalControlPlane,
    LocalControlPlane,
)
from miles.utils.k8s_testenv.errors import (
    BuildError,
    ClusterUnreachableError,
    ComponentStartError,
    FaultUnsupportedError,
    K8sTestEnvError,
    PrerequisiteError,
)
from miles.utils.k8s_testenv.real_node import RealNode, RealNodeAddon
from miles.utils.k8s_testenv.settings import EnvSettings

__all__ = [
    "ApiClientFactory",
    "ApiServerName",
    "BinaryPaths",
    "BuildError",
    "ClusterUnreachableError",
    "ComponentStartError",
    "ControlPlane",
    "ControlPlaneAddon",
    "EnvSettings",
    "ExternalControlPlane",
    "FaultUnsupportedError",
    "K8sTestEnvError",
    "LocalControlPlane",
    "NodeBinaryPaths",
    "PrerequisiteError",
    "RealNode",
    "RealNodeAddon",
    "api_client",
    "bin_dir",
    "check_reachable",
    "ensure_binaries",
    "ensure_node_binaries",
]
