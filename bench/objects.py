"""Decode cost per object of any kind against the pod path's: a LIST's pages and WATCH lines of
custom objects (an engine pool of a pod's size) decoded into the user's typed model and into a
``DynamicObject``, against the same count of realistic pods through the pod decoders.

Run from the repository root: ``.venv/bin/python -m bench.objects [--objects 10000] [--rounds 9]``.

Every figure is the best of ``--rounds`` rounds of this process's CPU time, the sides alternating
round by round (as ``bench/decode.py``), so the ratios hold on a busy machine. It measures the
decode alone, what the any-kind path changes: the transport and the reflector around it are the
pods' own, bound at construction. Targets (the any-kind record row): typed within 1.1x the pod's
per WATCH event and 1.3x per LIST item, dynamic within 1.5x.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field

from miles.utils.k8s_testenv.testing.k8s_fakes import frame, list_body, realistic_pod
from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.k8s_objects import (
    DynamicObject,
    KubernetesModel,
    KubernetesObject,
)
from miles.utils.workers.reconcile.k8s_types import Lenient, OrEmpty, PodCondition
from miles.utils.workers.reconcile.k8s_wire import ObjectDecoder, decode_pod_list, decode_watch_line

PAGE = 500


class EnginePoolSpec(KubernetesModel):
    replicas: Lenient[int] = 0
    engine: Lenient[str | None] = None
    node_selector: Lenient[dict[str, str]] = Field(default_factory=dict)


class EnginePoolStatus(KubernetesModel):
    ready_replicas: Lenient[int] = 0
    phase: Lenient[str | None] = None
    conditions: Lenient[list[PodCondition]] = Field(default_factory=list)


class EnginePool(KubernetesObject):
    """A user's model of the engine pool, reading about as much of it as ``Pod`` reads of a pod."""

    spec: OrEmpty[EnginePoolSpec] = EnginePoolSpec()
    status: OrEmpty[EnginePoolStatus] = EnginePoolStatus()


def engine_pool(i: int) -> dict[str, Any]:
    """A custom object of a realistic pod's size: its metadata (managed fields included), the pod's
    spec as the pool's template, its status's conditions."""
    pod = realistic_pod(f"engine-{i}", f"cell-{i % 10}")
    return {
        "apiVersion": "miles.io/v1alpha1",
        "kind": "EnginePool",
        "metadata": pod["metadata"],
        "spec": {
            "replicas": 3,
            "engine": "sglang",
            "nodeSelector": {"pool": f"cell-{i % 10}"},
            "template": pod["spec"],
        },
        "status": {
            "readyReplicas": 3,
            "phase": "Running",
            "conditions": pod["status"]["conditions"],
            "engines": pod["status"]["containerStatuses"],
        },
    }


def _best(sides: list[Callable[[], object]], rounds: int) -> list[float]:
    best = [float("inf")] * len(sides)
    for _ in range(rounds):
        for i, side in enumerate(sides):
            started = time.process_time()
            side()
            best[i] = min(best[i], time.process_time() - started)
    return best


def measure(objects: int, rounds: int) -> list[tuple[str, float, float]]:
    pods = [realistic_pod(f"engine-{i}", f"cell-{i % 10}") for i in range(objects)]
    pools = [engine_pool(i) for i in range(objects)]
    pod_bytes = sum(len(json.dumps(p)) for p in pods) / objects
    pool_bytes = sum(len(json.dumps(p)) for p in pools) / objects
    print(f"bytes per object: pod {pod_bytes:.0f}, engine pool {pool_bytes:.0f}")
    typed = ObjectDecoder(EnginePool, kind="EnginePool")
    dynamic = ObjectDecoder(DynamicObject, kind="EnginePool")
    sample = typed.decode_watch_line(frame("MODIFIED", pools[0])).object
    assert sample is not None
    assert sample.status.ready_replicas == 3, "the model reads the pool"
    assert sample.spec.node_selector, "the model reads the pool's camelCase fields"

    def pages(items: list[dict[str, Any]]) -> list[bytes]:
        return [list_body(items[i : i + PAGE], "9") for i in range(0, objects, PAGE)]

    pod_pages, pool_pages = pages(pods), pages(pools)

    def listed(decode: Callable[[bytes], object], bodies: list[bytes]) -> Callable[[], object]:
        def run() -> object:
            with COLLECTOR.held():
                return [decode(body) for body in bodies]

        return run

    modified = []
    for p in pools[:2000]:
        changed = copy.deepcopy(p)
        changed["metadata"]["resourceVersion"] = "1001"
        modified.append(changed)
    pod_lines = [frame("MODIFIED", p) for p in pods[:2000]]
    pool_lines = [frame("MODIFIED", p) for p in modified]

    def watched(decode: Callable[[bytes], object], lines: list[bytes]) -> Callable[[], object]:
        def run() -> None:
            for line in lines:
                decode(line)

        return run

    list_us = _best(
        [
            listed(decode_pod_list, pod_pages),
            listed(typed.decode_list, pool_pages),
            listed(dynamic.decode_list, pool_pages),
        ],
        rounds,
    )
    watch_us = _best(
        [
            watched(decode_watch_line, pod_lines),
            watched(typed.decode_watch_line, pool_lines),
            watched(dynamic.decode_watch_line, pool_lines),
        ],
        rounds,
    )
    per_item = [t / objects * 1e6 for t in list_us]
    per_event = [t / len(pod_lines) * 1e6 for t in watch_us]
    return [
        (f"LIST of {objects} in pages of {PAGE}, typed, per item", per_item[1], per_item[0]),
        (f"LIST of {objects} in pages of {PAGE}, dynamic, per item", per_item[2], per_item[0]),
        ("WATCH line, typed, per event", per_event[1], per_event[0]),
        ("WATCH line, dynamic, per event", per_event[2], per_event[0]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rows = measure(args.objects, args.rounds)
    print(f"{'case':<48} {'object µs':>10} {'pod µs':>8} {'ratio':>6}")
    for name, ours, pod in rows:
        print(f"{name:<48} {ours:>10.1f} {pod:>8.1f} {ours / pod:>5.2f}x")


if __name__ == "__main__":
    main()
