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

`views.py` says what each must equal. A checkpoint that does not settle within `quiesce_timeout`
raises `DivergenceError` with a table of every pod some view has wrong; a comparison that could
not be made (the oracle or the proxy died, the LIST kept failing) raises `HarnessAborted`. Neither
is ever counted as a success.

Where the plane runs the real node, the kubelet churn of engine pods on it (`kubelet_churn.py`:
crashes, readiness flips, graceful deletes, recreations) is among the operations; elsewhere it is
skipped, saying why.

Every choice comes from one `random.Random(seed)` over the harness's own model of the pods it
wrote, so a seed replays the same operations in the same order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from miles.utils.k8s_testenv import ApiServerName, ControlPlane, FaultUnsupportedError, api_client
from miles.utils.k8s_testenv.http_fault_proxy import (
    PODS,
    WATCH,
    Action,
    BlackHole,
    CorruptChunk,
    HttpFaultProxy,
    Match,
    Respond,
)
from miles.utils.k8s_testenv.kwok import Kwok
from miles.utils.k8s_testenv.real_node import RealNode
from miles.utils.k8s_testenv.tcp_proxy import TcpProxy
from miles.utils.k8s_testenv.testing.differential.kubelet_churn import ChurnFailed, KubeletChurn
from miles.utils.k8s_testenv.testing.differential.oracle_client import OracleError, OracleProcess
from miles.utils.k8s_testenv.testing.differential.ours import (
    PARENT_LABEL,
    OurLoop,
    OurLoopError,
    OurLoopSettings,
    Ours,
    OurViews,
    parent_of,
)
from miles.utils.k8s_testenv.testing.differential.scenario import (
    KUBELET_CHURN,
    FaultKind,
    OpKind,
    Step,
    soak_step,
)
from miles.utils.k8s_testenv.testing.differential.stats import Convergence, Stats
from miles.utils.k8s_testenv.testing.differential.views import (
    Comparison,
    PodRow,
    View,
    view_of,
    view_of_json,
)

logger = logging.getLogger(__name__)

SELECT_LABEL = "miles.diff/selected"
GEN_LABEL = "miles.diff/gen"
SELECTOR = f"{SELECT_LABEL}=in"
PROBE_CONDITION = "miles.diff/Probe"
STAMP_CONDITION = "miles.diff/Stamp"
UNSCHEDULED = "miles-diff-unscheduled"
"""The scheduler name of the pods bound to no node: no scheduler serves it, so where the plane
runs kube-scheduler (the real node) they stay Pending and unbound, as on a plane without one."""
OUT_OF_RANGE_TIME = "0000-01-01T00:00:00Z"
"""Accepted by the apiserver (Go's `time.Time` holds year 0), out of range for Python's datetime."""

_POLL_INTERVAL = 0.1
_WRITE_CONCURRENCY = 16
_MERGE_PATCH = "application/strategic-merge-patch+json"
_WRITE_TIMEOUT = 10.0
_WRITE_RETRY_SECONDS = 60.0
_IN_FAULT_OPS = 3

LogFn = Callable[[str], None]
OursFactory = Callable[[OurLoopSettings], AbstractAsyncContextManager[Ours]]


class DivergenceError(AssertionError):
    """The views did not agree within the quiescence timeout."""


class HarnessAborted(RuntimeError):
    """A comparison could not be made: the oracle or the proxy died, or the LIST kept failing."""


class _ListFailed(Exception):
    """The fresh LIST could not be made this poll (the control plane is still recovering)."""


@dataclass(frozen=True)
class HarnessConfig:
    seed: int
    parents: int = 6
    initial_pods: int = 40
    target: ApiServerName = "uncached"
    watch_timeout_seconds: int = 5
    silent_seconds: float = 8.0
    fault_seconds: float = 3.0
    without: frozenset[str] = frozenset()
    keep_going: bool = False
    proxy_history: int = 4096
    """How many requests the HTTP proxy remembers (a bounded log, so a soak does not grow)."""
    """A soak counts a divergence and goes on with the next step instead of stopping."""
    """Operations and faults (their values) left out of a soak."""
    etcd_down_seconds: float = 3.0
    quiesce_timeout: float = 90.0
    bulk_size: int = 200
    oracle_watch_list: bool = False
    streaming_list: bool = False
    """Ours lists by a streaming list (`sendInitialEvents=true`), as client-go's WatchList does."""


@dataclass
class _ModelPod:
    """What the harness last wrote about a pod; choices are made from this, never from reads."""

    parent: str | None
    selected: bool
    bound: bool
    terminating: bool = False


def _read_kubeconfig(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise HarnessAborted(
            f"kubeconfig {path} is not JSON: the harness points its server at the proxy and "
            "reads only the JSON kubeconfigs k8s_testenv writes"
        ) from err


def proxied_kubeconfig(source: Path, target: Path, proxy_url: str) -> Path:
    """A copy of a JSON kubeconfig whose every server is `proxy_url` (TLS stays end to end)."""
    config = _read_kubeconfig(source)
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = proxy_url
    target.write_text(json.dumps(config, indent=2) + "\n")
    target.chmod(0o600)
    return target


def server_address(kubeconfig: Path) -> tuple[str, int]:
    config = _read_kubeconfig(kubeconfig)
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == current["context"]["cluster"])
    url = urlsplit(cluster["cluster"]["server"])
    if url.hostname is None:
        raise HarnessAborted(f"kubeconfig {kubeconfig} has no server host")
    return url.hostname, url.port or 443


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
        self._plane = plane
        self._oracle_binary = oracle_binary
        self._work_dir = work_dir
        self._kwok = kwok
        self._kwok_unavailable = kwok_unavailable or "no KWOK node was given"
        self._real_node = real_node
        self._real_node_unavailable = real_node_unavailable or "no real node was given"
        self._churn: KubeletChurn | None = None
        self._agreed: View = {}
        self._log = log
        self._rng = random.Random(config.seed)
        self._model: dict[str, _ModelPod] = {}
        self._created = 0
        self._generation = 0
        self._stack = AsyncExitStack()
        self._proxy: TcpProxy | None = None
        self._http_proxy: HttpFaultProxy | None = None
        self._oracle: OracleProcess | None = None
        self._ours_factory = ours
        self._ours: Ours | None = None
        self._our_lists = 0
        self._core: Any = None
        self.stored_pods = 0
        """How many pods our store held at the last comparison."""
        self._oracle_lists = 0

    @property
    def oracle(self) -> OracleProcess:
        if self._oracle is None:
            raise HarnessAborted("the harness is not started")
        return self._oracle

    @property
    def proxy(self) -> TcpProxy:
        if self._proxy is None:
            raise HarnessAborted("the harness is not started")
        return self._proxy

    @property
    def http_proxy(self) -> HttpFaultProxy:
        if self._http_proxy is None:
            raise HarnessAborted("the harness is not started")
        return self._http_proxy

    async def __aenter__(self) -> DifferentialHarness:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        from kubernetes_asyncio import client

        self._work_dir.mkdir(parents=True, exist_ok=True)
        writer_api = await self._stack.enter_async_context(api_client(self._writer_kubeconfig))
        self._core = client.CoreV1Api(writer_api)
        await self._core.create_namespace({"metadata": {"name": self.namespace}})
        if self._real_node is not None:
            self._churn = KubeletChurn(
                core=self._core,
                apps=client.AppsV1Api(writer_api),
                namespace=self.namespace,
                node=self._real_node,
                rng=self._rng,
                labels=lambda parent: {SELECT_LABEL: "in", PARENT_LABEL: parent},
                parent_label=PARENT_LABEL,
                checkpoint=self._agreed_checkpoint,
                stats=self.stats,
            )
            self._stack.push_async_callback(self._churn.aclose)
        self.stats.backend = self._backend()
        self._http_proxy = await self._stack.enter_async_context(
            HttpFaultProxy(
                kubeconfig=self._target_kubeconfig,
                name="differential-http-proxy",
                history=self.config.proxy_history,
            )
        )
        behind_http = self._http_proxy.write_kubeconfig(self._work_dir / "http-proxy.kubeconfig")
        host, port = server_address(behind_http)
        self._proxy = self._stack.enter_context(
            TcpProxy(upstream_host=host, upstream_port=port, name="differential-proxy")
        )
        proxied = proxied_kubeconfig(
            behind_http, self._work_dir / "proxied.kubeconfig", self._proxy.url
        )
        self._oracle = await self._stack.enter_async_context(
            OracleProcess(
                binary=self._oracle_binary,
                kubeconfig=proxied,
                namespace=self.namespace,
                selector=SELECTOR,
                log_path=self._work_dir / "oracle.log",
                watch_list=self.config.oracle_watch_list,
            )
        )
        self._ours = await self._stack.enter_async_context(
            self._ours_factory(
                OurLoopSettings(
                    kubeconfig=proxied,
                    namespace=self.namespace,
                    selector=SELECTOR,
                    watch_timeout_seconds=self.config.watch_timeout_seconds,
                    streaming_list=self.config.streaming_list,
                )
            )
        )
        self._log(
            f"differential: namespace {self.namespace}, clients on the {self.config.target} "
            f"apiserver through {self._proxy.url} and {self._http_proxy.url} (HTTP/1.1), "
            "writes through the other one; "
            f"oracle WatchListClient={'on' if self.config.oracle_watch_list else 'off'}, "
            f"ours streaming list={'on' if self.config.streaming_list else 'off'}; "
            f"logs in {self._work_dir}"
        )
        self._log(f"differential: pods run on {self.stats.backend}")
        if self._churn is None:
            self._log(f"differential: kubelet churn skipped: {self._real_node_unavailable}")

    def _backend(self) -> str:
        kwok = f"KWOK node {self._kwok.node_name}" if self._kwok is not None else "no KWOK node"
        if self._churn is None:
            return f"{kwok} only (no real node: {self._real_node_unavailable})"
        return f"{self._churn.backend} (kubelet churn) and {kwok}"

    @property
    def _target_kubeconfig(self) -> Path:
        return self._kubeconfig(self.config.target)

    @property
    def _writer_kubeconfig(self) -> Path:
        return self._kubeconfig("cached" if self.config.target == "uncached" else "uncached")

    def _kubeconfig(self, name: ApiServerName) -> Path:
        plane = self._plane
        return plane.cached_kubeconfig if name == "cached" else plane.uncached_kubeconfig

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
        lists_before = self._relist_counts()
        if isinstance(step, FaultKind):
            healed_at = await self._inject(step)
            if healed_at is None:
                return
        else:
            await self._apply(step)
            healed_at = None
        comparison_time = await self.checkpoint(f"{label} {step.value}", healed_at=healed_at)
        ours, oracle = self._relist_counts()
        if isinstance(step, FaultKind) and comparison_time is not None:
            self.stats.convergence.setdefault(step, []).append(comparison_time)
            self.stats.our_relists[step] += ours - lists_before[0]
            self.stats.oracle_relists[step] += oracle - lists_before[1]
            self._log(
                f"differential: {label} {step.value}: converged after {comparison_time.ours:.2f}s "
                f"(ours; reconciled {comparison_time.reconciled:.2f}s) / "
                f"{comparison_time.client_go:.2f}s (client-go), relists "
                f"{ours - lists_before[0]}/{oracle - lists_before[1]}"
            )

    # --- checkpoints -------------------------------------------------------------------------

    async def checkpoint(self, what: str, *, healed_at: float | None = None) -> Convergence | None:
        """Polls until every view matches what it should, twice in a row on the same LIST.

        Returns, after a fault, how long each client took from `healed_at` to match for good.
        """
        started = time.monotonic()
        origin = started if healed_at is None else healed_at
        deadline = started + self.config.quiesce_timeout
        matched_since: dict[str, float | None] = dict.fromkeys(("ours", "client-go", "reconciled"))
        previous_truth: View | None = None
        last: Comparison | None = None
        list_error = ""
        while True:
            self._check_alive()
            now = time.monotonic()
            try:
                comparison = await self._compare()
            except _ListFailed as err:
                list_error = str(err)
                comparison = None
            if comparison is not None:
                last = comparison
                for view, ok in (
                    ("ours", comparison.ours_matches),
                    ("client-go", comparison.oracle_matches),
                    ("reconciled", comparison.ours_matches and comparison.reconciled_matches),
                ):
                    if not ok:
                        matched_since[view] = None
                    elif matched_since[view] is None:
                        matched_since[view] = now
                if comparison.all_match and comparison.truth == previous_truth:
                    self._agreed = comparison.truth
                    break
                previous_truth = comparison.truth
            if time.monotonic() > deadline:
                self._fail_checkpoint(what, last, list_error)
            await asyncio.sleep(_POLL_INTERVAL)
        self.stats.checkpoints += 1
        await self._our_side().forget_recordings()
        if healed_at is None:
            return None
        since = {view: max(0.0, (at or origin) - origin) for view, at in matched_since.items()}
        return Convergence(
            ours=since["ours"], client_go=since["client-go"], reconciled=since["reconciled"]
        )

    def _our_side(self) -> Ours:
        if self._ours is None:
            raise HarnessAborted("the harness is not started")
        return self._ours

    async def _agreed_checkpoint(self, what: str) -> View:
        """A checkpoint; returns the fresh LIST every view agreed with."""
        await self.checkpoint(what)
        return self._agreed

    def _fail_checkpoint(self, what: str, last: Comparison | None, list_error: str) -> None:
        if last is None:
            raise HarnessAborted(
                f"{what}: no comparison could be made in {self.config.quiesce_timeout:.0f}s; "
                f"last failure: {list_error or 'none recorded'}"
            )
        self.stats.divergences += 1
        raise DivergenceError(
            f"{what}: the views did not agree within {self.config.quiesce_timeout:.0f}s "
            f"(seed {self.config.seed}, namespace {self.namespace})\n{last.describe()}"
        )

    def _check_alive(self) -> None:
        if (problem := self.proxy.failure()) is not None:
            raise HarnessAborted(f"the TCP proxy died, so no comparison can be made: {problem}")
        if (problem := self.http_proxy.failure()) is not None:
            raise HarnessAborted(f"the HTTP proxy died, so no comparison can be made: {problem}")
        if (problem := self.oracle.failure()) is not None:
            raise HarnessAborted(f"the oracle died, so no comparison can be made: {problem}")
        if (problem := self._our_side().failure()) is not None:
            raise HarnessAborted(f"our loop died, so no comparison can be made: {problem}")

    async def _compare(self) -> Comparison:
        truth = await self._fresh_list()
        ours = await self._our_views()
        try:
            snapshot = await self.oracle.snapshot()
        except OracleError as err:
            raise HarnessAborted(f"the oracle cannot be read: {err}") from err
        self._oracle_lists = snapshot.lists
        oracle = view_of(
            ((n, p.uid, p.resource_version, p.labels) for n, p in snapshot.pods.items()),
            parent_of=parent_of,
        )
        return Comparison(truth=truth, ours=ours.store, oracle=oracle, reconciled=ours.reconciled)

    async def _our_views(self) -> OurViews:
        try:
            views = await self._our_side().views()
        except OurLoopError as err:
            raise HarnessAborted(f"our loop cannot be read: {err}") from err
        self._our_lists = views.lists
        self.stored_pods = len(views.store)
        return views

    async def _fresh_list(self) -> dict[str, PodRow]:
        """A consistent LIST (resourceVersion unset) through the writers' apiserver."""
        try:
            resp = await self._core.list_namespaced_pod(
                self.namespace, label_selector=SELECTOR, _preload_content=False, _request_timeout=10
            )
            try:
                status, body = resp.status, json.loads(await resp.read())
            finally:
                resp.release()
        except Exception as err:
            raise _ListFailed(f"fresh LIST failed: {type(err).__name__}: {err}") from err
        if status != 200:
            raise _ListFailed(f"fresh LIST answered HTTP {status}: {body}")
        return view_of_json(body["items"], parent_of=parent_of)

    def _relist_counts(self) -> tuple[int, int]:
        self.stats.our_lists = self._our_lists
        self.stats.oracle_lists = self._oracle_lists
        return self.stats.our_lists, self.stats.oracle_lists

    # --- operations --------------------------------------------------------------------------

    async def _apply(self, op: OpKind, *, quiet: bool = False) -> None:
        applied = await self._operation(op)
        if applied is None:
            return
        if not quiet:
            logger.info("applied %s to %d pod(s)", op.value, applied)
        self.stats.ops[op] += 1

    async def _operation(self, op: OpKind) -> int | None:
        rng = self._rng
        if op is OpKind.CREATE:
            count = self.config.initial_pods if not self._model else rng.randint(1, 8)
            await self._gather(self._create() for _ in range(count))
            return count
        if op is OpKind.BULK_CHURN:
            return await self._bulk_churn()
        if op is OpKind.DELETE_GRACEFUL and self._kwok is None:
            self.stats.skipped[op.value] = self._kwok_unavailable
            return None
        if op in KUBELET_CHURN:
            return await self._kubelet_churn(op)
        names = self._pick(op, rng.randint(1, 5))
        if not names:
            return None
        await self._gather(self._mutate(op, name) for name in names)
        if op is OpKind.DELETE_GRACEFUL:
            await self._wait_gone(names)
        return len(names)

    async def _kubelet_churn(self, op: OpKind) -> int | None:
        churn = self._churn
        if churn is None:
            if op.value not in self.stats.skipped:
                self._log(f"differential: skipped {op.value}: {self._real_node_unavailable}")
            self.stats.skipped[op.value] = self._real_node_unavailable
            return None
        step = {
            OpKind.ENGINE_CRASH: churn.crash,
            OpKind.ENGINE_GRACEFUL_DELETE: churn.graceful_delete,
            OpKind.ENGINE_RECREATE: churn.recreate,
            OpKind.ENGINE_READINESS: churn.flip_readiness,
        }[op]
        try:
            return await step()
        except ChurnFailed as err:
            raise HarnessAborted(f"{op.value}: {err}") from err

    def _pick(self, op: OpKind, count: int) -> list[str]:
        def eligible(pod: _ModelPod) -> bool:
            if pod.terminating:
                return False
            if op is OpKind.REENTER:
                return not pod.selected
            if op is OpKind.ADOPT:
                return pod.parent is None
            if op is OpKind.DELETE_GRACEFUL:
                return pod.bound
            if op in (OpKind.LEAVE, OpKind.ORPHAN):
                return pod.selected and pod.parent is not None
            return True

        names = sorted(name for name, pod in self._model.items() if eligible(pod))
        return self._rng.sample(names, min(count, len(names)))

    def _new_parent(self, current: str | None = None) -> str:
        choices = [f"cell-{i}" for i in range(self.config.parents) if f"cell-{i}" != current]
        return self._rng.choice(choices)

    async def _create(self, *, selected: bool = True) -> str:
        self._created += 1
        name = f"p-{self._created:05d}"
        bound = self._kwok is not None and self._rng.random() < 0.5
        pod = _ModelPod(parent=self._new_parent(), selected=selected, bound=bound)
        self._model[name] = pod
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        }
        if bound and self._kwok is not None:
            spec["nodeName"] = self._kwok.node_name
        else:
            spec["schedulerName"] = UNSCHEDULED
        labels = {
            SELECT_LABEL: "in" if selected else "out",
            PARENT_LABEL: pod.parent or "",
            GEN_LABEL: "0",
        }
        await self._write(
            "create",
            name,
            self._core.create_namespaced_pod,
            self.namespace,
            {"metadata": {"name": name, "labels": labels}, "spec": spec},
        )
        return name

    async def _mutate(self, op: OpKind, name: str) -> None:
        pod = self._model[name]
        if op is OpKind.STATUS:
            await self._status_patch(name)
        elif op is OpKind.OUT_OF_RANGE_TIME:
            await self._stamp_out_of_range(name)

        elif op is OpKind.RELABEL:
            self._generation += 1
            await self._label_patch(name, {GEN_LABEL: str(self._generation)})
        elif op is OpKind.MOVE:
            pod.parent = self._new_parent(pod.parent)
            await self._label_patch(name, {PARENT_LABEL: pod.parent})
        elif op in (OpKind.LEAVE, OpKind.REENTER):
            pod.selected = op is OpKind.REENTER
            await self._label_patch(name, {SELECT_LABEL: "in" if pod.selected else "out"})
        elif op is OpKind.ORPHAN:
            pod.parent = None
            await self._label_patch(name, {PARENT_LABEL: None})
        elif op is OpKind.ADOPT:
            pod.parent = self._new_parent()
            await self._label_patch(name, {PARENT_LABEL: pod.parent})
        elif op is OpKind.DELETE_GRACEFUL:
            pod.terminating = True
            await self._delete(name, grace=self._rng.randint(1, 3))
        elif op is OpKind.DELETE_NOW:
            await self._delete(name, grace=0)
        else:
            raise ValueError(f"not a per-pod operation: {op}")

    async def _label_patch(self, name: str, labels: Mapping[str, str | None]) -> None:
        await self._write(
            "label patch",
            name,
            self._core.patch_namespaced_pod,
            name,
            self.namespace,
            {"metadata": {"labels": dict(labels)}},
            _content_type=_MERGE_PATCH,
        )

    async def _status_patch(self, name: str) -> None:
        self._generation += 1
        condition = {
            "type": PROBE_CONDITION,
            "status": "True" if self._generation % 2 else "False",
            "reason": f"Gen{self._generation}",
        }
        await self._patch_condition(name, condition)

    async def _patch_condition(self, name: str, condition: dict[str, str]) -> None:
        await self._write(
            "status patch",
            name,
            self._core.patch_namespaced_pod_status,
            name,
            self.namespace,
            {"status": {"conditions": [condition]}},
            _content_type=_MERGE_PATCH,
        )

    async def _stamp_out_of_range(self, name: str) -> None:
        """A condition whose times the apiserver accepts and a datetime cannot hold (year 0)."""
        self._generation += 1
        condition = {
            "type": STAMP_CONDITION,
            "status": "True",
            "reason": f"Gen{self._generation}",
            "lastProbeTime": OUT_OF_RANGE_TIME,
            "lastTransitionTime": OUT_OF_RANGE_TIME,
        }
        await self._patch_condition(name, condition)

    async def _delete(self, name: str, *, grace: int) -> None:
        if grace == 0:
            self._model.pop(name, None)
        await self._write(
            "delete",
            name,
            self._core.delete_namespaced_pod,
            name,
            self.namespace,
            grace_period_seconds=grace,
        )

    async def _write(
        self, what: str, name: str, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> None:
        """One write, retried while the control plane recovers from a fault.

        A retried create that finds the pod (409), or a retried delete that finds it gone (404),
        had succeeded the first time; a patch of a pod that is gone is logged and skipped.
        """
        from kubernetes_asyncio.client.exceptions import ApiException

        deadline = time.monotonic() + _WRITE_RETRY_SECONDS
        attempt = 0
        while True:
            attempt += 1
            try:
                await _raw(
                    call(*args, _request_timeout=_WRITE_TIMEOUT, _preload_content=False, **kwargs)
                )
                return
            except ApiException as err:
                if err.status == 409 and what == "create" and attempt > 1:
                    return
                if err.status == 404 and what != "create":
                    logger.warning("differential: %s of %s found no pod, skipped", what, name)
                    return
                if err.status < 500 and err.status != 429:
                    raise
                problem: Exception = err
            except (OSError, TimeoutError) as err:
                problem = err
            except Exception as err:
                if type(err).__module__.split(".")[0] != "aiohttp":
                    raise
                problem = err
            if time.monotonic() > deadline:
                raise HarnessAborted(
                    f"{what} of pod {name} kept failing for {_WRITE_RETRY_SECONDS:.0f}s: {problem}"
                ) from problem
            await asyncio.sleep(0.5)

    async def _wait_gone(self, names: Sequence[str]) -> None:
        """A graceful delete is done when KWOK deleted the pods at the end of their grace."""
        deadline = time.monotonic() + 30.0
        remaining = set(names)
        while remaining:
            if self._kwok is not None and (problem := self._kwok.failure()) is not None:
                raise HarnessAborted(f"KWOK died during a graceful delete: {problem}")
            pods = await _raw(
                self._core.list_namespaced_pod(self.namespace, _preload_content=False)
            )
            present = {pod["metadata"]["name"] for pod in pods["items"]}
            remaining &= present
            if remaining and time.monotonic() > deadline:
                raise HarnessAborted(
                    f"KWOK did not finish graceful deletion of {sorted(remaining)} in 30s"
                )
            await asyncio.sleep(0.2)
        for name in names:
            self._model.pop(name, None)

    async def _bulk_churn(self) -> int:
        size = self.config.bulk_size
        created = await self._gather(self._create() for _ in range(size))
        touched = self._rng.sample(created, size // 2)
        await self._gather(self._mutate(OpKind.RELABEL, name) for name in touched)
        moved = self._rng.sample(created, size // 4)
        await self._gather(self._mutate(OpKind.MOVE, name) for name in moved)
        doomed = self._rng.sample(created, size * 3 // 4)
        await self._gather(self._mutate(OpKind.DELETE_NOW, name) for name in doomed)
        return size + len(touched) + len(moved) + len(doomed)

    async def _gather(self, work: Iterable[Awaitable[Any]]) -> list[Any]:
        gate = asyncio.Semaphore(_WRITE_CONCURRENCY)

        async def bounded(one: Awaitable[Any]) -> Any:
            async with gate:
                return await one

        return list(await asyncio.gather(*(bounded(one) for one in work)))

    async def _ops_during_fault(self, count: int) -> None:
        light = [OpKind.RELABEL, OpKind.MOVE, OpKind.CREATE, OpKind.DELETE_NOW, OpKind.LEAVE]
        for _ in range(count):
            await self._apply(self._rng.choice(light), quiet=True)

    # --- faults ------------------------------------------------------------------------------

    async def _inject(self, fault: FaultKind) -> float | None:
        """Applies the fault and heals it; returns when it was healed, or None if skipped."""
        try:
            healed_at = await self._fault(fault)
        except FaultUnsupportedError as err:
            self.stats.skipped[fault.value] = str(err)
            self._log(f"differential: skipped {fault.value}: {err}")
            return None
        self.stats.faults[fault] += 1
        return healed_at

    async def _fault(self, fault: FaultKind) -> float:
        logger.warning("differential: injecting %s", fault.value)
        if fault is FaultKind.APISERVER_RESTART:
            return await self._restart_target_apiserver()
        if fault is FaultKind.COMPACT_410:
            return await self._compact_then_cut()
        if fault is FaultKind.ETCD_RESTART:
            return await self._stop_start_etcd()
        if fault is FaultKind.CUT_MID_FRAME:
            return await self._cut_mid_frame()
        if fault is FaultKind.SILENT:
            return await self._go_silent()
        if fault is FaultKind.CORRUPT_CHUNK:
            return await self._corrupt_chunks()
        if fault is FaultKind.DEAD_CONNECTION:
            return await self._dead_connections()
        if (answer := self._http_answer(fault)) is not None:
            return await self._answer_requests(*answer)
        return await self._reconcile_fault(fault)

    def _http_answer(self, fault: FaultKind) -> tuple[Match, Respond] | None:
        if fault is FaultKind.WATCH_500:
            return WATCH, Respond(500)
        if fault is FaultKind.CURSOR_REJECTED:
            rejections = [Respond(410, in_band=True), Respond(410), Respond(504)]
            return WATCH, self._rng.choice(rejections)
        if fault is FaultKind.THROTTLED_429:
            return Match(path=PODS), Respond(429, headers={"Retry-After": "2"})
        return None

    async def _answer_requests(self, match: Match, answer: Respond) -> float:
        """Every request `match` fits is answered `answer` for `fault_seconds` (the fresh LIST
        goes to the other apiserver, so it is spared); open watches are cut first so that every
        client has to ask again, and writes land meanwhile."""
        with self._http_fault(match, answer):
            self.proxy.cut()
            await self._ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.fault_seconds)
        return time.monotonic()

    async def _corrupt_chunks(self) -> float:
        """The next chunk of every watch response, open or opened during the fault, is half a
        frame and then a chunk-size line that is not hex, on a connection kept open; writes make
        the chunks."""
        with self._http_fault(WATCH, CorruptChunk()):
            await self._ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.fault_seconds)
        return time.monotonic()

    async def _dead_connections(self) -> float:
        """Every watch connection dies without a FIN at its next chunk: nothing more is
        forwarded and nothing closes it. After `silent_seconds` the held connections are reset,
        since client-go over the proxy's HTTP/1.1 has no health check and would wait forever."""
        with self._http_fault(WATCH, BlackHole()):
            await self._ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.silent_seconds)
        held = await self.http_proxy.reset_held()
        logger.warning("differential: reset %d dead connection(s)", held)
        return time.monotonic()

    @contextlib.contextmanager
    def _http_fault(self, match: Match, action: Action) -> Iterator[None]:
        fault = self.http_proxy.add(match, action)
        try:
            yield
        finally:
            self.http_proxy.remove(fault)

    async def _restart_target_apiserver(self) -> float:
        """Writes land while the clients' apiserver is down; healed once its port accepts."""
        restart = asyncio.create_task(
            asyncio.to_thread(self._plane.restart_apiserver, self.config.target)
        )
        address = server_address(self._target_kubeconfig)
        try:
            await self._until_accepting(address, accepting=False, unless=restart)
            await self._ops_during_fault(_IN_FAULT_OPS)
            await self._until_accepting(address, accepting=True, unless=restart)
            return time.monotonic()
        finally:
            await restart

    async def _stop_start_etcd(self) -> float:
        """No write can land while etcd is down; the writes right after it is back must arrive."""
        await asyncio.to_thread(self._plane.stop_etcd)
        try:
            await asyncio.sleep(self.config.etcd_down_seconds)
        finally:
            await asyncio.to_thread(self._plane.start_etcd)
        healed_at = time.monotonic()
        await self._ops_during_fault(_IN_FAULT_OPS)
        return healed_at

    async def _cut_mid_frame(self) -> float:
        """Cut inside the frames of a write, then write more while the clients reconnect."""
        cut = self.proxy.cut_mid_frame(idle_after=3.0)
        await self._apply(OpKind.RELABEL, quiet=True)
        report = await asyncio.wrap_future(cut)
        healed_at = time.monotonic()
        logger.warning(
            "differential: cut %d connection(s) mid-frame, %d idle", report.mid_frame, report.idle
        )
        await self._ops_during_fault(_IN_FAULT_OPS)
        return healed_at

    async def _go_silent(self) -> float:
        """Writes land while nothing is forwarded; longer than our watch's read deadline."""
        self.proxy.go_silent()
        try:
            await self._ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(self.config.silent_seconds)
        finally:
            self.proxy.resume()
        return time.monotonic()

    async def _until_accepting(
        self, address: tuple[str, int], *, accepting: bool, unless: asyncio.Task[None]
    ) -> None:
        """Returns once `address` accepts connections (or refuses them, with `accepting=False`),
        or once `unless` is done; at most 60 s."""
        deadline = time.monotonic() + 60.0
        while not unless.done() and time.monotonic() < deadline:
            if await _accepts(address) is accepting:
                return
            await asyncio.sleep(0.05)

    async def _compact_then_cut(self) -> float:
        """A real 410: make both cursors stale with writes they do not see, compact, cut, and
        write what only a relist can bring.

        The proxy is silent from before the first write until the cut, so no event or bookmark
        written meanwhile (the real node's kubelet updates the clients' pods at any time) can
        carry a cursor past the compacted revision."""
        self.proxy.go_silent()
        try:
            bystanders = await self._gather(self._create(selected=False) for _ in range(3))
            await self._gather(self._mutate(OpKind.RELABEL, name) for name in bystanders)
            revision = await asyncio.to_thread(self._plane.compact_etcd)
            cut = self.proxy.cut()
        finally:
            self.proxy.resume()
        healed_at = time.monotonic()
        logger.warning("differential: compacted etcd to %d, cut %d connection(s)", revision, cut)
        await self._ops_during_fault(_IN_FAULT_OPS)
        return healed_at

    async def _reconcile_fault(self, fault: FaultKind) -> float:
        """Reconcile sleeps or raises while writes land; the store must not care, and every parent
        must be reconciled with its final members once the fault is gone."""
        slow = fault is FaultKind.RECONCILE_SLOW
        await self._our_side().reconcile_fault(delay=0.5 if slow else 0.0, raises=not slow)
        try:
            await self._ops_during_fault(_IN_FAULT_OPS)
            await asyncio.sleep(1.5)
        finally:
            await self._our_side().reconcile_fault(delay=0.0, raises=False)
        return time.monotonic()


async def _raw(request: Awaitable[Any]) -> Any:
    """The JSON body of a `kubernetes_asyncio` call made with `_preload_content=False`, or its
    `ApiException`: the client's own models cannot read every pod the apiserver accepts (a
    year-0 timestamp fails its datetime parser)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    resp = await request
    try:
        status, body = resp.status, await resp.read()
    finally:
        resp.release()
    if not 200 <= status < 300:
        raise ApiException(status=status, reason=body[:300].decode(errors="replace"))
    return json.loads(body) if body else None


async def _accepts(address: tuple[str, int]) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*address), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


@contextlib.contextmanager
def logs_to(path: Path) -> Iterator[None]:
    """Routes the runtime's log records to `path` for the duration (warnings and up)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
