"""The apiserver state of ``bench/apiserver.py``: N realistic pods over P parents, made once.

Each pool size has a namespace of its own (``namespace_for``), so one etcd holds every size the
bench measures and a kept control plane serves the next run without seeding again.

Go counterpart: none (fixture). Each pod is ``realistic_pod`` from the reconcile fakes: created
with ``spec.nodeName`` set (there is no scheduler) and the volumes its mounts name, then given its
full status through the ``status`` subresource, since a create resets status to ``Pending``. The
server writes its own ``managedFields`` (two entries, as on a real cluster: the creator and the
status writer), so the fixture's are dropped. ``--parallel`` requests are in flight at a time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from bench.apiserver_proc import (
    NAMESPACE,
    PARENT_LABEL,
    SELECTOR,
    WRITER_ANNOTATION,
    WRITER_LABEL,
    read_body,
)
from miles.utils.k8s_testenv.testing.k8s_fakes import realistic_pod

SERVER_OWNED_METADATA = ("uid", "resourceVersion", "creationTimestamp", "managedFields")
VOLUMES = [
    {"name": "models", "hostPath": {"path": "/models", "type": "Directory"}},
    {
        "name": "kube-api-access-x7k2p",
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
            ],
        },
    },
]


def namespace_for(pods: int) -> str:
    return f"{NAMESPACE}-{pods}"


def pod_name(index: int) -> str:
    return f"engine-{index}"


def parent_name(index: int, parents: int) -> str:
    return f"cell-{index % parents}"


def manifest(index: int, parents: int, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The create body and the status of pod ``index``."""
    pod = realistic_pod(pod_name(index), parent_name(index, parents), namespace=namespace)
    for field in SERVER_OWNED_METADATA:
        pod["metadata"].pop(field, None)
    pod["spec"]["volumes"] = VOLUMES
    # the writer's keys from the start, so its patches change values, not the pods' size
    pod["metadata"].setdefault("annotations", {})[WRITER_ANNOTATION] = f"seed-{index:08d}"
    pod["metadata"]["labels"][WRITER_LABEL] = "0"
    status = pod.pop("status")
    return pod, status


async def _check(resp: Any, what: str, *, tolerate: int = 0) -> None:
    body = await read_body(resp)
    if resp.status >= 300 and resp.status != tolerate:
        raise RuntimeError(f"{what}: HTTP {resp.status}: {body[:500]!r}")


async def ensure_namespace(core: Any, namespace: str) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        await core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as err:
        if err.status != 409:
            raise


async def list_items(core: Any, namespace: str) -> list[dict[str, Any]]:
    """A full LIST: a paged one served by the watch cache carries no ``remainingItemCount``."""
    resp = await core.list_namespaced_pod(
        namespace, label_selector=SELECTOR, _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(await read_body(resp))["items"]
    return items


async def create_pods(
    core: Any,
    *,
    namespace: str,
    pods: int,
    parents: int,
    parallel: int,
    progress: Callable[[str], None],
    start: int = 0,
) -> float:
    """Creates pods ``engine-{start} .. engine-{pods-1}`` with status; returns the seconds taken."""
    started = time.monotonic()
    slots = asyncio.Semaphore(parallel)
    done = 0

    async def create(index: int) -> None:
        nonlocal done
        body, status = manifest(index, parents, namespace)
        async with slots:
            await _check(
                await core.create_namespaced_pod(namespace, body, _preload_content=False),
                f"create {body['metadata']['name']}",
                tolerate=409,
            )
            await _check(
                await core.patch_namespaced_pod_status(
                    body["metadata"]["name"],
                    namespace,
                    {"status": status},
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                ),
                f"status of {body['metadata']['name']}",
            )
        done += 1
        if done % 2000 == 0:
            progress(f"created {done}/{pods - start} pods in {time.monotonic() - started:.0f}s")

    await asyncio.gather(*(create(index) for index in range(start, pods)))
    return time.monotonic() - started


def mean_pod_bytes(items: list[dict[str, Any]]) -> float:
    """The mean size of a pod's JSON as the apiserver serves it."""
    sizes = [len(json.dumps(item, separators=(",", ":"))) for item in items]
    return sum(sizes) / max(len(sizes), 1)


def parents_of(items: list[dict[str, Any]]) -> int:
    """How many parents the pods name: what a contender waits to have reconciled."""
    return len({item["metadata"]["labels"].get(PARENT_LABEL) for item in items})
