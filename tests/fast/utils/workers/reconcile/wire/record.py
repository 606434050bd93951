"""Re-records the wire fixtures beside this file from a real kube-apiserver (k8s_testenv's pins).

``.venv/bin/python -m tests.fast.utils.workers.reconcile.wire.record``: starts a local control
plane, creates pods in namespace ``wire``, and saves the exact response bytes of a LIST, a WATCH
(ADDED, MODIFIED, DELETED, BOOKMARK), an in-band ERROR 410, an HTTP 410 (an exact LIST at a
compacted resourceVersion) and an HTTP 504 (a LIST at a resourceVersion from the future).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv.client import api_client
from miles.utils.k8s_testenv.control_plane import LocalControlPlane
from miles.utils.k8s_testenv.testing.k8s_fakes import PARENT_LABEL, realistic_pod

HERE = Path(__file__).parent
NAMESPACE = "wire"


def _manifest(name: str) -> dict[str, Any]:
    pod = realistic_pod(name, "cell-0", namespace=NAMESPACE)
    meta = pod["metadata"]
    del pod["spec"]["containers"][0]["volumeMounts"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations")},
        "spec": pod["spec"],
    }


def _status(restarts: int) -> dict[str, Any]:
    status = realistic_pod("x", restart_count=restarts)["status"]
    return {"status": status}


async def _raw(resp: Any) -> tuple[int, bytes]:
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


async def _watch_lines(core: Any, rv: str, seconds: int, during: Any = None) -> bytes:
    resp = await core.list_namespaced_pod(
        NAMESPACE,
        label_selector=f"{PARENT_LABEL}=cell-0",
        watch=True,
        allow_watch_bookmarks=True,
        resource_version=rv,
        timeout_seconds=seconds,
        _preload_content=False,
    )
    task = asyncio.create_task(during()) if during else None
    body: bytes = await resp.read()
    resp.release()
    if task:
        await task
    return body


async def record(plane: LocalControlPlane) -> None:
    from kubernetes_asyncio import client

    async with (
        api_client(plane.cached_kubeconfig) as cached,
        api_client(plane.uncached_kubeconfig) as uncached,
    ):
        core: Any = client.CoreV1Api(cached)
        await core.create_namespace({"metadata": {"name": NAMESPACE}})
        for name in ("engine-0", "engine-1"):
            await core.create_namespaced_pod(NAMESPACE, _manifest(name))
            await core.patch_namespaced_pod_status(name, NAMESPACE, _status(0))
        code, body = await _raw(
            await core.list_namespaced_pod(
                NAMESPACE, label_selector=f"{PARENT_LABEL}=cell-0", _preload_content=False
            )
        )
        assert code == 200, body
        (HERE / "list.json").write_bytes(body)
        list_rv = json.loads(body)["metadata"]["resourceVersion"]

        async def churn() -> None:
            await asyncio.sleep(0.5)
            await core.create_namespaced_pod(NAMESPACE, _manifest("engine-2"))
            await core.patch_namespaced_pod_status("engine-1", NAMESPACE, _status(1))
            await core.delete_namespaced_pod("engine-0", NAMESPACE, grace_period_seconds=0)

        (HERE / "watch.jsonl").write_bytes(await _watch_lines(core, list_rv, 6, churn))

        revision = plane.compact_etcd()
        old: Any = client.CoreV1Api(uncached)
        (HERE / "watch_error_410.jsonl").write_bytes(await _watch_lines(old, "2", 2))
        code, body = await _raw(
            await old.list_namespaced_pod(
                NAMESPACE,
                resource_version="2",
                resource_version_match="Exact",
                _preload_content=False,
            )
        )
        (HERE / f"http_{code}.json").write_bytes(body)
        resp = await core.list_namespaced_pod(
            NAMESPACE, resource_version=str(revision + 10**9), _preload_content=False
        )
        code, body = await _raw(resp)
        (HERE / f"http_{code}.json").write_bytes(body)


def main() -> None:
    with LocalControlPlane(keep=False) as plane:
        asyncio.run(record(plane))
    for path in sorted(HERE.glob("*.json*")):
        print(path.name, path.stat().st_size)


if __name__ == "__main__":
    main()
