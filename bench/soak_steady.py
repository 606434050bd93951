"""Steady-pool memory of the loop: does its RSS stay flat while its pool does?

Run from the repository root::

    .venv/bin/python -m bench.soak_steady --pods 1300 --rounds 300
    MALLOC_ARENA_MAX=1 .venv/bin/python -m bench.soak_steady --trim     # the allocator experiments

Go counterpart: none. What the soak cannot show, since its pool grows by design: the real decoding
(`decode_pod_list`, `decode_watch_line` over `realistic_pod` JSON), the real reflector, store and
loop, fed by an in-memory API (no HTTP, no harness in the process). Each round writes a burst of
watch frames that keeps the pool's size (label updates, moves between parents, deletes each
followed by a create under a new name); every `--relist-every` rounds the watch ends with a 410 and
the reflector relists; `--grow N` adds N pods a round, for a pool that grows as the soak's does.
After each round, once the loop's store holds the round's last write, RSS,
glibc's heap in use and free, pymalloc's arenas and their bytes in use and the Python objects are
sampled; the report gives each one's first, peak and last value and its growth per 100 rounds
after the warm-up. `--trim` calls `malloc_trim(0)` after each round (before the sample);
`--reader` reads the whole store as JSON rows every 0.1 s, as the soak's harness asks the loop's
process to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import json
import random
import sys
from collections.abc import AsyncIterator
from typing import Any

from bench.soak_sampler import glibc, heap_mib, pymalloc_mib, rss_mib, status_mib, two_term_fit
from miles.utils.k8s_testenv.testing.k8s_fakes import realistic_pod
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_values import ListOptions, PodListPage, PodWatchEvent
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list, decode_watch_line
from miles.utils.workers.reconcile.loop import ReconcileLoop

_LABEL = "miles.io/cell"
_GONE = {"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired", "message": "gone"}
_COLUMNS = ("rss", "anon", "heap_used", "heap_free", "arenas", "in_arenas", "objects", "pods")


class SteadyApi:
    """A paged pod API over JSON pods: a LIST serves them all (one page), a probe an empty page at
    the current resourceVersion, a watch every frame `write` queues until a 410 ends it."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.pods = pods
        self.revision = 1000
        self.frames: asyncio.Queue[bytes] = asyncio.Queue()

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        return await self.list_pod_page(ListOptions(namespace, label_selector))

    async def list_pod_page(self, options: ListOptions) -> PodListPage:
        if options.resource_version is not None:
            return PodListPage((), str(self.revision))
        body = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.revision)},
            "items": list(self.pods.values()),
        }
        page, _ = decode_pod_list(json.dumps(body).encode())
        return page

    async def stream_pods(
        self, *, namespace: str, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        while True:
            event = decode_watch_line(await self.frames.get())
            yield event
            if event.type == "ERROR":
                return

    def write(self, event_type: str, pod: dict[str, Any]) -> None:
        self.revision += 1
        pod["metadata"]["resourceVersion"] = str(self.revision)
        if event_type == "DELETED":
            del self.pods[pod["metadata"]["name"]]
        else:
            self.pods[pod["metadata"]["name"]] = pod
        self.frames.put_nowait(json.dumps({"type": event_type, "object": pod}).encode())

    def reject_cursor(self) -> None:
        self.frames.put_nowait(json.dumps({"type": "ERROR", "object": _GONE}).encode())


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1300)
    parser.add_argument("--parents", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--burst", type=int, default=400, help="frames per round")
    parser.add_argument("--relist-every", type=int, default=5)
    parser.add_argument(
        "--grow", type=int, default=0, help="pods created on top of each burst (a growing pool)"
    )
    parser.add_argument("--warmup", type=int, default=30, help="rounds left out of the fit")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after every round")
    parser.add_argument(
        "--reader",
        action="store_true",
        help="read the whole store as JSON rows every 0.1 s, as the soak's harness does",
    )
    return parser.parse_args()


def _sample(trim: bool, pods: int) -> dict[str, float]:
    libc = glibc()
    if trim and libc is not None:
        libc.malloc_trim(0)
    used, free = heap_mib(libc)
    arenas, in_arenas = pymalloc_mib()
    return {
        "rss": rss_mib(),
        "anon": status_mib("RssAnon"),
        "heap_used": used,
        "heap_free": free,
        "arenas": arenas,
        "in_arenas": in_arenas,
        "objects": float(len(gc.get_objects())),
        "pods": float(pods),
    }


def _slope_per_100(values: list[float]) -> float:
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    spread = sum((x - mean_x) ** 2 for x in range(n))
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread


async def _caught_up(loop: ReconcileLoop, api: SteadyApi, last: str | None) -> None:
    while True:
        stored = sum(len(loop.get_by_parent(p)) for p in loop.parent_keys())
        pod = api.pods.get(last) if last else None
        found = pod is not None and any(
            p.metadata.resource_version == pod["metadata"]["resourceVersion"]
            for p in loop.get_by_parent(pod["metadata"]["labels"][_LABEL])
        )
        if api.frames.empty() and stored == len(api.pods) and (last is None or found):
            return
        await asyncio.sleep(0.01)


def _burst(
    api: SteadyApi, rng: random.Random, args: argparse.Namespace, created: int
) -> tuple[int, str]:
    last = ""
    for _ in range(args.burst):
        name = rng.choice(sorted(api.pods))
        pod = copy.deepcopy(api.pods[name])
        draw = rng.random()
        if draw < 0.5:
            pod["metadata"]["labels"]["gen"] = str(api.revision)
            api.write("MODIFIED", pod)
        elif draw < 0.75:
            pod["metadata"]["labels"][_LABEL] = f"cell-{rng.randrange(args.parents)}"
            api.write("MODIFIED", pod)
        else:
            api.write("DELETED", pod)
            created += 1
            name = f"pod-{created:07d}"
            pod = realistic_pod(name, f"cell-{rng.randrange(args.parents)}")
            api.write("ADDED", pod)
        last = name
    for _ in range(args.grow):
        created += 1
        last = f"pod-{created:07d}"
        api.write("ADDED", realistic_pod(last, f"cell-{rng.randrange(args.parents)}"))
    return created, last


@contextlib.asynccontextmanager
async def _reading(loop: ReconcileLoop, on: bool) -> AsyncIterator[None]:
    async def read() -> None:
        while True:
            rows = [
                [p.metadata.name, p.metadata.uid, p.metadata.resource_version, parent]
                for parent in loop.parent_keys()
                for p in loop.get_by_parent(parent)
            ]
            json.dumps(rows)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(read()) if on else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _run(args: argparse.Namespace) -> list[dict[str, float]]:
    rng = random.Random(args.seed)
    pods = {
        f"pod-{i:07d}": realistic_pod(f"pod-{i:07d}", f"cell-{i % args.parents}")
        for i in range(args.pods)
    }
    api = SteadyApi(pods)
    reflector = KubernetesReflector(
        kube_client=api, namespace="default", label_selector="", retry_delay=0.01
    )

    async def reconcile(parent: str) -> None:
        len(loop.get_by_parent(parent))

    loop = ReconcileLoop(
        source=reflector.watch,
        reconcile=reconcile,
        key_map=lambda pod: pod.metadata.labels.get(_LABEL),
    )
    samples = []
    created = args.pods
    async with loop, _reading(loop, args.reader):
        await _caught_up(loop, api, None)
        samples.append(_sample(args.trim, len(api.pods)))
        for index in range(1, args.rounds + 1):
            created, last = _burst(api, rng, args, created)
            if index % args.relist_every == 0:
                api.reject_cursor()
            await _caught_up(loop, api, last)
            samples.append(_sample(args.trim, len(api.pods)))
    return samples


def _report(samples: list[dict[str, float]], args: argparse.Namespace) -> str:
    fitted = samples[args.warmup :]
    lines = [
        (
            f"pool of {args.pods} pods growing by {args.grow} a round"
            if args.grow
            else f"steady pool of {args.pods} pods"
        )
        + f" over {args.parents} parents, {args.rounds} rounds of "
        f"{args.burst} frames, a relist every {args.relist_every} rounds"
        + (", malloc_trim(0) after each" if args.trim else "")
        + (", the store read as JSON every 0.1 s" if args.reader else ""),
        f"  {'MiB (objects: count)':<22} {'synced':>10} {'peak':>10} {'last':>10} "
        f"{'per 100 rounds':>15} (fit from round {args.warmup})",
    ]
    for column in _COLUMNS:
        values = [s[column] for s in samples]
        slope = _slope_per_100([s[column] for s in fitted])
        lines.append(
            f"  {column:<22} {values[0]:>10.1f} {max(values):>10.1f} {values[-1]:>10.1f} "
            f"{slope:>+15.2f}"
        )
    fit = two_term_fit(
        [s["pods"] for s in fitted],
        [float(i) for i in range(len(fitted))],
        [s["rss"] for s in fitted],
    )
    if fit is not None:
        lines.append(
            f"RSS fitted to the pods and the rounds together: {fit[0] * 1024:+.1f} KiB per pod, "
            f"{fit[1] * 100:+.2f} MiB per 100 rounds (the growth the pool does not explain)"
        )
    return "\n".join(lines)


def main() -> int:
    args = _arguments()
    samples = asyncio.run(_run(args))
    print(_report(samples, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
