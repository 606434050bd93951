"""A controller's deployment manifest on the real node, as the k8s_node tests apply and watch it.
Go: none (``kubectl create -f`` reduced to the kinds under ``deploy/``).

``deploy/*.yaml`` is read as it is in the repository and each document created in its namespace;
the controller pods the Deployment runs are read back as the sorted names of the ready ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from kubernetes_asyncio import client

from miles.utils.k8s_testenv.kubelet import Probe, eventually

REPO_ROOT = Path(__file__).resolve().parents[3]


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """The documents of a multi-document YAML manifest, the empty ones left out."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


async def create_documents(api: Any, documents: list[dict[str, Any]], *, namespace: str) -> None:
    """Creates each document, in order, the namespaced ones in ``namespace``."""
    core: Any = client.CoreV1Api(api)
    rbac: Any = client.RbacAuthorizationV1Api(api)
    apps: Any = client.AppsV1Api(api)
    create: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
        "Namespace": lambda d: core.create_namespace(d),
        "ServiceAccount": lambda d: core.create_namespaced_service_account(namespace, d),
        "ConfigMap": lambda d: core.create_namespaced_config_map(namespace, d),
        "Role": lambda d: rbac.create_namespaced_role(namespace, d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(namespace, d),
        "Deployment": lambda d: apps.create_namespaced_deployment(namespace, d),
    }
    for document in documents:
        await create[document["kind"]](document)


async def ready_pod_names(core: Any, namespace: str, label_selector: str) -> list[str]:
    """The sorted names of the selected pods that are Ready and not terminating."""
    pods = (await core.list_namespaced_pod(namespace, label_selector=label_selector)).items
    return sorted(
        p.metadata.name
        for p in pods
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
    )


async def until(probe: Probe[Any], **options: Any) -> Any:
    """`eventually`, for probes of any result type."""
    return await eventually(probe, **options)
