"""Instructions per WATCH event, counted by callgrind: a CPU figure the host's load does not move.

Go counterpart: none (benchmark plumbing). ``bench/apiserver.py --instructions`` runs each contender
under ``valgrind --tool=callgrind`` with instrumentation off, so that its start and its sync run at
valgrind's plain speed and count nothing; ``callgrind_control`` turns it on just before the writer
starts and dumps the count once the contender's store holds the writer's last resourceVersion.
What is counted is every instruction the contender's own process ran in user space in that
window, on all its threads: the read path, the decode, the store, the event loop or the runtime.
The kernel's side of its reads is not counted (``/proc`` CPU time counts it). The count is the
same whatever else the machine runs; what still moves it is how events batch into reads, so the
writer is paced (``RATE``) well below what a contender runs under valgrind.

Each dump is a callgrind profile; ``self_costs`` reads where the instructions went, by shared
object and, for Rust code, by crate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.apiserver_kube_rs import ContenderUnavailable
from bench.apiserver_measure import (
    SYNC_TIMEOUT,
    Env,
    Scenario,
    WriterRun,
    child,
    python_contender_args,
    ready_writer,
    run_writer,
    write_and_catch_up,
)
from bench.apiserver_oracle import oracle_process
from bench.report import Values

RATE = 40.0
"""Writer patches per second while counting: each event its own read, for every contender."""
COUNTED = (
    "ours",
    "ours-stream",
    "ka",
    "kube-rs",
    "wire",
    "wire-decode",
    "wire-keep",
    "ours-typed",
    "ours-dynamic",
)
NOT_COUNTED = "it cannot say it holds a resourceVersion without being polled, inside the window"
"""Why client-go is not in ``COUNTED``."""
CONTROL_TIMEOUT = 60.0
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")


@dataclass(frozen=True)
class Callgrind:
    valgrind: str
    control: str
    out_dir: Path

    @classmethod
    def find(cls, out_dir: Path) -> Callgrind:
        """``ContenderUnavailable`` (one line) where valgrind is not installed."""
        valgrind, control = shutil.which("valgrind"), shutil.which("callgrind_control")
        if valgrind is None or control is None:
            raise ContenderUnavailable(
                "no valgrind / callgrind_control on PATH (apt-get install valgrind)"
            )
        return cls(valgrind, control, out_dir)

    def wrapper(self, name: str, seed: int) -> list[str]:
        return [
            self.valgrind,
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={self.out_dir / f'{name}.{seed}.callgrind'}",
        ]

    def window_dump(self, name: str, seed: int) -> Path:
        """The first dump of a run is its window; the one valgrind writes at exit is unnumbered."""
        return self.out_dir / f"{name}.{seed}.callgrind.1"

    @contextlib.asynccontextmanager
    async def counting(self, pid: int, dump: Path) -> AsyncIterator[Count]:
        """Instrumentation on for the body; its instructions in the ``Count`` afterwards."""
        await self._control(pid, "--instr=on")
        count = Count()
        yield count
        await self._control(pid, "--dump=window")
        count.instructions = totals(dump)

    async def _control(self, pid: int, option: str) -> None:
        process = await asyncio.create_subprocess_exec(
            self.control,
            option,
            str(pid),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), CONTROL_TIMEOUT)
        if process.returncode != 0:
            said = output.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"callgrind_control {option} {pid}: {said[:1] or 'no output'}")


@dataclass
class Count:
    instructions: int = 0


def totals(dump: Path) -> int:
    found = _TOTALS.search(dump.read_bytes())
    if found is None:
        raise RuntimeError(f"{dump}: a callgrind dump without a totals line")
    return int(found.group(1))


def self_costs(lines: Iterable[str]) -> Counter[str]:
    """Instructions spent in each shared object (``ob``), and in Rust code by crate, from a dump.

    A cost line right after ``calls=`` is the call's inclusive cost and is the callee's, counted
    where the callee's own lines are; names are compressed as ``(id) name`` once, ``(id)`` after.
    """
    names: dict[tuple[str, str], str] = {}
    costs: Counter[str] = Counter()
    obj = function = ""
    after_call = False
    for line in lines:
        if line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
            else:
                fields = line.split()
                if len(fields) > 1:
                    costs[where(obj, function)] += int(fields[1])
            continue
        key, _, value = line.partition("=")
        if key in ("ob", "fn", "cob", "cfn", "cfi", "cfl", "fl", "fi", "fe"):
            resolved = resolve(names, key.removeprefix("c"), value)
            if key == "ob":
                obj = resolved
            elif key == "fn":
                function = resolved
        elif key == "calls":
            after_call = True
    return costs


def resolve(names: dict[tuple[str, str], str], kind: str, value: str) -> str:
    found = _NAMED.match(value)
    if found is None:
        return value
    ident, name = found.groups()
    kind = "fl" if kind in ("fi", "fe") else kind
    if name is not None:
        names[kind, ident] = name
    return names.get((kind, ident), value)


def where(obj: str, function: str) -> str:
    library = Path(obj).name or "?"
    head = function.lstrip("<&*").removeprefix("dyn ").removeprefix("mut ")
    crate, sep, _ = head.partition("::")
    return f"{library}: {crate}" if sep and crate.isidentifier() else library


# --- one contender, counted -----------------------------------------------------------------------


async def count(
    name: str, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int, cg: Callgrind
) -> Values:
    if name == "kube-rs":
        return await count_compiled(name, env, scenario, args, seed, cg)
    return await count_python(name, env, scenario, args, seed, cg)


async def count_python(
    name: str, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int, cg: Callgrind
) -> Values:
    argv = python_contender_args(name, env, scenario, args)
    log = env.logs / f"{name}.log"
    async with child("apiserver_contender", argv, log=log, wrapper=cg.wrapper(name, seed)) as proc:
        await proc.read("synced", SYNC_TIMEOUT)
        async with ready_writer(env, scenario, args, seed) as writer:
            await proc.send("mark")
            await proc.read("marked", CONTROL_TIMEOUT)
            async with cg.counting(proc.process.pid, cg.window_dump(name, seed)) as count:
                written, applied_rv = await write_and_catch_up(proc, writer, args)
        await proc.send("quit")
    return counted(count, written, applied_rv)


async def count_compiled(
    name: str, env: Env, scenario: Scenario, args: argparse.Namespace, seed: int, cg: Callgrind
) -> Values:
    log = env.logs / f"{name}.log"
    wrapper = cg.wrapper(name, seed)
    async with oracle_process(
        env.binaries[name], env.kubeconfig, namespace=scenario.namespace, log=log, wrapper=wrapper
    ) as oracle:
        await oracle.wait_until(pods=scenario.pods, within=SYNC_TIMEOUT)
        window = cg.counting(oracle.pid, cg.window_dump(name, seed))
        async with ready_writer(env, scenario, args, seed) as writer, window as count:
            written = await run_writer(writer, args)
            snap = await oracle.wait_for_rv(written.last_rv, args.drain_timeout)
    return counted(count, written, snap.resource_version)


def counted(count: Count, written: WriterRun, applied_rv: int) -> Values:
    events = len(written.acks)
    missed = sum(rv > applied_rv for _, rv in written.acks)
    return {
        "instructions_per_event": count.instructions / events if events and not missed else None,
        "instructions": float(count.instructions),
        "events": float(events),
        "missed_events": float(missed),
    }
