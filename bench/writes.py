"""Writes against a real kube-apiserver: ours (``client.Client``), ``kubernetes_asyncio`` and
client-go, the same operations at the same concurrency on the same apiserver in one run.

Run from the repository root::

    .venv/bin/python -m bench.writes                       # 16 in flight, 5 s per operation
    .venv/bin/python -m bench.writes --concurrency 32 --seconds 10 --rounds 3

It starts a local control plane (or reuses ``MILES_K8S_KUBECONFIG``), and for each operation and
round runs each contender alone, one after another (the order rotates every round), each keeping
``--concurrency`` writes in flight for ``--seconds``, each writer on a ConfigMap of its own so that
no two writes conflict:

- ``patch``: a merge patch of ``data.v``;
- ``apply``: server-side apply of ``data.v`` (field manager ``bench``, force);
- ``create-delete``: a create of a new name, then its delete (two writes).

The contenders: ours, ``Client`` over the transport ``k8s_api.write_transport`` picks
(``k8s_http2.Http2Transport``: one HTTP/2 connection) with dicts in and out; ``ours-http1`` and
``ours-aiohttp`` (not run unless named in ``--contenders``), the same over
``k8s_http.HttpTransport`` (HTTP/1.1, a connection per write in flight) and over
``KubernetesAsyncioTransport``;
``kubernetes_asyncio``'s ``CoreV1Api`` as its users call it (answers read into ``V1ConfigMap``);
client-go's typed clientset (``tools/k8s/write-bench``, QPS -1 as controller-runtime sets it),
skipped with one line when it cannot be built. Figures per contender: writes per second (the
median over rounds), the client's CPU per write (its process's CPU over the window, divided by the
writes) and the apiserver's CPU per write over the same window, when its process is local.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.apiserver import apiserver_pid_of
from bench.apiserver_proc import cpu_seconds
from bench.report import fmt, median

OPERATIONS = ("patch", "apply", "create-delete")
CONTENDERS = ("ours", "ours-http1", "ours-aiohttp", "kubernetes_asyncio", "client-go")
DEFAULT_CONTENDERS = ("ours", "kubernetes_asyncio", "client-go")
Write = Callable[[str, int], Awaitable[int]]
Maker = Callable[[Any, str, str], AbstractAsyncContextManager[Write]]


@dataclass(frozen=True)
class Window:
    writes: int
    errors: int
    seconds: float
    cpu_seconds: float
    apiserver_cpu_seconds: float | None

    @property
    def rate(self) -> float:
        return self.writes / self.seconds

    @property
    def cpu_per_write(self) -> float | None:
        return self.cpu_seconds / self.writes if self.writes else None

    @property
    def apiserver_cpu_per_write(self) -> float | None:
        if self.apiserver_cpu_seconds is None or not self.writes:
            return None
        return self.apiserver_cpu_seconds / self.writes


@contextlib.asynccontextmanager
async def ours_writes(api: Any, namespace: str, op: str) -> AsyncIterator[Write]:
    """Ours as a process gets it: ``Client`` over the transport ``k8s_api.write_transport`` picks
    (``k8s_http2.Http2Transport`` without a proxy)."""
    from miles.utils.workers.reconcile.k8s_api import write_transport

    async with write_transport(api) as transport:
        yield ours_writing(transport, namespace, op)


@contextlib.asynccontextmanager
async def ours_http1_writes(api: Any, namespace: str, op: str) -> AsyncIterator[Write]:
    """Ours over ``k8s_http.HttpTransport``: HTTP/1.1, one connection per write in flight."""
    from miles.utils.workers.reconcile.k8s_http import HttpTransport

    async with HttpTransport.for_api_client(api) as transport:
        yield ours_writing(transport, namespace, op)


@contextlib.asynccontextmanager
async def ours_aiohttp_writes(api: Any, namespace: str, op: str) -> AsyncIterator[Write]:
    """Ours over ``KubernetesAsyncioTransport`` (aiohttp), the transport before ``k8s_http``."""
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport

    yield ours_writing(KubernetesAsyncioTransport(api_client=api), namespace, op)


def ours_writing(transport: Any, namespace: str, op: str, *, on_write: Any = None) -> Write:
    """``op``'s write by ``Client`` (``on_write``: its write observer, as an operator's)."""
    from miles.utils.workers.reconcile.client import Client, MergePatch
    from miles.utils.workers.reconcile.resource import CONFIG_MAPS

    client = Client(transport=transport, field_manager="bench", on_write=on_write)

    async def patch(name: str, seq: int) -> int:
        body = MergePatch({"data": {"v": str(seq)}})
        await client.patch(CONFIG_MAPS, name, body, namespace=namespace)
        return 1

    async def apply(name: str, seq: int) -> int:
        desired = {"metadata": {"name": name, "namespace": namespace}, "data": {"v": str(seq)}}
        await client.apply(CONFIG_MAPS, desired, force=True)
        return 1

    async def create_delete(name: str, seq: int) -> int:
        fresh = f"{name}-{seq}"
        await client.create(CONFIG_MAPS, {"metadata": {"name": fresh}}, namespace=namespace)
        await client.delete(CONFIG_MAPS, fresh, namespace=namespace)
        return 2

    return {"patch": patch, "apply": apply, "create-delete": create_delete}[op]


@contextlib.asynccontextmanager
async def kubernetes_asyncio_writes(api: Any, namespace: str, op: str) -> AsyncIterator[Write]:
    from kubernetes_asyncio import client

    core: Any = client.CoreV1Api(api)

    async def patch(name: str, seq: int) -> int:
        body = {"data": {"v": str(seq)}}
        merge = "application/merge-patch+json"
        await core.patch_namespaced_config_map(name, namespace, body, _content_type=merge)
        return 1

    async def apply(name: str, seq: int) -> int:
        desired = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"v": str(seq)},
        }
        await core.patch_namespaced_config_map(
            name,
            namespace,
            desired,
            field_manager="bench",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        return 1

    async def create_delete(name: str, seq: int) -> int:
        fresh = f"{name}-{seq}"
        await core.create_namespaced_config_map(namespace, {"metadata": {"name": fresh}})
        await core.delete_namespaced_config_map(fresh, namespace)
        return 2

    yield {"patch": patch, "apply": apply, "create-delete": create_delete}[op]


@dataclass(frozen=True)
class Target:
    """What one window writes: ``op`` in ``namespace`` of the apiserver ``kubeconfig`` names (its
    process ``apiserver_pid`` when local), ``concurrency`` writers for ``seconds``."""

    kubeconfig: Path
    namespace: str
    op: str
    concurrency: int
    seconds: float
    apiserver_pid: int | None


async def python_window(make: Maker, target: Target) -> Window:
    from miles.utils.k8s_testenv import api_client

    async with (
        api_client(target.kubeconfig) as api,
        make(api, target.namespace, target.op) as write,
    ):
        await write("bench-warm", 0)  # the connection and the client's first-call costs
        writes = errors = 0
        gc.collect()
        deadline = time.monotonic() + target.seconds

        async def worker(index: int) -> None:
            nonlocal writes, errors
            seq = 0
            while time.monotonic() < deadline:
                seq += 1
                try:
                    # Not `writes += await ...`: that reads `writes` before the await, and the
                    # other workers' counts made meanwhile are lost.
                    done = await write(f"bench-{index}", seq)
                except Exception:
                    errors += 1
                else:
                    writes += done

        meter = Meter(target.apiserver_pid)
        await asyncio.gather(*(worker(i) for i in range(target.concurrency)))
        figures = meter.read()
    return Window(writes, errors, *figures)


class Meter:
    """Wall time, this process's CPU and the apiserver's (when local) from its creation."""

    def __init__(self, apiserver_pid: int | None) -> None:
        self._pid = apiserver_pid
        self._started, self._cpu = time.monotonic(), cpu_seconds()
        self._server = None if apiserver_pid is None else cpu_seconds(apiserver_pid)

    def read(self) -> tuple[float, float, float | None]:
        server = None
        if self._pid is not None and self._server is not None:
            server = cpu_seconds(self._pid) - self._server
        return time.monotonic() - self._started, cpu_seconds() - self._cpu, server


def client_go_window(binary: Path, target: Target) -> Window:
    """One window of client-go's; its own process measures its wall time and CPU."""
    argv = [
        str(binary),
        f"-kubeconfig={target.kubeconfig}",
        f"-namespace={target.namespace}",
        f"-op={target.op}",
        f"-concurrency={target.concurrency}",
        f"-seconds={target.seconds}",
    ]
    meter = Meter(target.apiserver_pid)
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    server = meter.read()[2]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Window(
        int(result["writes"]),
        int(result["errors"]),
        float(result["seconds"]),
        float(result["cpu_seconds"]),
        server,
    )


async def seed(kubeconfig: Path, namespace: str, concurrency: int) -> None:
    """A namespace of the window's own and each writer's ConfigMap in it."""
    from miles.utils.k8s_testenv import api_client
    from miles.utils.workers.reconcile.client import Client
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport
    from miles.utils.workers.reconcile.resource import CONFIG_MAPS, NAMESPACES

    async with api_client(kubeconfig) as api:
        client = Client(transport=KubernetesAsyncioTransport(api_client=api))
        await client.create(NAMESPACES, {"metadata": {"name": namespace}})
        for name in ["bench-warm", *(f"bench-{i}" for i in range(concurrency))]:
            await client.create(CONFIG_MAPS, {"metadata": {"name": name}}, namespace=namespace)


def build_client_go() -> tuple[Path | None, str | None]:
    """``tools/k8s/write-bench``, built when missing or stale, or why it cannot be."""
    from miles.utils.k8s_testenv.binaries import ensure_tool_binary
    from miles.utils.k8s_testenv.errors import K8sTestEnvError

    try:
        return ensure_tool_binary("write-bench"), None
    except K8sTestEnvError as err:
        return None, str(err).splitlines()[0]


@contextlib.contextmanager
def apiserver(kubeconfig: Path | None) -> Iterator[tuple[Path, int | None]]:
    from miles.utils.k8s_testenv.control_plane import LocalControlPlane
    from miles.utils.k8s_testenv.settings import EnvSettings

    settings = EnvSettings.from_env()
    if settings.kubeconfig is not None:
        yield settings.kubeconfig, apiserver_pid_of(settings.kubeconfig)
        return
    with LocalControlPlane(settings=settings) as plane:
        yield plane.cached_kubeconfig, plane.apiserver("cached").process.pid


async def run(args: argparse.Namespace) -> int:
    binary, why = build_client_go() if "client-go" in args.contenders else (None, None)
    contenders = [c for c in args.contenders if c != "client-go" or binary is not None]
    if why is not None:
        print(f"client-go skipped: {why}", file=sys.stderr)
    makers: dict[str, Maker] = {
        "ours": ours_writes,
        "ours-http1": ours_http1_writes,
        "ours-aiohttp": ours_aiohttp_writes,
        "kubernetes_asyncio": kubernetes_asyncio_writes,
    }
    results: dict[tuple[str, str], list[Window]] = {}
    with apiserver(None) as (kubeconfig, pid):
        for op in args.operations:
            for round_ in range(args.rounds):
                order = (
                    contenders[round_ % len(contenders) :] + contenders[: round_ % len(contenders)]
                )
                for name in order:
                    namespace = f"bench-writes-{time.time_ns():x}"
                    await seed(kubeconfig, namespace, args.concurrency)
                    target = Target(kubeconfig, namespace, op, args.concurrency, args.seconds, pid)
                    if name == "client-go":
                        assert binary is not None
                        window = client_go_window(binary, target)
                    else:
                        window = await python_window(makers[name], target)
                    results.setdefault((op, name), []).append(window)
                    print(
                        f"{op:13} {name:18} round {round_ + 1}: {window.rate:8.0f} writes/s, "
                        f"{fmt(window.cpu_per_write, 1e6)} µs CPU/write, {window.errors} errors",
                        file=sys.stderr,
                    )
    report(results, contenders, args)
    return 0


def report(
    results: dict[tuple[str, str], list[Window]],
    contenders: Sequence[str],
    args: argparse.Namespace,
) -> None:
    print(
        f"\nconcurrency {args.concurrency}, {args.seconds:g} s per window, {args.rounds} round(s)"
    )
    print(
        f"{'operation':13} {'contender':18} {'writes/s':>9} {'client µs/write':>16} "
        f"{'apiserver µs/write':>19} {'errors':>7}"
    )
    for op in args.operations:
        for name in contenders:
            windows = results.get((op, name), [])
            rate = median([w.rate for w in windows])
            cpu = median([w.cpu_per_write for w in windows])
            server = median([w.apiserver_cpu_per_write for w in windows])
            errors = sum(w.errors for w in windows)
            print(
                f"{op:13} {name:18} {fmt(rate):>9} {fmt(cpu, 1e6):>16} "
                f"{fmt(server, 1e6):>19} {errors:>7}"
            )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--operations", nargs="+", choices=OPERATIONS, default=list(OPERATIONS))
    parser.add_argument(
        "--contenders", nargs="+", choices=CONTENDERS, default=list(DEFAULT_CONTENDERS)
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
