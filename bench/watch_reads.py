"""CPU per WATCH event of ours's whole read path when every event is its own socket read.

Go counterpart: none (benchmark plumbing). A local TLS server (this file, ``serve``, in its own
process) answers the reflector's LIST with ``--objects`` objects and its WATCH with ``--events``
MODIFIED lines, one HTTP chunk each, ``--gap-ms`` apart, so that each event reaches the client in a
read of its own, as the apiserver hands over the engine pools' events. The client is the bench's
contender chain (``ReconcileLoop`` over ``KubernetesReflector`` and the pod API, or the resource API
with the typed ``EnginePool``), and what is measured is its CPU from the sync to the last event
applied, per event. Run from the repository root::

    .venv/bin/python -m bench.watch_reads --kind pods --events 2000
    .venv/bin/python -m bench.watch_reads --kind pools --profile 25   # and the top of a cProfile

Under callgrind the client's instructions are counted from the sync to the last event, the same
figure free of the host's load; ``--no-gc`` keeps the collector out of the window, so that two
versions of the read path compare within a few thousand instructions an event::

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/wr.out \\
        .venv/bin/python -m bench.watch_reads --kind pools --events 300 --gap-ms 25 \\
        --instructions --no-gc      # then: the totals line of /tmp/wr.out.1, over 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.apiserver_objects import POOLS
from bench.apiserver_proc import PARENT_LABEL, SELECTOR
from bench.objects import EnginePool, engine_pool
from miles.utils.k8s_testenv.certs import generate_serving_pair
from miles.utils.k8s_testenv.testing.k8s_fakes import frame, realistic_pod
from miles.utils.workers.reconcile.k8s_api import (
    KubernetesAsyncioPodApi,
    KubernetesAsyncioResourceApi,
)
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import SourceEvent, SourceWatchFn, UpsertEvent

NAMESPACE = "bench"


def make_object(kind: str, i: int, rv: int) -> dict[str, Any]:
    obj = engine_pool(i) if kind == "pools" else realistic_pod(f"pod-{i}", f"cell-{i % 10}")
    obj["metadata"]["namespace"] = NAMESPACE
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def bodies(kind: str, objects: int, events: int) -> tuple[bytes, list[bytes]]:
    """The LIST's body and the WATCH's lines."""
    items = [make_object(kind, i, 1000) for i in range(objects)]
    list_kind = "EnginePoolList" if kind == "pools" else "PodList"
    listing = json.dumps(
        {"kind": list_kind, "metadata": {"resourceVersion": "1000"}, "items": items},
        separators=(",", ":"),
    ).encode()
    lines = [frame("MODIFIED", make_object(kind, n % objects, 1001 + n)) for n in range(events)]
    return listing, lines


# --- the server -----------------------------------------------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    import ssl

    listing, lines = bodies(args.kind, args.objects, args.events)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(Path(args.dir) / "serving.crt", Path(args.dir) / "serving.key")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1]
                if b"watch=true" not in target.lower():
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(listing), listing)
                    )
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                await writer.drain()
                await asyncio.sleep(args.start_after)
                for line in lines:
                    writer.write(b"%x\r\n%s\r\n" % (len(line), line))
                    await writer.drain()
                    await asyncio.sleep(args.gap_ms / 1000)
                await reader.read()
                return

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


# --- the client -----------------------------------------------------------------------------------


async def client_run(args: argparse.Namespace, port: int, ca: Path) -> float:
    """The client's CPU seconds from its sync to its last event applied."""
    from kubernetes_asyncio import client

    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.ssl_ca_cert = str(ca)
    done = asyncio.Event()
    async with client.ApiClient(configuration=configuration) as api:
        source = recorded(build_source(args.kind, api), 1000 + args.events, done)
        loop = ReconcileLoop(source=source, reconcile=reconcile, key_map=parent_of)
        async with loop:
            profile = cProfile.Profile(time.process_time) if args.profile else None
            if args.no_gc:
                gc.disable()
            await control("--instr=on", args)
            before, started = os.times(), time.process_time()
            if profile is not None:
                profile.enable()
            await done.wait()
            cpu, after = time.process_time() - started, os.times()
            if profile is not None:
                profile.disable()
            await control("--dump=window", args)
            gc.enable()
    per_event = 1e6 / args.events
    user, system = (
        (after.user - before.user) * per_event,
        (after.system - before.system) * per_event,
    )
    print(f"user {user:.0f} us, system {system:.0f} us per event")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        if args.profile_out:
            profile.dump_stats(args.profile_out)
    return cpu


def build_source(kind: str, api: Any) -> SourceWatchFn:
    from kubernetes_asyncio import client

    if kind == "pools":
        resource_api: Any = KubernetesAsyncioResourceApi(
            api_client=api, resource=POOLS, model=EnginePool
        )
        return KubernetesReflector(
            api=resource_api, namespace=NAMESPACE, label_selector=SELECTOR
        ).watch
    pod_api = KubernetesAsyncioPodApi(core_v1_api=client.CoreV1Api(api))
    return KubernetesReflector(
        kube_client=pod_api, namespace=NAMESPACE, label_selector=SELECTOR
    ).watch


def recorded(source: SourceWatchFn, last_rv: int, done: asyncio.Event) -> SourceWatchFn:
    """The contender's wrapper, down to what it reads per event: done at ``last_rv``."""

    async def watch() -> AsyncIterator[SourceEvent]:
        async for event in source():
            yield event
            rv = event.obj.metadata.resource_version if isinstance(event, UpsertEvent) else "0"
            if int(rv) >= last_rv:
                done.set()

    return watch


def parent_of(obj: Any) -> str | None:
    labels = obj.metadata.labels
    return labels.get(PARENT_LABEL) if labels else None


async def reconcile(parent: str) -> None:
    return None


async def control(option: str, args: argparse.Namespace) -> None:
    if args.instructions:
        process = await asyncio.create_subprocess_exec(
            "callgrind_control", option, str(os.getpid()), stdout=asyncio.subprocess.DEVNULL
        )
        await process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", nargs="?", choices=("client", "serve"), default="client")
    parser.add_argument("--kind", choices=("pods", "pools"), default="pods")
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--start-after", type=float, default=1.0)
    parser.add_argument("--profile", type=int, default=0, help="print a cProfile's top N")
    parser.add_argument("--profile-out", default="", help="and write it to this pstats file")
    parser.add_argument("--instructions", action="store_true", help="run under callgrind")
    parser.add_argument(
        "--no-gc", action="store_true", help="the collector off in the window: A/B counts agree"
    )
    parser.add_argument("--dir", default="")
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(serve(args))
        return
    with tempfile.TemporaryDirectory(prefix="watch-reads-") as tmp:
        pair = generate_serving_pair(Path(tmp))
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.watch_reads", "serve", *sys.argv[1:], "--dir", tmp],
            stdout=subprocess.PIPE,
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            cpu = asyncio.run(client_run(args, port, pair.ca_cert))
        finally:
            server.terminate()
            server.wait()
    print(f"{args.kind}: {args.events} events, {cpu / args.events * 1e6:.1f} us CPU per event")


if __name__ == "__main__":
    main()
