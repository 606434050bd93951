"""The load of ``bench/apiserver.py``'s WATCH phase: pod patches as fast as the apiserver takes.

Go counterpart: none (a load generator). Runs in its own process so it never shares an event loop
with a contender. Prints ``ready``, waits for ``go`` on stdin, then keeps ``--concurrency`` merge
patches in flight for ``--seconds``, each setting an annotation and a label of a random pod (never
the parent label; with ``--kind enginepools`` of a random engine pool), and prints ``done`` with
the stamp before the first patch and, per patch, the stamp of its acknowledgement and the
resourceVersion it produced. The annotation's value is
unique to this run and patch, so that no patch is a no-op (which would produce no event).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

from bench.apiserver_objects import KIND, POOLS
from bench.apiserver_proc import (
    WRITER_ANNOTATION,
    WRITER_LABEL,
    emit,
    first_resource_version,
    read_body,
    read_command,
)

MERGE_PATCH = "application/merge-patch+json"


class Writer:
    def __init__(
        self,
        core_v1_api: Any,
        *,
        kind: str = "pods",
        namespace: str,
        names: list[str],
        seconds: float,
        seed: int,
        rate: float = 0.0,
    ) -> None:
        self._patch = core_v1_api.patch_namespaced_pod
        if kind == KIND:
            from kubernetes_asyncio import client

            custom: Any = client.CustomObjectsApi(core_v1_api.api_client)
            where = (POOLS.group, POOLS.version)
            self._patch = lambda name, namespace, *rest, **options: (
                custom.patch_namespaced_custom_object(
                    *where, namespace, POOLS.plural, name, *rest, **options
                )
            )
        self._namespace = namespace
        self._names = names
        self._seconds = seconds
        self._rng = random.Random(seed)
        self._seq = 0
        self._run = f"{time.time_ns():x}"
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self.acks: list[tuple[float, int]] = []
        self.errors = 0

    async def patch_until(self, started: float, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._seq += 1
            if self._interval:
                # Paced: patch n starts at started + n / rate, whatever the apiserver's speed.
                slot = started + self._seq * self._interval
                if slot >= deadline:
                    return
                await asyncio.sleep(slot - time.monotonic())
            body = {
                "metadata": {
                    "annotations": {WRITER_ANNOTATION: f"{self._run}-{self._seq}"},
                    "labels": {WRITER_LABEL: str(self._seq % 7)},
                }
            }
            resp = await self._patch(
                self._rng.choice(self._names),
                self._namespace,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
            payload = await read_body(resp)
            if resp.status == 200:
                self.acks.append((time.monotonic(), first_resource_version(payload)))
            else:
                self.errors += 1


async def run(args: argparse.Namespace) -> None:
    from kubernetes_asyncio import client

    from miles.utils.k8s_testenv.client import api_client

    async with api_client(Path(args.kubeconfig)) as api:
        core = client.CoreV1Api(api)
        names = [f"engine-{index}" for index in range(args.pods)]
        writer = Writer(
            core,
            kind=args.kind,
            namespace=args.namespace,
            names=names,
            seconds=args.seconds,
            seed=args.seed,
            rate=args.rate,
        )
        emit({"phase": "ready"})
        if await read_command() != "go":
            return
        started = time.monotonic()
        deadline = started + args.seconds
        patchers = (writer.patch_until(started, deadline) for _ in range(args.concurrency))
        await asyncio.gather(*patchers)
        emit({"phase": "done", "started": started, "acks": writer.acks, "errors": writer.errors})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--pods", type=int, required=True)
    parser.add_argument("--kind", choices=("pods", KIND), default="pods")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="patches started per second (0: unpaced)"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
