"""The differential harness's faults: each one applied while writes land, then healed.

Go counterpart: none. The TCP proxy cuts and silences connections, the HTTP proxy answers chosen
statuses, corrupts chunks and black-holes connections, and the control plane restarts its
apiserver and etcd, compacts history and restores etcd from a snapshot. The broken frames
(the record's `k8s_reflector.py` row "Malformed frames") break the frame of one write on each
client's watch of each kind, one proxy fault per client and kind, the client told apart by its
User-Agent, and are timed from that write.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from miles.utils.k8s_testenv import FaultUnsupportedError
from miles.utils.k8s_testenv.http_fault_proxy import (
    PODS,
    Action,
    BlackHole,
    CorruptChunk,
    Fault,
    Match,
    Respond,
    RewriteFrame,
    cut_in_name,
    without_name,
)
from miles.utils.k8s_testenv.kwok import Kwok
from miles.utils.k8s_testenv.testing.differential.config import HarnessConfig, LogFn
from miles.utils.k8s_testenv.testing.differential.errors import HarnessAborted
from miles.utils.k8s_testenv.testing.differential.lifecycle import Rig, server_address
from miles.utils.k8s_testenv.testing.differential.oracle_client import ORACLE_USER_AGENT
from miles.utils.k8s_testenv.testing.differential.ours import OURS_USER_AGENT
from miles.utils.k8s_testenv.testing.differential.scenario import BROKEN_FRAMES, FaultKind, OpKind
from miles.utils.k8s_testenv.testing.differential.stats import Stats
from miles.utils.k8s_testenv.testing.differential.views import NamelessGhost
from miles.utils.k8s_testenv.testing.differential.writer import Writer

logger = logging.getLogger(__name__)

_IN_FAULT_OPS = 3
POOLS = r"/apis/miles\.io/v1alpha1/namespaces/[^/]+/enginepools$"
"""The path of engine pools (`engine_pools.ENGINE_POOLS`) in a namespace."""
WATCHED = f"{PODS}|{POOLS}"
"""The paths both clients list and watch: pods and engine pools."""
WATCH = Match(watch=True, path=WATCHED)
_FRAME_MET_WITHIN = 15.0
"""Seconds for each client's watch to carry the write's frame to the proxy (a watch being
reopened replays it from the client's cursor)."""


@dataclass(frozen=True)
class Healed:
    """When a fault was healed (a broken frame: when its write was sent), and the ghost client-go
    is expected to keep after it, if any."""

    at: float
    ghost: NamelessGhost | None = None


@dataclass(frozen=True, kw_only=True)
class Faults:
    """`await faults.inject(fault)` applies and heals one fault, returning when it was healed."""

    rig: Rig
    writer: Writer
    config: HarnessConfig
    rng: random.Random
    stats: Stats
    log: LogFn
    kwok: Kwok | None = None
    kubelet_churn: bool = False

    async def inject(self, fault: FaultKind) -> Healed | None:
        """Applies the fault and heals it; returns when it was healed, or None if skipped."""
        try:
            healed = await self._fault(fault)
        except FaultUnsupportedError as err:
            self.stats.skipped[fault.value] = str(err)
            self.log(f"differential: skipped {fault.value}: {err}")
            return None
        self.stats.faults[fault] += 1
        return healed

    async def _fault(self, fault: FaultKind) -> Healed:
        logger.warning("differential: injecting %s", fault.value)
        if fault in BROKEN_FRAMES:
            return await self._break_a_frame(fault)
        return Healed(await self._healed_at(fault))

    async def _healed_at(self, fault: FaultKind) -> float:
        own = {
            FaultKind.APISERVER_RESTART: self._restart_target_apiserver,
            FaultKind.COMPACT_410: self._compact_then_cut,
            FaultKind.ETCD_RESTART: self._stop_start_etcd,
            FaultKind.ETCD_RESTORE: self._restore_etcd,
            FaultKind.CUT_MID_FRAME: self._cut_mid_frame,
            FaultKind.SILENT: self._go_silent,
            FaultKind.CORRUPT_CHUNK: self._corrupt_chunks,
            FaultKind.DEAD_CONNECTION: self._dead_connections,
        }
        if (inject := own.get(fault)) is not None:
            return await inject()
        if (answer := self._http_answer(fault)) is not None:
            return await self._answer_requests(*answer)
        return await self._reconcile_fault(fault)

    def _http_answer(self, fault: FaultKind) -> tuple[Match, Respond] | None:
        if fault is FaultKind.WATCH_500:
            return WATCH, Respond(500)
        if fault is FaultKind.CURSOR_REJECTED:
            rejections = [Respond(410, in_band=True), Respond(410), Respond(504)]
            return WATCH, self.rng.choice(rejections)
        if fault is FaultKind.THROTTLED_429:
            return Match(path=WATCHED), Respond(429, headers={"Retry-After": "2"})
        return None

    async def _answer_requests(self, match: Match, answer: Respond) -> float:
        """Every request `match` fits is answered `answer` for `fault_seconds` (the fresh LIST
        goes to the other apiserver, so it is spared); open watches are cut first so that every
        client has to ask again, and writes land meanwhile."""
        with self._http_fault(match, answer):
            self.rig.proxy.cut()
            await self.writer.ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.fault_seconds)
        return time.monotonic()

    async def _corrupt_chunks(self) -> float:
        """The next chunk of every watch response, open or opened during the fault, is half a
        frame and then broken framing (a chunk-size line that is not hex, or chunk data past its
        size, drawn by the seed), on a connection kept open; writes make the chunks."""
        corruption = self.rng.choice([CorruptChunk(), CorruptChunk(framing="terminator")])
        with self._http_fault(WATCH, corruption):
            await self.writer.ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.fault_seconds)
        return time.monotonic()

    async def _dead_connections(self) -> float:
        """Every watch connection dies without a FIN at its next chunk: nothing more is
        forwarded and nothing closes it. After `silent_seconds` the held connections are reset,
        since client-go over the proxy's HTTP/1.1 has no health check and would wait forever."""
        with self._http_fault(WATCH, BlackHole()):
            await self.writer.ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.silent_seconds)
        held = await self.rig.http_proxy.reset_held()
        logger.warning("differential: reset %d dead connection(s)", held)
        return time.monotonic()

    async def _break_a_frame(self, fault: FaultKind) -> Healed:
        """A label write to a pod both clients hold, and one to an engine pool they hold where
        pools are watched, whose frames the proxy breaks on each client's watch of that kind:
        without its name, cut inside its name, or in a chunk whose framing breaks (that
        connection then held open and silent). A frame without a name decodes in Go, so
        client-go is expected to keep the ghosts `NamelessGhost` describes, one per kind."""
        pod = self.writer.held_pod()
        if pod is None:
            raise FaultUnsupportedError("no pod both clients hold to write to")
        pools = self.writer.pools
        pool = None if pools is None else pools.held()
        breakage = self._breakage(fault, pod)
        frames = [("pods", PODS, breakage)]
        if pool is not None:
            frames.append(("engine pools", POOLS, dataclasses.replace(breakage, pod=pool)))
        proxy = self.rig.http_proxy
        armed = {
            f"the {kind}' watch of {agent}*": proxy.add(
                Match(watch=True, path=path, user_agent=agent), action, count=1
            )
            for kind, path, action in frames
            for agent in (OURS_USER_AGENT, ORACLE_USER_AGENT)
        }
        try:
            written_at = time.monotonic()
            await self.writer.mutate(OpKind.RELABEL, pod)
            if pools is not None and pool is not None:
                await pools.touch(pool)
            await _until_applied(
                armed, f"{fault.value} of {pod}" + (f" and {pool}" if pool else "")
            )
        finally:
            for one in armed.values():
                proxy.remove(one)
        ghost = NamelessGhost(pod, pool) if fault is FaultKind.FRAME_WITHOUT_NAME else None
        return Healed(written_at, ghost)

    def _breakage(self, fault: FaultKind, pod: str) -> RewriteFrame | CorruptChunk:
        if fault is FaultKind.FRAME_WITHOUT_NAME:
            return RewriteFrame(without_name, "without a name", pod=pod)
        if fault is FaultKind.FRAME_CUT:
            return RewriteFrame(cut_in_name, "cut inside its name", pod=pod)
        return self.rng.choice([CorruptChunk(pod=pod), CorruptChunk(framing="terminator", pod=pod)])

    @contextlib.contextmanager
    def _http_fault(self, match: Match, action: Action) -> Iterator[None]:
        fault = self.rig.http_proxy.add(match, action)
        try:
            yield
        finally:
            self.rig.http_proxy.remove(fault)

    async def _restart_target_apiserver(self) -> float:
        """Writes land while the clients' apiserver is down; healed once its port accepts."""
        restart = asyncio.create_task(
            asyncio.to_thread(self.rig.plane.restart_apiserver, self.config.target)
        )
        address = server_address(self.rig.target_kubeconfig)
        try:
            await _until_accepting(address, accepting=False, unless=restart)
            await self.writer.ops_during_fault(_IN_FAULT_OPS)
            await _until_accepting(address, accepting=True, unless=restart)
            return time.monotonic()
        finally:
            await restart

    async def _stop_start_etcd(self) -> float:
        """No write can land while etcd is down; the writes right after it is back must arrive."""
        plane = self.rig.plane
        await asyncio.to_thread(plane.stop_etcd)
        try:
            await asyncio.sleep(self.config.etcd_down_seconds)
        finally:
            await asyncio.to_thread(plane.start_etcd)
        healed_at = time.monotonic()
        await self.writer.ops_during_fault(_IN_FAULT_OPS)
        return healed_at

    async def _restore_etcd(self) -> float:
        """etcd rolled back by the documented procedure: a snapshot (etcd stopped for the copy),
        writes the rollback erases, every apiserver stopped, etcd restored, the apiservers started,
        and then every client-go component restarted (KWOK and client-go's oracle: their caches
        are ahead of the restored etcd, which no cursor can tell once writes pass it); healed once
        the apiservers are back, and written at once. Ours is not restarted: it must see the
        apiserver go and relist. Not with the real node, whose kubelet, scheduler and
        controller-manager the procedure would also restart."""
        if self.kubelet_churn:
            raise FaultUnsupportedError(
                "restoring etcd would leave the real node's kubelet, scheduler and "
                "controller-manager ahead of etcd, and the soak does not restart them"
            )
        plane = self.rig.plane
        snapshot = await asyncio.to_thread(plane.snapshot_etcd)
        await self.writer.ops_during_fault(_IN_FAULT_OPS)
        await asyncio.to_thread(plane.restore_etcd, snapshot, stop_apiservers=True)
        healed_at = time.monotonic()
        if self.kwok is not None:
            await asyncio.to_thread(self.kwok.stop)
            await asyncio.to_thread(self.kwok.start)
        await self.rig.restart_oracle()
        await self.writer.reread()
        await self.writer.ops_during_fault(_IN_FAULT_OPS)
        logger.warning("differential: etcd restored from %s", snapshot.name)
        return healed_at

    async def _cut_mid_frame(self) -> float:
        """Cut inside the frames of a write, then write more while the clients reconnect."""
        cut = self.rig.proxy.cut_mid_frame(idle_after=3.0)
        await self.writer.apply(OpKind.RELABEL, quiet=True)
        report = await asyncio.wrap_future(cut)
        healed_at = time.monotonic()
        logger.warning(
            "differential: cut %d connection(s) mid-frame, %d idle", report.mid_frame, report.idle
        )
        await self.writer.ops_during_fault(_IN_FAULT_OPS)
        return healed_at

    async def _go_silent(self) -> float:
        """Writes land while nothing is forwarded; longer than our watch's read deadline."""
        self.rig.proxy.go_silent()
        try:
            await self.writer.ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.silent_seconds)
        finally:
            self.rig.proxy.resume()
        return time.monotonic()

    async def _compact_then_cut(self) -> float:
        """A real 410: make both cursors stale with writes they do not see, compact, cut, and
        write what only a relist can bring.

        The proxy is silent from before the first write until the cut, so no event or bookmark
        written meanwhile (the real node's kubelet updates the clients' pods at any time) can
        carry a cursor past the compacted revision."""
        proxy, writer = self.rig.proxy, self.writer
        proxy.go_silent()
        try:
            bystanders = await writer.gather(writer.create(selected=False) for _ in range(3))
            await writer.gather(writer.mutate(OpKind.RELABEL, name) for name in bystanders)
            revision = await asyncio.to_thread(self.rig.plane.compact_etcd)
            cut = proxy.cut()
        finally:
            proxy.resume()
        healed_at = time.monotonic()
        logger.warning("differential: compacted etcd to %d, cut %d connection(s)", revision, cut)
        await writer.ops_during_fault(_IN_FAULT_OPS)
        return healed_at

    async def _reconcile_fault(self, fault: FaultKind) -> float:
        """Reconcile sleeps or raises while writes land; the store must not care, and every parent
        must be reconciled with its final members once the fault is gone."""
        slow = fault is FaultKind.RECONCILE_SLOW
        await self.rig.ours.reconcile_fault(delay=0.5 if slow else 0.0, raises=not slow)
        try:
            await self.writer.ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(1.5)
        finally:
            await self.rig.ours.reconcile_fault(delay=0.0, raises=False)
        return time.monotonic()


async def _until_applied(armed: dict[str, Fault], what: str) -> None:
    """Returns once every watch's fault met its frame; `HarnessAborted` naming each watch that
    never carried it."""
    deadline = time.monotonic() + _FRAME_MET_WITHIN
    while missing := [agent for agent, fault in armed.items() if fault.applied == 0]:
        if time.monotonic() > deadline:
            raise HarnessAborted(
                f"{what}: no frame about it reached the proxy on {', '.join(missing)} "
                f"within {_FRAME_MET_WITHIN:.0f}s"
            )
        await asyncio.sleep(0.05)


async def _until_accepting(
    address: tuple[str, int], *, accepting: bool, unless: asyncio.Task[None]
) -> None:
    """Returns once `address` accepts connections (or refuses them, with `accepting=False`),
    or once `unless` is done; at most 60 s."""
    deadline = time.monotonic() + 60.0
    while not unless.done() and time.monotonic() < deadline:
        if await _accepts(address) is accepting:
            return
        await asyncio.sleep(0.05)


async def _accepts(address: tuple[str, int]) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*address), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True
