"""Decode cost per pod: our bytes -> ``Pod`` path against ``kubernetes_asyncio``'s deserializer.

Run from the repository root: ``.venv/bin/python -m bench.decode [--pods 200] [--rounds 15]``.
It measures the realistic pod, and the same pod with an init container, which carries every field
``k8s_types`` reads; then ours against itself with the pod's ``managedFields`` left in (what
``managed_fields.without_managed_fields`` cuts out before validating; the fake pod's are 19% of its
bytes, an apiserver's 44-45%); then ``k8s_types.PodList`` over one document of ``--list-pods``
pods (10,000), as an apiserver's LIST body and as ``kubectl get pods -o json`` prints it, against
the same pods decoded as a LIST is today, ``k8s_wire.decode_pod_list`` page after page of 500.
Every figure is the best of several rounds of this process's CPU time, the two sides alternating
round by round, so the ratios hold on a machine that other runs keep busy. The ``PodList`` rows
are followed by the peak RSS one decode of each side adds, each in a fresh interpreter (Linux
only; the ratio is pages / ours).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.soak_sampler import status_mib
from miles.utils.k8s_testenv.testing.k8s_fakes import frame, list_body, pod_bytes, realistic_pod
from miles.utils.workers.reconcile import k8s_wire
from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.heap_trim import trim_free_heap
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


def _pod_list_documents(pods: int) -> SimpleNamespace:
    """One LIST body of ``pods`` pods, the same pods as kubectl prints them (each item's ``kind``,
    no ``managedFields``, which kubectl hides, indented by 4 as kubectl indents), and as pages of
    500 decoded one after another, every page kept, with the collector paused across them as the
    pager pauses it."""
    every = [realistic_pod(f"engine-{i}", f"cell-{i % 10}") for i in range(pods)]
    page_size = 500
    pages = [list_body(every[i : i + page_size], "9") for i in range(0, pods, page_size)]
    printed = [{"apiVersion": "v1", "kind": "Pod"} | p for p in every]
    for p in printed:
        p["metadata"] = {k: v for k, v in p["metadata"].items() if k != "managedFields"}
    kubectl = json.dumps({"apiVersion": "v1", "kind": "List", "items": printed}, indent=4).encode()

    def paged() -> object:
        with COLLECTOR.held():
            return [decode_pod_list(page) for page in pages]

    return SimpleNamespace(body=list_body(every, "9"), kubectl=kubectl, paged=paged)


def measure_pod_list(pods: int, rounds: int) -> list[tuple[str, float, float]]:
    """``PodList`` over one document of ``pods`` pods, a LIST body and kubectl's print, against
    ``decode_pod_list`` over the same pods in pages of 500 (``_pod_list_documents``)."""
    docs = _pod_list_documents(pods)
    _raise_the_mmap_threshold()
    body_us = best_us((lambda: PodList.model_validate_json(docs.body), 1), (docs.paged, 1), rounds)
    kubectl_us = best_us(
        (lambda: PodList.model_validate_json(docs.kubectl), 1), (docs.paged, 1), rounds
    )
    return [
        (f"LIST body of {pods}, per pod", body_us[0] / pods, body_us[1] / pods),
        (f"kubectl print of {pods}, per pod", kubectl_us[0] / pods, kubectl_us[1] / pods),
    ]


def _raise_the_mmap_threshold() -> None:
    """glibc serves a block of 128 KiB or more by a fresh mmap until one such block is freed, then
    raises its threshold to that block's size (up to 32 MiB). A LIST page's bytes are such blocks,
    freed and served again, page-faulting every time until something frees a larger one, so
    whichever side frees one first sets the other's faults (the pages read 41-49 µs per pod
    without this, 28-40 with it, three runs each). Free one here, as a process that has read a
    large body has."""
    block = bytes(30 * 2**20)
    del block


_CLEAR_REFS = "/proc/self/clear_refs"


def measure_pod_list_memory(pods: int) -> list[tuple[str, float, float]]:
    """The peak RSS one decode of ``measure_pod_list``'s adds, in MiB, each decode in a fresh
    interpreter; none where Linux's ``clear_refs`` cannot reset the peak."""
    if not os.access(_CLEAR_REFS, os.W_OK):
        return []

    def peak(side: str) -> float:
        code = f"from bench.decode import peak_growth_mib as p; print(p({side!r}, {pods}))"
        root = Path(__file__).resolve().parents[1]
        env = os.environ | {"PYTHONPATH": str(root)}
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        return float(run.stdout.split()[-1])

    pages = peak("paged")
    return [
        (f"LIST body of {pods}, peak MiB", peak("body"), pages),
        (f"kubectl print of {pods}, peak MiB", peak("kubectl"), pages),
    ]


def peak_growth_mib(side: str, pods: int) -> float:
    """In this process: how far one decode of ``side`` raises the peak RSS over what is resident
    before it (collected and trimmed), what it returns kept alive as a caller keeps it."""
    docs = _pod_list_documents(pods)
    decode: Callable[[], object] = {
        "body": lambda: PodList.model_validate_json(docs.body),
        "kubectl": lambda: PodList.model_validate_json(docs.kubectl),
        "paged": docs.paged,
    }[side]
    gc.collect()
    trim_free_heap()
    with open(_CLEAR_REFS, "w") as clear:
        clear.write("5")
    before = status_mib("VmRSS")
    kept = decode()
    growth = status_mib("VmHWM") - before
    del kept
    return growth


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
    print("(CPU µs per pod; then the peak RSS one decode adds, where Linux lets it be read)")
    print(f"{'path':<34} {'PodList':>10} {'pages':>10} {'ratio':>7}")
    rounds = max(3, args.rounds // 3)
    for name, ours, paged in [
        *measure_pod_list(args.list_pods, rounds),
        *measure_pod_list_memory(args.list_pods),
    ]:
        print(f"{name:<34} {ours:>10.1f} {paged:>10.1f} {paged / ours:>6.2f}x")


if __name__ == "__main__":
    main()
