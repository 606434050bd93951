"""One measurement of one contender of ``bench/apiserver.py``: its sync, then its WATCH phase.

Go counterpart: none (benchmark plumbing). The Python contenders run
``bench/apiserver_contender.py`` and stamp every applied event themselves; the compiled ones
(client-go, kube-rs) are driven over their pipes (``bench/apiserver_oracle.py``). The CPU per
WATCH event is read, for every contender, from the contender's own ``/proc`` thread times once
before the writer starts and once after the contender has applied the writer's last event, and
divided by the writer's acknowledged patches; nothing polls the contender inside that window: the
Python contenders and kube-rs answer one request once their store holds the last resourceVersion,
and client-go is asked once, after a settle period (again if it was behind). client-go cannot stamp
its events, so its lag and rate come from a second WATCH phase in which its progress is polled;
that phase's CPU is not used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.apiserver_oracle import Oracle, baseline_rss, oracle_process
from bench.apiserver_proc import (
    REPO_ROOT,
    KernelShare,
    child_argv,
    close_child,
    cpu_seconds,
    rss_bytes,
)
from bench.report import Values, percentile

LINE_LIMIT = 256 * 2**20
SYNC_TIMEOUT = 600.0
POLL_COST_SHARE = 5.0
"""Oracle polls are spaced at least this many snapshot costs apart: at most 20% of a core."""
SETTLE_SECONDS = 1.0
"""How long client-go is left alone after the writer's last acknowledgement before it is asked."""
RSS_SAMPLE_SECONDS = 0.05


@dataclass(frozen=True)
class Env:
    kubeconfig: Path
    binaries: dict[str, Path]
    """The compiled contenders that could be built, by name."""
    logs: Path
    apiserver_pid: int | None
    compact: Any = None


@dataclass(frozen=True)
class Scenario:
    namespace: str
    pods: int
    parents: int
    watch: bool
    """False: the sync only (the growth table)."""
    kind: str = "pods"
    """What the writer patches: ``pods`` or ``enginepools`` (``bench/apiserver_objects.py``)."""


@dataclass
class WriterRun:
    started: float
    acks: list[tuple[float, int]]
    errors: int

    @property
    def last_rv(self) -> int:
        return max((rv for _, rv in self.acks), default=0)


# --- child processes ------------------------------------------------------------------------------


class Child:
    """A bench child process speaking JSON lines on stdout and commands on stdin."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name

    async def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        await self.process.stdin.drain()

    async def read(self, phase: str, within: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), within)
        if not line:
            code = await self.process.wait()
            raise RuntimeError(f"{self.name} exited with {code} before {phase!r}; see its log")
        message: dict[str, Any] = json.loads(line)
        if message.get("phase") != phase:
            raise RuntimeError(f"{self.name}: expected {phase!r}, got {line[:200]!r}")
        return message


@contextlib.asynccontextmanager
async def child(
    module: str, args: Sequence[str], *, log: Path, wrapper: Sequence[str] = ()
) -> AsyncIterator[Child]:
    """``wrapper``: a command the child runs under (``bench/apiserver_callgrind.py``)."""
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            *wrapper,
            *child_argv(module, *args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            cwd=REPO_ROOT,
            limit=LINE_LIMIT,
        )
    try:
        yield Child(process, module)
    finally:
        await close_child(process, within=10.0)


@contextlib.asynccontextmanager
async def ready_writer(
    env: Env, scenario: Scenario, args: argparse.Namespace, seed: int
) -> AsyncIterator[Child]:
    writer_args = [
        f"--kubeconfig={env.kubeconfig}",
        f"--namespace={scenario.namespace}",
        f"--pods={scenario.pods}",
        f"--kind={scenario.kind}",
        f"--seconds={args.watch_seconds}",
        f"--concurrency={args.writer_concurrency}",
        f"--rate={args.writer_rate}",
        f"--seed={seed}",
    ]
    async with child("apiserver_writer", writer_args, log=env.logs / "writer.log") as writer:
        await writer.read("ready", 60.0)
        yield writer


async def run_writer(writer: Child, args: argparse.Namespace) -> WriterRun:
    await writer.send("go")
    done = await writer.read("done", args.watch_seconds + 120.0)
    acks = [(float(stamp), int(rv)) for stamp, rv in done["acks"]]
    return WriterRun(started=float(done["started"]), acks=acks, errors=int(done["errors"]))


class WindowCpu:
    """A process's CPU from now on, per event: the apiserver's over the writer's window, where it
    shares the two cores with the contender (a custom resource's write and watch event cost it
    more than a pod's)."""

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._cpu = cpu_seconds(pid) if pid is not None else 0.0

    def per_event(self, events: int) -> float | None:
        if self._pid is None or not events:
            return None
        return (cpu_seconds(self._pid) - self._cpu) / events


class ApiserverLoad:
    """The apiserver's CPU and peak RSS over a phase, read from its ``/proc`` from outside."""

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._cpu = 0.0
        self._rss = 0
        self._peak = 0
        self._stop = asyncio.Event()
        self._sampler: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._pid is None:
            return
        self._cpu = cpu_seconds(self._pid)
        self._rss = self._peak = rss_bytes(self._pid)
        self._sampler = asyncio.create_task(self._sample(self._pid))

    async def _sample(self, pid: int) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, rss_bytes(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), RSS_SAMPLE_SECONDS)

    async def stop(self) -> Values:
        if self._pid is None or self._sampler is None:
            return {"apiserver_cpu_s": None, "apiserver_rss_peak": None}
        self._stop.set()
        await self._sampler
        return {
            "apiserver_cpu_s": cpu_seconds(self._pid) - self._cpu,
            "apiserver_rss_peak": float(max(self._peak, rss_bytes(self._pid))),
            "apiserver_rss_growth": float(self._peak - self._rss),
        }


# --- figures --------------------------------------------------------------------------------------


def ingestion(writer: WriterRun, applied: dict[int, float]) -> Values:
    """Rate and lag from the writer's acknowledgements and the applied stamps."""
    lags = [applied[rv] - acked for acked, rv in writer.acks if rv in applied]
    seen = [applied[rv] for _, rv in writer.acks if rv in applied]
    last_ack = max((acked for acked, _ in writer.acks), default=writer.started)
    return {
        "events_per_s": len(seen) / (max(seen) - writer.started) if seen else None,
        "lag_p50": percentile(lags, 0.5),
        "lag_p99": percentile(lags, 0.99),
        "writer_rate": len(writer.acks) / (last_ack - writer.started) if writer.acks else None,
        "missed_events": float(len(writer.acks) - len(seen)),
    }


def per_event(cpu: float, writer: WriterRun, gc_pauses: float | None = None) -> Values:
    events = len(writer.acks)
    values: Values = {
        "cpu_per_event": cpu / events if events else None,
        "watch_cpu_s": cpu,
        "events": float(events),
    }
    if gc_pauses is not None:
        values["gc_watch_per_event"] = gc_pauses / events if events else None
    return values


def stamps_from_polls(writer: WriterRun, polls: Sequence[tuple[float, int]]) -> dict[int, float]:
    """For each written resourceVersion, the first poll that saw the store at or past it."""
    stamps: dict[int, float] = {}
    rvs = sorted(rv for _, rv in writer.acks)
    index = 0
    for stamp, seen in sorted(polls):
        while index < len(rvs) and rvs[index] <= seen:
            stamps[rvs[index]] = stamp
            index += 1
    return stamps


# --- the Python contenders ------------------------------------------------------------------------


async def write_and_catch_up(
    proc: Child, writer: Child, args: argparse.Namespace
) -> tuple[WriterRun, int]:
    """The writer's run, then one ``wait`` until the contender holds its last resourceVersion:
    the highest one it applied."""
    written = await run_writer(writer, args)
    await proc.send(f"wait {written.last_rv}")
    caught_up = await proc.read("caught-up", args.drain_timeout + 60.0)
    return written, int(caught_up["rv"])


def python_contender_args(
    name: str, env: Env, scenario: Scenario, args: argparse.Namespace
) -> list[str]:
    return [
        f"--contender={name}",
        f"--kubeconfig={env.kubeconfig}",
        f"--namespace={scenario.namespace}",
        f"--parents={scenario.parents}",
        f"--drain-timeout={args.drain_timeout}",
    ]


async def measure_python(
    name: str,
    env: Env,
    scenario: Scenario,
    args: argparse.Namespace,
    seed: int,
    profile: str | None = None,
) -> Values:
    contender_args = python_contender_args(name, env, scenario, args)
    if profile is not None:
        contender_args.append(f"--profile={profile}")
    load = ApiserverLoad(env.apiserver_pid)
    load.start()
    async with child("apiserver_contender", contender_args, log=env.logs / f"{name}.log") as proc:
        synced = await proc.read("synced", SYNC_TIMEOUT)
        values = await load.stop()
        drained: dict[str, Any] | None = None
        if scenario.watch:
            async with ready_writer(env, scenario, args, seed) as writer:
                await proc.send("mark")
                await proc.read("marked", 30.0)
                kernel = KernelShare(proc.process.pid)
                apiserver = WindowCpu(env.apiserver_pid)
                written, _ = await write_and_catch_up(proc, writer, args)
                values["apiserver_cpu_per_event"] = apiserver.per_event(len(written.acks))
            values["kernel_share"] = kernel.share()
            await proc.send(f"drain {written.last_rv}")
            drained = await proc.read("drained", args.drain_timeout + 60.0)
        await proc.send("quit")
    pods = max(synced["pods"], 1)
    values.update(
        {
            "sync_s": synced["synced"] - synced["started"],
            "sync_cpu_s": synced["sync_cpu"],
            "rss_per_pod": (synced["rss_after"] - synced["rss_before"]) / pods,
            "rss_trimmed_per_pod": (synced["rss_trimmed"] - synced["rss_before"]) / pods,
            "stored": float(synced["pods"]),
            "gc_sync_s": sum(float(seconds) for _, seconds in synced["gc_pauses"]),
        }
    )
    if drained is not None:
        applied = {int(rv): float(stamp) for rv, stamp in drained["applied"]}
        dispatch = [float(latency) for latency in drained["dispatch"]]
        values.update(
            {
                "dispatch_p50": percentile(dispatch, 0.5),
                "dispatch_p99": percentile(dispatch, 0.99),
                "gc_watch_max_s": max((float(s) for _, s in drained["gc_pauses"]), default=0.0),
                "full_gc_s": float(drained["full_gc"]),
            }
        )
        values.update(ingestion(written, applied))
        gc_pauses = sum(float(seconds) for _, seconds in drained["gc_pauses"])
        values.update(per_event(float(drained["cpu"]), written, gc_pauses))
    return values


# --- the compiled contenders ----------------------------------------------------------------------


async def measure_compiled(
    name: str, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int
) -> Values:
    binary = env.binaries[name]
    log = env.logs / f"{name}.log"
    flags = ["--watch-list"] if name == "go-stream" else []
    rss_before = await baseline_rss(
        binary, env.kubeconfig, namespace=scenario.namespace, log=log, flags=flags
    )
    load = ApiserverLoad(env.apiserver_pid)
    load.start()
    started = time.monotonic()
    async with oracle_process(
        binary, env.kubeconfig, namespace=scenario.namespace, log=log, flags=flags
    ) as o:
        snap = await o.wait_until(pods=scenario.pods, within=SYNC_TIMEOUT)
        values = await load.stop()
        values.update(
            {
                "sync_s": snap.stamp - started,
                "sync_cpu_s": cpu_seconds(o.pid),
                "rss_per_pod": (rss_bytes(o.pid) - rss_before) / max(snap.pods, 1),
                "stored": float(snap.pods),
            }
        )
        if scenario.watch:
            values.update(await _unpolled_watch(name, o, env, scenario, args, seed))
    return values


async def _unpolled_watch(
    name: str, oracle: Oracle, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int
) -> Values:
    async with ready_writer(env, scenario, args, seed) as writer:
        cpu_before = cpu_seconds(oracle.pid)
        kernel = KernelShare(oracle.pid)
        written = await run_writer(writer, args)
    if name == "kube-rs":
        await oracle.wait_for_rv(written.last_rv, args.drain_timeout)
        requests = 1
    else:
        requests = await _settle(oracle, written.last_rv, args.drain_timeout)
    values = per_event(cpu_seconds(oracle.pid) - cpu_before, written)
    values["kernel_share"] = kernel.share()
    values["settle_requests"] = float(requests)
    if name == "kube-rs":
        values.update(ingestion(written, dict(await oracle.applied())))
    else:
        values.update(await _polled_watch(oracle, env, scenario, args, seed + 500))
    return values


async def _settle(oracle: Oracle, rv: int, within: float) -> int:
    """Asks once the writer is done and the contender had time to catch up; again if it had not."""
    deadline = time.monotonic() + within
    requests = 0
    while True:
        await asyncio.sleep(SETTLE_SECONDS)
        requests += 1
        snap = await oracle.snapshot()
        if snap.resource_version >= rv or snap.stamp > deadline:
            return requests


async def _polled_watch(
    oracle: Oracle, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int
) -> Values:
    """Lag and rate of a contender that cannot stamp its events: a second phase, polled."""
    interval = max(args.oracle_poll, POLL_COST_SHARE * await oracle.snapshot_cost())
    polls: list[tuple[float, int]] = []
    until_rv: list[int] = []

    async def poll() -> None:
        while True:
            seen = await oracle.snapshot()
            polls.append((seen.stamp, seen.resource_version))
            if until_rv and seen.resource_version >= until_rv[0]:
                return
            await asyncio.sleep(interval)

    async with ready_writer(env, scenario, args, seed) as writer:
        poller = asyncio.create_task(poll())
        written = await run_writer(writer, args)
    until_rv.append(written.last_rv)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(poller), args.drain_timeout)
    poller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poller
    values = ingestion(written, stamps_from_polls(written, polls))
    values.update({"poll_interval_s": interval, "polls": float(len(polls))})
    return values
