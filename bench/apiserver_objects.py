"""``bench/apiserver.py --kind enginepools``'s custom objects: engine pools of a pod's size.

Go counterpart: none (benchmark plumbing). The engine pool CRD
(``miles/utils/k8s_testenv/crds/enginepool.yaml``) is installed, and ``--pods`` engine pools are
created once in a namespace of their own, each built from the bench's realistic pod of the same
index (its labels and annotations, its spec as the pool's template, its conditions as the pool's),
so that an object is about a pod's size. ``ours`` keeps watching the pods, ``ours-typed`` and
``ours-dynamic`` watch the engine pools through ``KubernetesAsyncioResourceApi`` (the user's model,
``bench/objects.py``'s ``EnginePool``, or ``DynamicObject``) in the same rounds, so that each ratio
is measured in one run. Targets (the any-kind record row): LIST-to-synced within 1.3x the raw
paged LIST of the same objects; CPU (or instructions) per WATCH event within 1.1x the pod path's
typed and 1.5x dynamic, every contender's writer at the same ``PACE``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

import miles.utils.k8s_testenv
from bench.apiserver_proc import NAMESPACE, read_body
from bench.apiserver_seed import _check
from bench.report import Results, fmt, median
from miles.utils.workers.reconcile.resource import Resource

KIND = "enginepools"
SERVED_POOL_EXTRA = 1200
"""Bytes the apiserver adds to a pool as created here: its managedFields (about 1,080), uid,
resourceVersion, creationTimestamp and generation (measured)."""
LIST_ATTEMPTS = 30
"""Tries of the pools' LIST while a CRD just established answers 429."""
POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
CRD_MANIFEST = Path(miles.utils.k8s_testenv.__file__).parent / "crds" / "enginepool.yaml"
PACE = 200.0
"""Patches per second of every contender's writer unless ``--writer-rate`` says otherwise. A
contender's CPU per WATCH event depends on how many events a socket read brings, which the
apiserver sets by how fast it takes the writes: unpaced, it took 385-390 pod patches a second on
two cores and 240-290 engine-pool patches (a custom resource's write costs it more: 5.0-6.3 ms of
CPU per event against 3.4-3.5), handing the pools over at 0.60 reads an event against the pods'
0.31, so the same code read 1.30x the pods' CPU per pool event (docs/benchmarks.md). At one pace
below both, each contender meets the same load."""
PACE_KEPT = 0.9
"""The least share of the pace each contender's writer must have kept for the CPU per WATCH event
of its round to compare."""
CONTENDERS = ("ours-typed", "ours-dynamic")
"""The contenders that watch engine pools; every other one watches the pods."""
CEILINGS = (
    ("sync_s", "ours-typed", "floor-objects", 1.3, "typed LIST-to-synced / the raw paged LIST"),
    ("sync_s", "ours-dynamic", "floor-objects", 1.3, "dynamic LIST-to-synced / the raw paged LIST"),
    ("cpu_per_event", "ours-typed", "ours", 1.1, "typed CPU per WATCH event / the pods'"),
    ("cpu_per_event", "ours-dynamic", "ours", 1.5, "dynamic CPU per WATCH event / the pods'"),
)
INSTRUCTION_CEILINGS = (
    ("instructions_per_event", "ours-typed", "ours", 1.1, "typed instructions per event / pods'"),
    ("instructions_per_event", "ours-dynamic", "ours", 1.5, "dynamic instructions / the pods'"),
)


def namespace_for(objects: int) -> str:
    return f"{NAMESPACE}-pools-{objects}"


def engine_pool(pod: dict[str, Any], namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The create body and the status of an engine pool made of ``pod`` as the apiserver serves it
    (defaulted): its name, labels, annotations and owner, its spec as the template, its status,
    and a padding in the template that brings it to the pod's size."""
    kept = ("name", "generateName", "labels", "annotations", "ownerReferences")
    metadata = {key: pod["metadata"][key] for key in kept if key in pod["metadata"]}
    template: dict[str, Any] = {"spec": pod["spec"], "padding": ""}
    body = {
        "apiVersion": POOLS.api_version,
        "kind": POOLS.kind,
        "metadata": {**metadata, "namespace": namespace},
        "spec": {"replicas": 3, "engine": "sglang", "template": template},
    }
    status = pod.get("status", {})
    # the CRD's schema keeps a condition's unknown fields and prunes the status's: the rest of the
    # pod's status rides in one condition
    rest = {key: value for key, value in status.items() if key != "conditions"}
    engines = {"type": "Engines", "status": "True", "engines": rest}
    pool_status = {"readyReplicas": 3, "conditions": [*status.get("conditions", []), engines]}
    # a pod's managedFields (the server's) are about 1.8 kB more than a pool's: padded here
    served = _size({**body, "status": pool_status}) + SERVED_POOL_EXTRA
    template["padding"] = "x" * max(0, _size(pod) - served)
    return body, pool_status


def _size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


async def install_crd(api: Any) -> None:
    """Creates the CRD (or finds it there) and waits until it is Established."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(api)
    crd = yaml.safe_load(CRD_MANIFEST.read_text())
    try:
        await extensions.create_custom_resource_definition(crd)
    except ApiException as err:
        if err.status != 409:
            raise
    for _ in range(300):
        found = await extensions.read_custom_resource_definition(crd["metadata"]["name"])
        conditions = found.status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{crd['metadata']['name']}: not Established after 30 s")


async def create_pools(
    api: Any,
    *,
    namespace: str,
    pods: list[dict[str, Any]],
    parallel: int,
    progress: Callable[[str], None],
) -> float:
    """Creates an engine pool of each pod (one already there is kept); the seconds taken."""
    from kubernetes_asyncio import client

    custom: Any = client.CustomObjectsApi(api)
    where = (POOLS.group, POOLS.version, namespace, POOLS.plural)
    started = time.monotonic()
    slots = asyncio.Semaphore(parallel)
    done = 0

    async def create(pod: dict[str, Any]) -> None:
        nonlocal done
        body, status = engine_pool(pod, namespace)
        name = body["metadata"]["name"]
        async with slots:
            created = await custom.create_namespaced_custom_object(
                *where, body, _preload_content=False
            )
            await _check(created, f"create engine pool {name}", tolerate=409)
            patched = await custom.patch_namespaced_custom_object_status(
                *where,
                name,
                {"status": status},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
            await _check(patched, f"status of engine pool {name}")
        done += 1
        if done % 2000 == 0:
            progress(
                f"created {done}/{len(pods)} engine pools in {time.monotonic() - started:.0f}s"
            )

    await asyncio.gather(*(create(pod) for pod in pods))
    return time.monotonic() - started


async def list_pools(api: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    from kubernetes_asyncio import client

    custom: Any = client.CustomObjectsApi(api)
    # A CRD just established answers 429 "storage is (re)initializing" for a few seconds.
    for _ in range(LIST_ATTEMPTS):
        resp = await custom.list_namespaced_custom_object(
            POOLS.group,
            POOLS.version,
            namespace,
            POOLS.plural,
            label_selector=selector,
            _preload_content=False,
        )
        body = await read_body(resp)
        if resp.status != 429:
            break
        await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
    if resp.status != 200:
        raise RuntimeError(f"list engine pools in {namespace}: HTTP {resp.status}: {body[:300]!r}")
    items: list[dict[str, Any]] = json.loads(body)["items"]
    return items


def list_page(api: Any, namespace: str, options: dict[str, Any]) -> Any:
    """One raw page of the engine pools' LIST (``bench.apiserver.list_floor``'s request)."""
    from kubernetes_asyncio import client

    custom: Any = client.CustomObjectsApi(api)
    return custom.list_namespaced_custom_object(
        POOLS.group, POOLS.version, namespace, POOLS.plural, **options
    )


def check_ceilings(
    results: Results, ceilings: tuple[tuple[str, str, str, float, str], ...]
) -> bool:
    """Each ratio (> 1: the objects cost more) taken within a round, the median over rounds."""
    print("\ntargets, engine pools (ratios within each round, median over rounds):")
    met = True
    for key, mine, other, ceiling, text in ceilings:
        ratios = [
            r[mine][key] / r[other][key]  # type: ignore[operator]
            for r in results.rounds
            if r.get(mine, {}).get(key) and r.get(other, {}).get(key)
        ]
        shown = " / ".join(fmt(ratio) for ratio in ratios)
        if not ratios:
            print(f"  {text}: n/a")
            continue
        ratio = median(ratios) or 0.0
        verdict = "met" if ratio <= ceiling else "MISSED"
        met = met and verdict == "met"
        print(f"  {text}: {fmt(ratio)}x (rounds {shown}), ceiling {ceiling:g} -> {verdict}")
    return met


def pace_kept(results: Results, rate: float) -> bool:
    """Whether every contender's writer kept ``PACE_KEPT`` of ``rate`` in every round (a writer
    behind its pace meets a load of the apiserver's choosing, so its CPU per event does not
    compare); one line per round and contender that did not."""
    kept = True
    for number, one_round in enumerate(results.rounds, 1):
        for name, values in one_round.items():
            achieved = values.get("writer_rate") if isinstance(values, dict) else None
            if achieved is not None and achieved < PACE_KEPT * rate:
                kept = False
                print(
                    f"  round {number}, {name}: the writer kept {achieved:.0f} of {rate:g}"
                    " patches/s: its CPU per WATCH event does not compare (lower --writer-rate)"
                )
    return kept
