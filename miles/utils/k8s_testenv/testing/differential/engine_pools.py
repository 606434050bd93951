"""The custom resource the differential harness watches beside pods: engine pools (the CRD in
`miles/utils/k8s_testenv/crds/enginepool.yaml`, spec and status subresource), installed on the
harness's plane, and the one-line summary of a pool every view reports.

Go counterpart: none (client-go's side is the oracle's dynamic informer, `--resource`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

import miles.utils.k8s_testenv
from miles.utils.k8s_testenv.testing.differential.errors import HarnessAborted
from miles.utils.k8s_testenv.testing.differential.views import PodRow
from miles.utils.workers.reconcile.k8s_objects import DynamicObject
from miles.utils.workers.reconcile.resource import Resource

ENGINE_POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
ORACLE_RESOURCE = f"{ENGINE_POOLS.group}/{ENGINE_POOLS.version}/{ENGINE_POOLS.plural}"
"""The oracle's `--resource` for engine pools (GROUP/VERSION/RESOURCE)."""
CRD_MANIFEST = Path(miles.utils.k8s_testenv.__file__).parent / "crds" / "enginepool.yaml"
_SERVED_WITHIN = 60.0


def pool_summary(
    *, generation: int | None, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> str:
    """`replicas=2 engine=sglang gen=3 ready=1 observed=2`: what the spec writes and the status
    subresource's writes change."""
    return (
        f"replicas={spec.get('replicas')} engine={spec.get('engine')} gen={generation} "
        f"ready={status.get('readyReplicas')} observed={status.get('observedGeneration')}"
    )


def pool_row_of_json(item: Mapping[str, Any], parent: str | None) -> PodRow:
    meta = item["metadata"]
    return _pool_row(meta["uid"], meta["resourceVersion"], meta.get("generation"), item, parent)


def pool_row(pool: DynamicObject, parent: str) -> PodRow:
    meta = pool.metadata
    uid, version = meta.uid or "", meta.resource_version or ""
    return _pool_row(uid, version, meta.generation, pool, parent)


def _pool_row(
    uid: str,
    resource_version: str,
    generation: int | None,
    pool: Mapping[str, Any] | DynamicObject,
    parent: str | None,
) -> PodRow:
    spec, status = pool.get("spec") or {}, pool.get("status") or {}
    summary = pool_summary(generation=generation, spec=spec, status=status)
    return PodRow(uid=uid, resource_version=resource_version, parent=parent, status=summary)


async def install_engine_pools(*, writer_api: Any, target_api: Any, namespace: str) -> None:
    """Creates the CRD through the writers' apiserver (or finds it there) and returns once the
    clients' apiserver serves engine pools in `namespace`: each apiserver installs a CRD's
    handler on its own, and a client started before would wait out its 10 s retry."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    manifest = yaml.safe_load(CRD_MANIFEST.read_text())
    try:
        await client.ApiextensionsV1Api(writer_api).create_custom_resource_definition(manifest)
    except ApiException as err:
        if err.status != 409:
            raise
    custom = client.CustomObjectsApi(target_api)
    deadline = time.monotonic() + _SERVED_WITHIN
    while True:
        try:
            await custom.list_namespaced_custom_object(
                ENGINE_POOLS.group, ENGINE_POOLS.version, namespace, ENGINE_POOLS.plural
            )
            return
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise HarnessAborted(
                    f"the clients' apiserver does not serve {ENGINE_POOLS}: {err.status} "
                    f"{err.reason}"
                ) from err
        await asyncio.sleep(0.2)
