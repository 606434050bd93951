"""Decode cost per pod: our bytes -> ``Pod`` path against ``kubernetes_asyncio``'s deserializer.

Run from the repository root: ``.venv/bin/python -m bench.decode [--pods 200] [--rounds 15]``.
It measures the realistic pod, and the same pod with an init container, which carries every field
``k8s_types`` reads; then ours against itself with the pod's ``managedFields`` left in (what
``managed_fields.without_managed_fields`` cuts out before validating; the fake pod's are 19% of its
bytes, an apiserver's 44-45%); then ``k8s_types.PodList`` over one document of ``--list-pods``
pods (10,000), as an apiserver's LIST body and as ``kubectl get pods -o json`` prints it, against
the same pods decoded as a LIST is today, ``k8s_wire.decode_pod_list`` page after page of 500.
Every figure is the best of several rounds of this process's CPU time, the two sides alternating
round by round, so the ratios hold on a machine that other runs keep busy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import timeit
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from miles.utils.k8s_testenv.testing.k8s_fakes import frame, list_body, pod_bytes, realistic_pod
from miles.utils.workers.reconcile import k8s_wire
from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.k8s_types import Pod, PodList
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list, decode_watch_line
from miles.utils.workers.reconcile.managed_fields import (
    validated_without_managed_fields,
    without_managed_fields,
)

Timed = tuple[Callable[[], object], int]


def best_us(ours: Timed, theirs: Timed, rounds: int) -> tuple[float, float]:
    """Best µs per call of each, over ``rounds`` rounds that alternate between the two."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, (fn, number) in enumerate((ours, theirs)):
            spent = timeit.Timer(fn, timer=time.process_time).timeit(number)
            best[i] = min(best[i], spent / number * 1e6)
    return best[0], best[1]


async def measure(
    pods: int, rounds: int, *, init_container: bool
) -> list[tuple[str, float, float]]:
    from kubernetes_asyncio.client import ApiClient
    from kubernetes_asyncio.watch import Watch

    one = realistic_pod("engine-0", "cell-0", init_container=init_container)
    raw = pod_bytes(one)
    text = raw.decode()
    line = frame("MODIFIED", one)
    many = (
        realistic_pod(f"engine-{i}", f"cell-{i % 10}", init_container=init_container)
        for i in range(pods)
    )
    body = list_body(many, "9")
    body_text = body.decode()
    async with ApiClient() as client:
        watch = Watch()

        def ka_pod() -> Any:
            return client.deserialize(SimpleNamespace(data=text), "V1Pod")

        def ka_frame() -> Any:
            return watch.unmarshal_event(line.decode(), "V1Pod")

        def ka_list() -> Any:
            return client.deserialize(SimpleNamespace(data=body_text), "V1PodList")

        pod_us = best_us((lambda: Pod.model_validate_json(raw), 500), (ka_pod, 50), rounds)
        frame_us = best_us((lambda: decode_watch_line(line), 500), (ka_frame, 50), rounds)
        list_us = best_us((lambda: decode_pod_list(body), 5), (ka_list, 1), rounds)
        rows = [
            ("pod: bytes -> model", *pod_us),
            ("watch frame: line -> event", *frame_us),
            (f"LIST of {pods}, per pod", list_us[0] / pods, list_us[1] / pods),
        ]
        await watch.close()
    return rows


def measure_cut(pods: int, rounds: int) -> list[tuple[str, float, float]]:
    """A watch line's validation with the cut against without it, and ``decode_pod_list`` against
    the same page validated as it came, the collector paused as ``decode_pod_list`` pauses it."""
    one = realistic_pod("engine-0", "cell-0")
    line = frame("MODIFIED", one)
    body = list_body((realistic_pod(f"engine-{i}", f"cell-{i % 10}") for i in range(pods)), "9")

    def page(data: bytes) -> object:
        with COLLECTOR.held():
            return k8s_wire._PodList.model_validate_json(data)

    validate_frame = k8s_wire._FRAME.validate_json
    frame_us = best_us(
        (lambda: validated_without_managed_fields(validate_frame, line, most=1), 500),
        (lambda: validate_frame(line), 500),
        rounds,
    )
    list_us = best_us((lambda: decode_pod_list(body), 5), (lambda: page(body), 5), rounds)
    return [
        ("watch frame: validation", *frame_us),
        (f"LIST of {pods}, per pod", list_us[0] / pods, list_us[1] / pods),
    ]


def measure_pod_list(pods: int, rounds: int) -> list[tuple[str, float, float]]:
    """``PodList`` over one document of ``pods`` pods against ``decode_pod_list`` over the same pods
    in pages of 500, every page kept, with the collector paused across them as the pager pauses
    it. The kubectl print carries each item's ``kind`` and no ``managedFields`` (kubectl hides
    them), indented by 4 as kubectl indents."""
    every = [realistic_pod(f"engine-{i}", f"cell-{i % 10}") for i in range(pods)]
    page_size = 500
    pages = [list_body(every[i : i + page_size], "9") for i in range(0, pods, page_size)]
    body = list_body(every, "9")
    printed = [{"apiVersion": "v1", "kind": "Pod"} | p for p in every]
    for p in printed:
        p["metadata"] = {k: v for k, v in p["metadata"].items() if k != "managedFields"}
    kubectl = json.dumps({"apiVersion": "v1", "kind": "List", "items": printed}, indent=4).encode()

    def paged() -> object:
        with COLLECTOR.held():
            return [decode_pod_list(page) for page in pages]

    body_us = best_us((lambda: PodList.model_validate_json(body), 1), (paged, 1), rounds)
    kubectl_us = best_us((lambda: PodList.model_validate_json(kubectl), 1), (paged, 1), rounds)
    return [
        (f"LIST body of {pods}, per pod", body_us[0] / pods, body_us[1] / pods),
        (f"kubectl print of {pods}, per pod", kubectl_us[0] / pods, kubectl_us[1] / pods),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--list-pods", type=int, default=10_000)
    args = parser.parse_args()
    print(f"best of {args.rounds} rounds of CPU time")
    for init_container in (False, True):
        size = len(pod_bytes(realistic_pod("engine-0", "cell-0", init_container=init_container)))
        label = "with an init container" if init_container else "one container"
        print(f"\nrealistic pod, {label}: {size} bytes of JSON")
        print(f"{'path':<28} {'ours µs':>10} {'kubernetes_asyncio µs':>22} {'ratio':>7}")
        rows = asyncio.run(measure(args.pods, args.rounds, init_container=init_container))
        for name, ours, theirs in rows:
            print(f"{name:<28} {ours:>10.1f} {theirs:>22.1f} {theirs / ours:>6.1f}x")
    one = pod_bytes(realistic_pod("engine-0", "cell-0"))
    print(
        f"\nthe same pod, ours against ours with managedFields left in ({len(one)} bytes of JSON,"
    )
    print(f"{len(without_managed_fields(one))} without them)")
    print(f"{'path':<28} {'ours µs':>10} {'managedFields in µs':>22} {'ratio':>7}")
    for name, ours, whole in measure_cut(args.pods, args.rounds):
        print(f"{name:<28} {ours:>10.1f} {whole:>22.1f} {whole / ours:>6.2f}x")
    print("\nk8s_types.PodList, one document, against decode_pod_list in pages of 500")
    print(f"{'path':<34} {'PodList µs':>10} {'pages µs':>10} {'ratio':>7}")
    for name, ours, paged in measure_pod_list(args.list_pods, max(3, args.rounds // 3)):
        print(f"{name:<34} {ours:>10.1f} {paged:>10.1f} {paged / ours:>6.2f}x")


if __name__ == "__main__":
    main()
