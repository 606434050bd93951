"""How fast a silently dead watch is found, on both kube-apiservers.

Run from the repository root::

    .venv/bin/python -m bench.watch_health              # the record's run
    .venv/bin/python -m bench.watch_health --idle 0     # the frozen watches only
    .venv/bin/python -m bench.watch_health --probe-after 0   # before the probe: read-idle alone

It starts etcd and both kube-apiservers (watch cache on and off; with MILES_K8S_KUBECONFIG, that
cluster alone) and, on each, at the same time: pod watches through an `HttpFaultProxy` of their own,
each frozen once it is open (its connection stays open and silent, new connections are served),
with a pod of its selector changed at once or `--late` seconds after the freeze; and an idle watch
left alone for `--idle` seconds. It prints, per frozen watch, the seconds from its last byte to its
end and the kind of error that ended it, and per idle watch the probes it drew and whether it
ended. client-go's HTTP/2 health check ends a frozen connection 45 s after its last byte, whatever
happens on the server; the transport's defaults (`watch_probe_after=30`) are used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv import (
    EnvSettings,
    K8sTestEnvError,
    LocalControlPlane,
    api_client,
    ensure_binaries,
)
from miles.utils.k8s_testenv.binaries import print_stderr
from miles.utils.k8s_testenv.http_fault_proxy import WATCH, HttpFaultProxy
from miles.utils.workers.reconcile.k8s_api import WATCH_PROBE_AFTER, KubernetesAsyncioPodApi
from miles.utils.workers.reconcile.k8s_errors import KubernetesConnectionError

WATCH_TIMEOUT = 300
GIVE_UP = 120.0
"""Seconds after the freeze a frozen watch is waited for before it is reported as not ended."""


@dataclass(frozen=True)
class Target:
    apiserver: str
    kubeconfig: Path
    namespace: str


@dataclass(frozen=True)
class Frozen:
    apiserver: str
    change_after: float
    ended_after: float | None
    how: str


@dataclass(frozen=True)
class Idle:
    apiserver: str
    seconds: float
    probes: int
    ended: str | None


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.watch_health")
    parser.add_argument("--late", type=float, default=40.0, help="seconds from freeze to change")
    parser.add_argument("--idle", type=float, default=120.0, help="seconds an idle watch is kept")
    parser.add_argument("--rounds", type=int, default=1, help="frozen watches per case")
    parser.add_argument(
        "--probe-after",
        type=float,
        default=WATCH_PROBE_AFTER,
        help="the transport's watch_probe_after; 0 for the read-idle deadline alone (before)",
    )
    return parser.parse_args()


@contextlib.contextmanager
def _apiservers(settings: EnvSettings) -> Iterator[dict[str, Path]]:
    if settings.kubeconfig is not None:
        yield {"reused": settings.kubeconfig}
        return
    binaries = ensure_binaries(settings=settings, log=print_stderr)
    with LocalControlPlane(binaries=binaries, settings=settings, announce=print_stderr) as plane:
        yield {"cached": plane.cached_kubeconfig, "uncached": plane.uncached_kubeconfig}


@contextlib.asynccontextmanager
async def _proxied(target: Target, work: Path) -> Any:
    from kubernetes_asyncio import client

    async with HttpFaultProxy(kubeconfig=target.kubeconfig) as proxy:
        proxied = proxy.write_kubeconfig(work / f"{uuid.uuid4().hex[:8]}.kubeconfig")
        async with api_client(proxied) as through, api_client(target.kubeconfig) as straight:
            yield proxy, client.CoreV1Api(through), client.CoreV1Api(straight)


async def _pod(direct: Any, namespace: str, selector: str) -> str:
    """Creates a pod of `selector` (`key=value`); its resourceVersion."""
    from kubernetes_asyncio import client

    key, value = selector.split("=")
    name = f"p-{uuid.uuid4().hex[:8]}"
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={key: value}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="pause")]),
    )
    created = await direct.create_namespaced_pod(namespace, body)
    return str(created.metadata.resource_version)


async def _drain(stream: Any) -> BaseException | None:
    try:
        async for _ in stream:
            pass
    except Exception as err:
        return err
    return None


def _kind(err: BaseException | None) -> str:
    if err is None:
        return "closed"
    if isinstance(err, KubernetesConnectionError):
        return str(err.kind)
    return type(err).__name__


@dataclass(frozen=True)
class _Watching:
    proxy: HttpFaultProxy
    direct: Any
    selector: str
    watch: asyncio.Future[BaseException | None]


@contextlib.asynccontextmanager
async def _watching(target: Target, work: Path, probe_after: float) -> AsyncIterator[_Watching]:
    """A pod watch of a selector of its own, through a proxy of its own, from its pod's creation."""
    selector = f"bench-watch-health={uuid.uuid4().hex[:8]}"
    async with _proxied(target, work) as (proxy, through, direct):
        cursor = await _pod(direct, target.namespace, selector)
        api = KubernetesAsyncioPodApi(core_v1_api=through, watch_probe_after=probe_after)
        stream = api.stream_pods(
            namespace=target.namespace,
            label_selector=selector,
            resource_version=cursor,
            timeout_seconds=WATCH_TIMEOUT,
        )
        watch = asyncio.ensure_future(_drain(stream))
        try:
            yield _Watching(proxy, direct, selector, watch)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)


async def _frozen(target: Target, work: Path, change_after: float, probe_after: float) -> Frozen:
    async with _watching(target, work, probe_after) as watching:
        last_bytes: list[float] = []
        while not last_bytes:
            await asyncio.sleep(0.1)
            last_bytes = await watching.proxy.freeze(WATCH)
        await asyncio.sleep(change_after)
        await _pod(watching.direct, target.namespace, watching.selector)
        done, _ = await asyncio.wait([watching.watch], timeout=GIVE_UP - change_after)
        if not done:
            return Frozen(target.apiserver, change_after, None, "still open")
        took = time.monotonic() - last_bytes[0]
        return Frozen(target.apiserver, change_after, took, _kind(watching.watch.result()))


async def _idle(target: Target, work: Path, seconds: float, probe_after: float) -> Idle:
    began = time.monotonic()
    async with _watching(target, work, probe_after) as watching:
        done, _ = await asyncio.wait([watching.watch], timeout=seconds)
        seen = watching.proxy.seen(since=began)
        ended = _kind(watching.watch.result()) if done else None
    probes = [s for s in seen if s.is_watch and "timeoutSeconds=1&" in s.target + "&"]
    return Idle(target.apiserver, seconds, len(probes), ended)


async def _namespace(kubeconfig: Path, name: str) -> None:
    from kubernetes_asyncio import client

    async with api_client(kubeconfig) as api:
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        await client.CoreV1Api(api).create_namespace(body)


async def _run(
    apiservers: dict[str, Path], args: argparse.Namespace, work: Path
) -> tuple[list[Frozen], list[Idle]]:
    namespace = f"watch-health-{uuid.uuid4().hex[:8]}"
    await _namespace(next(iter(apiservers.values())), namespace)
    targets = [Target(name, path, namespace) for name, path in apiservers.items()]
    frozen = [
        _frozen(target, work, change_after, args.probe_after)
        for target in targets
        for change_after in (0.0, args.late)
        for _ in range(args.rounds)
    ]
    seconds = args.idle
    idle = [_idle(target, work, seconds, args.probe_after) for target in targets if seconds > 0]
    results = await asyncio.gather(*frozen, *idle)
    return (
        [r for r in results if isinstance(r, Frozen)],
        [r for r in results if isinstance(r, Idle)],
    )


def _report(frozen: list[Frozen], idle: list[Idle]) -> str:
    lines = ["watch_health: apiserver  change after freeze  end after last byte  ended by"]
    for case in sorted(frozen, key=lambda r: (r.apiserver, r.change_after)):
        took = "-" if case.ended_after is None else f"{case.ended_after:.1f} s"
        lines.append(
            f"watch_health: {case.apiserver:<9}  {case.change_after:>17.0f} s  {took:>19}  "
            f"{case.how}"
        )
    for watch in idle:
        lines.append(
            f"watch_health: idle watch on {watch.apiserver} for {watch.seconds:.0f} s: "
            f"{watch.probes} probes ({60 * watch.probes / watch.seconds:.1f} a minute), "
            f"{'ended: ' + watch.ended if watch.ended else 'kept open'}"
        )
    return "\n".join(lines)


def main() -> int:
    args = _arguments()
    settings = EnvSettings.from_env()
    with tempfile.TemporaryDirectory(prefix="miles-watch-health-") as work:
        try:
            with _apiservers(settings) as apiservers:
                frozen, idle = asyncio.run(_run(apiservers, args, Path(work)))
        except K8sTestEnvError as err:
            print(f"watch_health: ABORTED: {err}", flush=True)
            return 2
    print(_report(frozen, idle), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
