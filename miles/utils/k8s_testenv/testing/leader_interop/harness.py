"""Runs leader-election candidates of both sides on one Lease and injects faults on the holder.

Go counterpart: none. Each candidate talks to the apiserver through its own `TcpProxy`, so its
apiserver can be cut alone; a fault on the holder is a SIGKILL (then a restart under a new
identity), a SIGSTOP past the takeover bound (then SIGCONT), a cut of its proxy for as long (every
connection reset, new ones held silent, held bytes dropped at the end), or a SIGTERM (a graceful
release, then a restart). Every few faults one hits a standby instead.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

from miles.utils.k8s_testenv.tcp_proxy import TcpProxy
from miles.utils.k8s_testenv.testing.differential.lifecycle import (
    proxied_kubeconfig,
    server_address,
)
from miles.utils.k8s_testenv.testing.leader_interop.candidates import (
    CandidateCommand,
    CandidateProcess,
)
from miles.utils.k8s_testenv.testing.leader_interop.lease_watch import LeaseWatch
from miles.utils.k8s_testenv.testing.leader_interop.records import (
    CandidateLine,
    FaultKind,
    FaultRecord,
    LeaseRecord,
    Side,
    Timing,
    identity,
)

FAULT_KINDS: tuple[FaultKind, ...] = ("kill", "stop", "cut", "term")
_POLL = 0.1
_FRESH_ACTING = 0.5


@dataclass(frozen=True)
class InteropConfig:
    kubeconfig: Path
    namespace: str
    go_binary: Path
    work_dir: Path
    sides: tuple[Side, ...] = ("ours", "go", "ours", "go")
    timing: Timing = field(default_factory=Timing)
    duration: float = 300.0
    kinds: tuple[FaultKind, ...] = FAULT_KINDS
    standby_every: int = 5
    seed: int = 0
    lease: str = "interop"


@dataclass(frozen=True)
class InteropRun:
    lines: tuple[CandidateLine, ...]
    records: tuple[LeaseRecord, ...]
    faults: tuple[FaultRecord, ...]
    timing: Timing
    started: float
    until: float
    term_exits: tuple[tuple[str, int | None], ...]
    problems: tuple[str, ...]

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path


@dataclass(eq=False)
class _Slot:
    side: Side
    index: int
    proxy: TcpProxy
    kubeconfig: Path
    incarnation: int = 0
    process: CandidateProcess | None = None

    @property
    def identity(self) -> str:
        return identity(self.side, self.index, self.incarnation)


class LeaderInterop:
    """`async with LeaderInterop(config) as interop: run = await interop.run()`."""

    def __init__(self, config: InteropConfig) -> None:
        self._config = config
        self._command = CandidateCommand(
            go_binary=config.go_binary,
            namespace=config.namespace,
            lease=config.lease,
            timing=config.timing,
        )
        self._rng = random.Random(config.seed)
        self._stack = AsyncExitStack()
        self._slots: list[_Slot] = []
        self._processes: list[CandidateProcess] = []
        self._lines: list[CandidateLine] = []
        self._last_acting: dict[str, float] = {}
        self._faults: list[FaultRecord] = []
        self._term_exits: list[tuple[str, int | None]] = []
        self._problems: list[str] = []
        self._watch: LeaseWatch | None = None

    async def __aenter__(self) -> LeaderInterop:
        config = self._config
        config.work_dir.mkdir(parents=True, exist_ok=True)
        async with AsyncExitStack() as stack:
            self._watch = await stack.enter_async_context(
                LeaseWatch(config.kubeconfig, config.namespace, config.lease)
            )
            host, port = server_address(config.kubeconfig)
            for index, side in enumerate(config.sides):
                proxy = stack.enter_context(
                    TcpProxy(upstream_host=host, upstream_port=port, name=f"{side}-{index}")
                )
                kubeconfig = proxied_kubeconfig(
                    config.kubeconfig, config.work_dir / f"{side}-{index}.kubeconfig", proxy.url
                )
                self._slots.append(_Slot(side, index, proxy, kubeconfig))
            stack.push_async_callback(self._stop_all)
            for slot in self._slots:
                await self._start(slot)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def run(self) -> InteropRun:
        """Injects faults until the duration has passed, waits for the last takeover, then stops
        every candidate."""
        assert self._watch is not None
        started = time.time()
        deadline = started + self._config.duration
        count = 0
        while time.time() < deadline:
            holder = await self._leader()
            if holder is None:
                continue
            await asyncio.sleep(self._rng.uniform(1.0, 2.0) * self._config.timing.retry_period)
            if time.time() >= deadline:
                break
            kind = self._config.kinds[count % len(self._config.kinds)]
            count += 1
            target = holder
            if count % self._config.standby_every == 0:
                target = self._rng.choice([s for s in self._slots if s is not holder])
            is_holder = self._watch.holder == target.identity
            self._faults.append(await self._inject(kind, target, holder=is_holder))
        await self._leader()
        until = time.time()
        await self._stop_all()
        return InteropRun(
            lines=tuple(sorted(self._lines, key=lambda line: line.t)),
            records=tuple(self._watch.records),
            faults=tuple(self._faults),
            timing=self._config.timing,
            started=started,
            until=until,
            term_exits=tuple(self._term_exits),
            problems=tuple(self._problems),
        )

    def _sink(self, line: CandidateLine) -> None:
        self._lines.append(line)
        if line.event == "acting":
            self._last_acting[line.id] = line.t

    async def _start(self, slot: _Slot) -> None:
        process = CandidateProcess(
            self._command.argv(slot.side, slot.kubeconfig, slot.identity),
            slot.identity,
            self._config.work_dir / f"{slot.identity}.stderr",
            self._sink,
        )
        await process.start()
        slot.process = process
        self._processes.append(process)

    async def _restart(self, slot: _Slot) -> None:
        slot.incarnation += 1
        await self._start(slot)

    async def _leader(self) -> _Slot | None:
        """The slot whose candidate holds the Lease and is acting, once there is one."""
        assert self._watch is not None
        timing = self._config.timing
        give_up = time.time() + 2 * timing.observed_bound + timing.lease_duration
        while time.time() < give_up:
            now = time.time()
            for slot in self._slots:
                fresh = now - self._last_acting.get(slot.identity, 0.0) < _FRESH_ACTING
                if fresh and self._watch.holder == slot.identity:
                    return slot
            await asyncio.sleep(_POLL)
        self._problems.append(f"no candidate held the Lease and acted by {give_up:.3f}")
        return None

    async def _inject(self, kind: FaultKind, slot: _Slot, *, holder: bool) -> FaultRecord:
        process = slot.process
        assert process is not None
        timing = self._config.timing
        silent_for = timing.observed_bound + timing.retry_period
        target = slot.identity
        start = time.time()
        if kind == "kill":
            process.signal(signal.SIGKILL)
            await process.wait(timing.renew_deadline)
            await self._restart(slot)
        elif kind == "stop":
            process.signal(signal.SIGSTOP)
            await asyncio.sleep(silent_for)
            process.signal(signal.SIGCONT)
        elif kind == "cut":
            slot.proxy.go_silent()
            slot.proxy.cut()
            await asyncio.sleep(silent_for)
            slot.proxy.cut()
            slot.proxy.resume()
        else:
            process.signal(signal.SIGTERM)
            code = await process.wait(timing.renew_deadline + 5)
            self._term_exits.append((target, code))
            if code is None:
                self._problems.append(f"{target} did not exit after SIGTERM; killed")
                process.signal(signal.SIGKILL)
                await process.wait(timing.renew_deadline)
            await self._restart(slot)
        return FaultRecord(kind=kind, target=target, holder=holder, start=start, end=time.time())

    async def _stop_all(self) -> None:
        await asyncio.gather(*(p.stop() for p in self._processes))
