"""What ``KubernetesReflector(consistency_check_period=...)`` costs per check, against a real
kube-apiserver: the wall time and the client's CPU from the watch's close to the next watch, the
bytes the apiserver sent for the check's LIST, and the parents it woke (none, for a right store).

Run from the repository root::

    .venv/bin/python -m bench.consistency_check              # 10,000 pods over 1,000 parents
    .venv/bin/python -m bench.consistency_check --pods 1000  # smaller

It starts a local control plane (or reuses ``MILES_K8S_KUBECONFIG``), seeds the pods as
``bench.apiserver`` does (``bench/apiserver_seed.py``), starts one loop whose reflector checks
every ``--period`` seconds, and times ``--checks`` checks. The bytes are the apiserver's own
``apiserver_response_sizes_sum`` for pod LISTs, read before and after (the client asks for
gzip, as aiohttp does by default), beside the JSON a full LIST carries (pods x their mean size).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.apiserver_proc import PARENT_LABEL

POLL = 0.005
"""Seconds between status samples while waiting for a check to start and end."""


class _Reconciles:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, parent: str) -> None:
        self.count += 1


def _parent(obj: Any) -> str | None:
    labels: dict[str, str] = obj.metadata.labels
    return labels.get(PARENT_LABEL)


async def _list_bytes(api: Any) -> float:
    from miles.utils.k8s_testenv.apiserver_metrics import apiserver_metrics, series_sum

    text = await apiserver_metrics(api)
    return series_sum(text, "apiserver_response_sizes_sum", 'resource="pods"', 'verb="LIST"')


async def _phase_is(loop: Any, relisting: bool) -> None:
    from miles.utils.workers.reconcile.status import SourcePhase

    while True:
        if (loop.status().source.phase is SourcePhase.RELISTING) is relisting:
            return
        await asyncio.sleep(POLL)


async def _quiet(reconciles: _Reconciles) -> None:
    """Until the reconciles of every parent that ``start()`` queued have run: one second with
    none."""
    while True:
        seen = reconciles.count
        await asyncio.sleep(1.0)
        if reconciles.count == seen:
            return


async def measure(
    kubeconfig: Path, namespace: str, period: float, checks: int
) -> list[dict[str, float]]:
    from miles.utils.k8s_testenv.client import api_client
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioResourceApi
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.k8s_types import Pod
    from miles.utils.workers.reconcile.loop import ReconcileLoop
    from miles.utils.workers.reconcile.resource import PODS

    rows = []
    async with api_client(kubeconfig) as api:
        pods = KubernetesAsyncioResourceApi(api_client=api, resource=PODS, model=Pod)
        reflector = KubernetesReflector(
            api=pods, namespace=namespace, consistency_check_period=period
        )
        reconciles = _Reconciles()
        loop = ReconcileLoop(source=reflector.watch, reconcile=reconciles, key_map=_parent)
        await loop.start()
        try:
            await _quiet(reconciles)
            for _ in range(checks):
                await _phase_is(loop, relisting=False)
                woken, sent = reconciles.count, await _list_bytes(api)
                await _phase_is(loop, relisting=True)
                wall, cpu = time.perf_counter(), time.process_time()
                await _phase_is(loop, relisting=False)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                await asyncio.sleep(1.0)
                row = {
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "list_bytes": await _list_bytes(api) - sent,
                    "woken": reconciles.count - woken,
                    "stored": loop.status().objects_stored,
                }
                print(
                    f"check: {row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s CPU,"
                    f" {row['list_bytes'] / 2**20:.2f} MiB response sizes (gzip asked),"
                    f" {row['woken']} parents woken, {row['stored']} pods stored",
                    flush=True,
                )
                rows.append(row)
        finally:
            await loop.stop()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.consistency_check")
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--parents", type=int, default=1_000)
    parser.add_argument("--period", type=float, default=15.0)
    parser.add_argument("--checks", type=int, default=3)
    args = parser.parse_args(argv)
    from bench.apiserver import environment, prepare

    logs = Path(tempfile.mkdtemp(prefix="miles-bench-consistency-check-"))
    with environment(logs, {}) as env:
        scenario, context = asyncio.run(prepare(env, args.pods, args.parents))
        print(
            f"{scenario.pods} pods of {context['pod_bytes']:.0f} B on the wire over"
            f" {scenario.parents} parents in {scenario.namespace}; a check every"
            f" {args.period:.0f} s; {scenario.pods * context['pod_bytes'] / 2**20:.1f} MiB of"
            " JSON per full LIST",
            flush=True,
        )
        rows = asyncio.run(measure(env.kubeconfig, scenario.namespace, args.period, args.checks))
    print(
        "median per check: "
        + ", ".join(
            f"{key} {statistics.median(row[key] for row in rows):.3g}"
            for key in ("wall_s", "cpu_s", "list_bytes", "woken")
        )
    )


if __name__ == "__main__":
    main()
