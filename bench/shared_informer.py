"""What a loop's cache holds per pod, and what a second loop over the same pods costs, against a
real kube-apiserver: full pods against metadata-only (``PartialObjectMetadata`` from the
apiserver), and two loops apart against two loops on one ``informer.SharedInformer``.

Run from the repository root::

    .venv/bin/python -m bench.shared_informer              # 10,000 pods over 1,000 parents
    .venv/bin/python -m bench.shared_informer --pods 1000  # smaller

It starts a local control plane (or reuses ``MILES_K8S_KUBECONFIG``), seeds the pods as
``bench.apiserver`` does (``bench/apiserver_seed.py``: realistic pods with full status and
managed fields), then runs each case once in its own process. A case builds its loops, starts
them (``start()`` returns once every store holds the listing and every parent is queued), collects
garbage and reports the Python memory still held since just before the loops were built
(``tracemalloc``, so the figure is what the caches retain, not the allocator's slack), per stored
pod. The parent reads the apiserver's ``apiserver_request_total`` for pods before and after each
case: the LIST pages (500 per page) and WATCHes the case made.

Cases: ``typed`` (one loop, ``k8s_types.Pod``), ``dynamic`` (one loop, ``DynamicObject``: every
field), ``metadata`` (one loop, ``metadata_only=True`` into ``PartialObjectMetadata``),
``two-apart`` (two typed loops, each its own reflector) and ``two-shared`` (two typed loops
subscribed to one shared informer).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.apiserver_proc import PARENT_LABEL

WATCH_COUNTED_AFTER = 2.0
"""The apiserver counts a WATCH in ``apiserver_request_total`` when it ends: read the counts this
long after the case's process closed its watches."""
CASES = ("typed", "dynamic", "metadata", "two-apart", "two-shared")


def _parent(obj: Any) -> str | None:
    labels: dict[str, str] = obj.metadata.labels
    return labels.get(PARENT_LABEL)


async def _noop(parent: str) -> None:
    return None


async def run_case(case: str, kubeconfig: Path, namespace: str) -> dict[str, Any]:
    from miles.utils.k8s_testenv.client import api_client
    from miles.utils.workers.reconcile.informer import SharedInformerFactory
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioResourceApi
    from miles.utils.workers.reconcile.k8s_objects import DynamicObject, PartialObjectMetadata
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.k8s_types import Pod
    from miles.utils.workers.reconcile.loop import ReconcileLoop
    from miles.utils.workers.reconcile.resource import PODS

    model: Any = {"dynamic": DynamicObject, "metadata": PartialObjectMetadata}.get(case, Pod)
    async with api_client(kubeconfig) as api, SharedInformerFactory() as factory:
        pods = KubernetesAsyncioResourceApi(
            api_client=api, resource=PODS, model=model, metadata_only=case == "metadata"
        )
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        if case == "two-shared":
            informer = factory.for_resource(pods, namespace=namespace)
            sources: list[Any] = [informer.subscribe("one"), informer.subscribe("two")]
        else:
            count = 2 if case == "two-apart" else 1
            sources = [
                KubernetesReflector(api=pods, namespace=namespace).watch for _ in range(count)
            ]
        loops = [
            ReconcileLoop(source=source, reconcile=_noop, key_map=_parent, name=f"loop-{i}")
            for i, source in enumerate(sources)
        ]
        for loop in loops:
            await loop.start()
        await _watching(loops)
        try:
            stored = loops[0].status().objects_stored
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
        finally:
            for loop in loops:
                await loop.stop()
    return {"case": case, "loops": len(loops), "stored": stored, "held_bytes": held}


async def _watching(loops: list[Any]) -> None:
    """Until every loop's source watches, so the WATCH each opened is counted."""
    from miles.utils.workers.reconcile.status import SourcePhase

    for _ in range(1200):
        if all(loop.status().source.phase is SourcePhase.WATCHING for loop in loops):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


async def _pod_reads(kubeconfig: Path) -> dict[str, int]:
    from miles.utils.k8s_testenv.apiserver_metrics import apiserver_requests
    from miles.utils.k8s_testenv.client import api_client

    async with api_client(kubeconfig) as api:
        return await apiserver_requests(api, "pods", "LIST", "WATCH")


def _child(case: str, kubeconfig: Path, namespace: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.shared_informer",
            "--child",
            case,
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _measure(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    rows = []
    for case in CASES:
        before = asyncio.run(_pod_reads(kubeconfig))
        row = _child(case, kubeconfig, namespace)
        time.sleep(WATCH_COUNTED_AFTER)
        after = asyncio.run(_pod_reads(kubeconfig))
        row.update({verb: after[verb] - before[verb] for verb in before})
        row["per_pod"] = row["held_bytes"] / max(row["stored"], 1)
        print(
            f"{case:>10}: {row['loops']} loop(s), {row['stored']} pods stored, held"
            f" {row['held_bytes'] / 2**20:.1f} MiB = {row['per_pod']:.0f} B per pod;"
            f" pod requests LIST {row['LIST']} WATCH {row['WATCH']}",
            flush=True,
        )
        rows.append(row)
    return rows


def _summary(rows: list[dict[str, Any]]) -> None:
    by = {row["case"]: row for row in rows}
    typed, meta, dyn = by["typed"], by["metadata"], by["dynamic"]
    print(
        f"metadata-only saves {dyn['per_pod'] - meta['per_pod']:.0f} B per pod against dynamic"
        f" ({meta['per_pod'] / dyn['per_pod']:.2f}x) and"
        f" {typed['per_pod'] - meta['per_pod']:.0f} B against typed"
        f" ({meta['per_pod'] / typed['per_pod']:.2f}x)"
    )
    apart, shared = by["two-apart"], by["two-shared"]
    print(
        f"second loop: apart +{(apart['held_bytes'] - typed['held_bytes']) / 2**20:.1f} MiB,"
        f" LIST {apart['LIST']} WATCH {apart['WATCH']}; shared"
        f" +{(shared['held_bytes'] - typed['held_bytes']) / 2**20:.1f} MiB,"
        f" LIST {shared['LIST']} WATCH {shared['WATCH']} (one loop: LIST {typed['LIST']}"
        f" WATCH {typed['WATCH']})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.shared_informer")
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--parents", type=int, default=1_000)
    parser.add_argument("--child", choices=CASES)
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--namespace")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(run_case(args.child, args.kubeconfig, args.namespace))))
        return
    from bench.apiserver import environment, prepare

    logs = Path(tempfile.mkdtemp(prefix="miles-bench-shared-informer-"))
    with environment(logs, {}) as env:
        scenario, context = asyncio.run(prepare(env, args.pods, args.parents))
        print(
            f"{scenario.pods} pods of {context['pod_bytes']:.0f} B on the wire over"
            f" {scenario.parents} parents in {scenario.namespace}",
            flush=True,
        )
        _summary(_measure(env.kubeconfig, scenario.namespace))


if __name__ == "__main__":
    main()
