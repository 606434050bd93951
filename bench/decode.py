"""Decode cost per pod: our bytes -> ``Pod`` path against ``kubernetes_asyncio``'s deserializer.

Run from the repository root: ``.venv/bin/python -m bench.decode [--pods 200]``. Every figure is the
best of several rounds in one process, so the ratios hold on a noisy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from miles.utils.k8s_testenv.testing.k8s_fakes import frame, list_body, pod_bytes, realistic_pod
from miles.utils.workers.reconcile.k8s_api import decode_pod_list, decode_watch_line
from miles.utils.workers.reconcile.k8s_types import Pod


def best_us(fn: Callable[[], object], number: int, rounds: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6


async def measure(pods: int) -> list[tuple[str, float, float]]:
    from kubernetes_asyncio.client import ApiClient
    from kubernetes_asyncio.watch import Watch

    one = realistic_pod("engine-0", "cell-0")
    raw = pod_bytes(one)
    text = raw.decode()
    line = frame("MODIFIED", one)
    body = list_body([realistic_pod(f"engine-{i}", f"cell-{i % 10}") for i in range(pods)], "9")
    body_text = body.decode()
    async with ApiClient() as client:
        watch = Watch()

        def ka_pod() -> Any:
            return client.deserialize(SimpleNamespace(data=text), "V1Pod")

        def ka_frame() -> Any:
            return watch.unmarshal_event(line.decode(), "V1Pod")

        def ka_list() -> Any:
            return client.deserialize(SimpleNamespace(data=body_text), "V1PodList")

        rows = [
            (
                "pod: bytes -> model",
                best_us(lambda: Pod.model_validate_json(raw), 2000),
                best_us(ka_pod, 200),
            ),
            (
                "watch frame: line -> event",
                best_us(lambda: decode_watch_line(line), 2000),
                best_us(ka_frame, 200),
            ),
            (
                f"LIST of {pods}, per pod",
                best_us(lambda: decode_pod_list(body), 10) / pods,
                best_us(ka_list, 2) / pods,
            ),
        ]
        await watch.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=200)
    args = parser.parse_args()
    size = len(pod_bytes(realistic_pod("engine-0", "cell-0")))
    print(f"realistic pod: {size} bytes of JSON")
    print(f"{'path':<28} {'ours µs':>10} {'kubernetes_asyncio µs':>22} {'ratio':>7}")
    for name, ours, theirs in asyncio.run(measure(args.pods)):
        print(f"{name:<28} {ours:>10.1f} {theirs:>22.1f} {theirs / ours:>6.1f}x")


if __name__ == "__main__":
    main()
