"""Seeded differential scenarios: our `ReconcileLoop` and client-go's Reflector side by side.

Go counterpart: none; this is the test that holds our reflector and store to client-go's. Both
clients watch the same namespace and label selector on the *target* apiserver (the cache-less one by
default, where compaction gives a real 410) through a `TcpProxy` and then an `HttpFaultProxy` the
harness controls (the first cuts and silences TCP, the second answers chosen statuses, corrupts
chunks and black-holes connections); the harness
writes through the other apiserver, so its writes keep going while the target restarts or the
proxy is cut or silent. After every step it polls until three views agree and stay agreed:

- the fresh consistent LIST (resourceVersion unset), the truth;
- client-go's store, read from `tools/k8s/oracle`;
- our store, plus what the last reconcile of each parent read.

`views.py` says what each must equal (and the one deviation Go's semantics predict for client-go
after a watch frame without a name: counted apart, client-go restarted). A checkpoint that does not
settle within `quiesce_timeout` raises `DivergenceError` with a table of every pod some view has
wrong; a comparison that could not be made (the oracle or the proxy died, the LIST kept failing)
raises `HarnessAborted`. Neither is ever counted as a success.

Where the plane runs the real node, the kubelet churn of engine pods on it (`kubelet_churn.py`:
crashes, readiness flips, graceful deletes, recreations) is among the operations; elsewhere it is
skipped, saying why.

Every choice comes from one `random.Random(seed)` over the harness's own model of the pods it
wrote, so a seed replays the same operations in the same order.

The harness composes four parts: `lifecycle.Rig` (the processes), `writer.Writer` (the writes),
`faults.Faults` (each fault, applied and healed) and `checkpoints.Checkpoints` (the comparisons).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv import ControlPlane
from miles.utils.k8s_testenv.http_fault_proxy import HttpFaultProxy
from miles.utils.k8s_testenv.kwok import Kwok
from miles.utils.k8s_testenv.real_node import RealNode
from miles.utils.k8s_testenv.tcp_proxy import TcpProxy
from miles.utils.k8s_testenv.testing.differential.checkpoints import Checkpoints
from miles.utils.k8s_testenv.testing.differential.config import HarnessConfig, LogFn
from miles.utils.k8s_testenv.testing.differential.environment import DifferentialEnvironment
from miles.utils.k8s_testenv.testing.differential.errors import DivergenceError, HarnessAborted
from miles.utils.k8s_testenv.testing.differential.faults import Faults, Healed
from miles.utils.k8s_testenv.testing.differential.kubelet_churn import KubeletChurn
from miles.utils.k8s_testenv.testing.differential.lifecycle import OursFactory, Rig
from miles.utils.k8s_testenv.testing.differential.oracle_client import OracleProcess
from miles.utils.k8s_testenv.testing.differential.ours import PARENT_LABEL, OurLoop
from miles.utils.k8s_testenv.testing.differential.pool_writer import PoolWriter
from miles.utils.k8s_testenv.testing.differential.scenario import FaultKind, OpKind, Step, soak_step
from miles.utils.k8s_testenv.testing.differential.stats import Convergence, Stats
from miles.utils.k8s_testenv.testing.differential.views import NamelessGhost
from miles.utils.k8s_testenv.testing.differential.writer import Writer, pod_labels


@dataclass(frozen=True)
class _Parts:
    checkpoints: Checkpoints
    writer: Writer
    faults: Faults


class DifferentialHarness:
    """`async with DifferentialHarness(...) as harness: await harness.run(plan)`."""

    def __init__(
        self,
        *,
        plane: ControlPlane,
        oracle_binary: Path,
        work_dir: Path,
        config: HarnessConfig,
        kwok: Kwok | None = None,
        kwok_unavailable: str | None = None,
        real_node: RealNode | None = None,
        real_node_unavailable: str | None = None,
        log: LogFn = print,
        ours: OursFactory = OurLoop,
    ) -> None:
        """`ours` builds our side from its settings: `OurLoop` in this process by default, or
        `OurLoopProcess` in a child whose own resources can then be measured apart."""
        self.config = config
        self.stats = Stats()
        for left_out in sorted(config.without):
            self.stats.skipped[left_out] = "left out of this run"
        self.namespace = f"diff-{config.seed}-{uuid.uuid4().hex[:6]}"
        self._rig = Rig(
            plane=plane,
            oracle_binary=oracle_binary,
            work_dir=work_dir,
            config=config,
            namespace=self.namespace,
            ours_factory=ours,
            log=log,
        )
        self._kwok = kwok
        self._kwok_unavailable = kwok_unavailable or "no KWOK node was given"
        self._real_node = real_node
        self._real_node_unavailable = real_node_unavailable or "no real node was given"
        self._log = log
        self._rng = random.Random(config.seed)
        self._stack = AsyncExitStack()
        self._parts: _Parts | None = None

    @classmethod
    def on(
        cls,
        env: DifferentialEnvironment,
        *,
        config: HarnessConfig,
        log: LogFn = print,
        ours: OursFactory = OurLoop,
        work_dir: Path | None = None,
    ) -> DifferentialHarness:
        """A harness on `env`: its plane, oracle, KWOK and real node (or why each is missing),
        writing under `work_dir` (`env.work_dir` by default). Each of the environment's fields is
        the parameter of the same name."""
        parts: dict[str, Any] = {part.name: getattr(env, part.name) for part in fields(env)}
        if work_dir is not None:
            parts["work_dir"] = work_dir
        return cls(**parts, config=config, log=log, ours=ours)

    @property
    def oracle(self) -> OracleProcess:
        return self._rig.oracle

    @property
    def pool_oracle(self) -> OracleProcess | None:
        """client-go's dynamic informer over engine pools, where the run watches them."""
        return self._rig.pool_oracle

    @property
    def proxy(self) -> TcpProxy:
        return self._rig.proxy

    @property
    def http_proxy(self) -> HttpFaultProxy:
        return self._rig.http_proxy

    @property
    def stored_pods(self) -> int:
        """How many pods our store held at the last comparison."""
        return 0 if self._parts is None else self._parts.checkpoints.stored_pods

    async def __aenter__(self) -> DifferentialHarness:
        async with AsyncExitStack() as stack:
            self._parts = await self._start(stack)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _start(self, stack: AsyncExitStack) -> _Parts:
        rig = await stack.enter_async_context(self._rig)
        checkpoints = Checkpoints(rig=rig, config=self.config, stats=self.stats)
        churn = self._kubelet_churn(checkpoints)
        if churn is not None:
            stack.push_async_callback(churn.aclose)
        writer = Writer(
            core=rig.core,
            namespace=self.namespace,
            config=self.config,
            rng=self._rng,
            stats=self.stats,
            kwok=self._kwok,
            kwok_unavailable=self._kwok_unavailable,
            churn=churn,
            churn_unavailable=self._real_node_unavailable,
            log=self._log,
        )
        if self.config.engine_pools:
            writer.pools = PoolWriter(
                custom=rig.custom,
                namespace=self.namespace,
                parents=self.config.parents,
                rng=random.Random(f"enginepools-{self.config.seed}"),
                write=writer.write_retried,
            )
        faults = Faults(
            rig=rig,
            writer=writer,
            config=self.config,
            rng=self._rng,
            stats=self.stats,
            log=self._log,
            kwok=self._kwok,
            kubelet_churn=churn is not None,
        )
        self.stats.backend = self._backend(churn)
        self._log(f"differential: pods run on {self.stats.backend}")
        if churn is None:
            self._log(f"differential: kubelet churn skipped: {self._real_node_unavailable}")
        return _Parts(checkpoints=checkpoints, writer=writer, faults=faults)

    def _backend(self, churn: KubeletChurn | None) -> str:
        kwok = f"KWOK node {self._kwok.node_name}" if self._kwok is not None else "no KWOK node"
        if churn is None:
            return f"{kwok} only (no real node: {self._real_node_unavailable})"
        return f"{churn.backend} (kubelet churn) and {kwok}"

    def _kubelet_churn(self, checkpoints: Checkpoints) -> KubeletChurn | None:
        if self._real_node is None:
            return None
        churn = KubeletChurn(
            core=self._rig.core,
            apps=self._rig.apps,
            namespace=self.namespace,
            node=self._real_node,
            rng=self._rng,
            labels=pod_labels,
            parent_label=PARENT_LABEL,
            checkpoint=checkpoints.agreed_checkpoint,
            stats=self.stats,
        )
        return churn

    @property
    def _started(self) -> _Parts:
        if self._parts is None:
            raise HarnessAborted("the harness is not started")
        return self._parts

    async def run(self, steps: Sequence[Step]) -> Stats:
        for index, step in enumerate(steps):
            await self.run_step(step, label=f"step {index + 1}/{len(steps)}")
        return self.stats

    async def run_for(self, seconds: float) -> Stats:
        deadline = time.monotonic() + seconds
        await self.run_step(OpKind.CREATE, label="step 1")
        index = 1
        while time.monotonic() < deadline:
            index += 1
            step = soak_step(self._rng, index, without=self.config.without)
            try:
                await self.run_step(step, label=f"step {index}")
            except DivergenceError as err:
                if not self.config.keep_going:
                    raise
                self._log(f"differential: DIVERGENCE, counted, going on:\n{err}")
        return self.stats

    async def run_step(self, step: Step, *, label: str) -> None:
        parts = self._started
        lists_before = parts.checkpoints.relist_counts()
        healed: Healed | None = None
        if isinstance(step, FaultKind):
            healed = await parts.faults.inject(step)
            if healed is None:
                return
        else:
            await parts.writer.apply(step)
        comparison_time = await self.checkpoint(
            f"{label} {step.value}",
            healed_at=None if healed is None else healed.at,
            ghost=None if healed is None else healed.ghost,
        )
        ours, oracle = parts.checkpoints.relist_counts()
        if isinstance(step, FaultKind) and comparison_time is not None:
            self.stats.convergence.setdefault(step, []).append(comparison_time)
            self.stats.our_relists[step] += ours - lists_before[0]
            self.stats.oracle_relists[step] += oracle - lists_before[1]
            self._log(
                f"differential: {label} {step.value}: converged after {comparison_time.ours:.2f}s "
                f"(ours; reconciled {comparison_time.reconciled:.2f}s) / "
                f"{_client_go_time(comparison_time)}, relists "
                f"{ours - lists_before[0]}/{oracle - lists_before[1]}"
            )
            if comparison_time.client_go_diverged is not None:
                await self._restart_diverged_client_go(step, label)

    async def _restart_diverged_client_go(self, step: FaultKind, label: str) -> None:
        """client-go kept what Go's semantics predict after `step`: counted apart, then a new
        client-go process (its LIST counted with the old one's) and a checkpoint, so that the
        steps after it compare both clients again."""
        self.stats.client_go_diverged[step] += 1
        await self._rig.restart_oracle()
        await self.checkpoint(f"{label} {step.value}: client-go restarted")

    async def checkpoint(
        self, what: str, *, healed_at: float | None = None, ghost: NamelessGhost | None = None
    ) -> Convergence | None:
        """Polls until every view matches what it should, twice in a row on the same LIST; with
        `ghost`, client-go may keep that ghost instead (`Checkpoints.checkpoint`).

        Returns, after a fault, how long each client took from `healed_at` to match for good.
        """
        return await self._started.checkpoints.checkpoint(what, healed_at=healed_at, ghost=ghost)


def _client_go_time(convergence: Convergence) -> str:
    if convergence.client_go is None:
        return f"never (client-go, as Go's semantics predict: {convergence.client_go_diverged})"
    return f"{convergence.client_go:.2f}s (client-go)"
