"""The differential harness's writes: seeded operations on the pods it wrote, made through the
writers' apiserver and retried while the control plane recovers from a fault.

Go counterpart: none. Every choice comes from the harness's `random.Random(seed)` over its own model
of the pods it wrote, never from reads, so a seed replays the same writes in the same order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from miles.utils.k8s_testenv.kwok import Kwok
from miles.utils.k8s_testenv.testing.differential.config import SELECT_LABEL, HarnessConfig, LogFn
from miles.utils.k8s_testenv.testing.differential.errors import HarnessAborted
from miles.utils.k8s_testenv.testing.differential.kubelet_churn import ChurnFailed, KubeletChurn
from miles.utils.k8s_testenv.testing.differential.membership import Membership
from miles.utils.k8s_testenv.testing.differential.ours import PARENT_LABEL
from miles.utils.k8s_testenv.testing.differential.pool_writer import PoolWriter
from miles.utils.k8s_testenv.testing.differential.scenario import KUBELET_CHURN, OpKind
from miles.utils.k8s_testenv.testing.differential.stats import Stats

logger = logging.getLogger(__name__)

GEN_LABEL = "miles.diff/gen"
_NAME_PREFIX = "p-"
PROBE_CONDITION = "miles.diff/Probe"
STAMP_CONDITION = "miles.diff/Stamp"
UNSCHEDULED = "miles-diff-unscheduled"
"""The scheduler name of the pods bound to no node: no scheduler serves it, so where the plane
runs kube-scheduler (the real node) they stay Pending and unbound, as on a plane without one."""
OUT_OF_RANGE_TIME = "0000-01-01T00:00:00Z"
"""Accepted by the apiserver (Go's `time.Time` holds year 0), out of range for Python's datetime."""

_WRITE_CONCURRENCY = 16
_MERGE_PATCH = "application/strategic-merge-patch+json"
_WRITE_TIMEOUT = 10.0
_WRITE_RETRY_SECONDS = 60.0


@dataclass
class _ModelPod:
    """What the harness last wrote about a pod; choices are made from this, never from reads."""

    parent: str | None
    selected: bool
    bound: bool
    terminating: bool = False


def _model_of(item: Mapping[str, Any]) -> _ModelPod:
    labels = item["metadata"].get("labels") or {}
    return _ModelPod(
        parent=labels.get(PARENT_LABEL) or None,
        selected=labels.get(SELECT_LABEL) == "in",
        bound=bool(item.get("spec", {}).get("nodeName")),
        terminating="deletionTimestamp" in item["metadata"],
    )


def pod_labels(parent: str) -> dict[str, str]:
    """The labels that put a pod under `parent` and inside the clients' selector."""
    return {SELECT_LABEL: "in", PARENT_LABEL: parent}


@dataclass(kw_only=True, eq=False)
class Writer:
    """`await writer.apply(op)` makes one seeded operation; `create`, `mutate` and `gather` are
    its parts, for the faults that write while they last."""

    core: Any
    namespace: str
    config: HarnessConfig
    rng: random.Random
    stats: Stats
    kwok: Kwok | None
    kwok_unavailable: str
    churn: KubeletChurn | None
    churn_unavailable: str
    log: LogFn
    pools: PoolWriter | None = None
    """Engine pools written beside the pods: one seeded pool operation with each pod operation."""
    _model: dict[str, _ModelPod] = field(default_factory=dict, init=False)
    _created: int = field(default=0, init=False)
    _generation: int = field(default=0, init=False)

    async def apply(self, op: OpKind, *, quiet: bool = False) -> None:
        applied = await self._operation(op)
        if self.pools is not None:
            self.stats.pool_ops.update(await self.pools.step())
        if applied is None:
            return
        if not quiet:
            logger.info("applied %s to %d pod(s)", op.value, applied)
        self.stats.ops[op] += 1

    async def ops_during_fault(self, count: int) -> None:
        light = [OpKind.RELABEL, OpKind.MOVE, OpKind.CREATE, OpKind.DELETE_NOW, OpKind.LEAVE]
        for _ in range(count):
            await self.apply(self.rng.choice(light), quiet=True)

    async def gather(self, work: Iterable[Awaitable[Any]]) -> list[Any]:
        gate = asyncio.Semaphore(_WRITE_CONCURRENCY)

        async def bounded(one: Awaitable[Any]) -> Any:
            async with gate:
                return await one

        return list(await asyncio.gather(*(bounded(one) for one in work)))

    async def create(self, *, selected: bool = True) -> str:
        self._created += 1
        name = f"{_NAME_PREFIX}{self._created:05d}"
        bound = self.kwok is not None and self.rng.random() < 0.5
        pod = _ModelPod(parent=self._new_parent(), selected=selected, bound=bound)
        self._model[name] = pod
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        }
        if bound and self.kwok is not None:
            spec["nodeName"] = self.kwok.node_name
        else:
            spec["schedulerName"] = UNSCHEDULED
        labels = {
            SELECT_LABEL: "in" if selected else "out",
            PARENT_LABEL: pod.parent or "",
            GEN_LABEL: "0",
        }
        await self.write_retried(
            "create",
            name,
            self.core.create_namespaced_pod,
            self.namespace,
            {"metadata": {"name": name, "labels": labels}, "spec": spec},
        )
        return name

    async def mutate(self, op: OpKind, name: str) -> None:
        pod = self._model[name]
        if op is OpKind.STATUS:
            await self._status_patch(name)
        elif op is OpKind.OUT_OF_RANGE_TIME:
            await self._stamp_out_of_range(name)
        elif op is OpKind.RELABEL:
            self._generation += 1
            await self._label_patch(name, {GEN_LABEL: str(self._generation)})
        elif (change := Membership.of(op)) is not None:
            await self._label_patch(name, change.apply(pod, self._new_parent))
        elif op is OpKind.DELETE_GRACEFUL:
            pod.terminating = True
            await self._delete(name, grace=self.rng.randint(1, 3))
        elif op is OpKind.DELETE_NOW:
            await self._delete(name, grace=0)
        else:
            raise ValueError(f"not a per-pod operation: {op}")

    def held_pod(self) -> str | None:
        """A pod, drawn by the seed, that both clients' stores hold (selected, with a parent,
        not terminating), or None if there is none."""
        held = sorted(
            name
            for name, pod in self._model.items()
            if pod.selected and pod.parent is not None and not pod.terminating
        )
        return self.rng.choice(held) if held else None

    async def reread(self) -> None:
        """The model read again from the server, for after etcd was rolled back: what the
        harness last wrote is then no longer what is there."""
        body = await _raw(self.core.list_namespaced_pod(self.namespace, _preload_content=False))
        self._model = {
            item["metadata"]["name"]: _model_of(item)
            for item in body["items"]
            if item["metadata"]["name"].startswith(_NAME_PREFIX)
        }
        if self.pools is not None:
            await self.pools.reread()

    async def _operation(self, op: OpKind) -> int | None:
        rng = self.rng
        if op is OpKind.CREATE:
            count = self.config.initial_pods if not self._model else rng.randint(1, 8)
            await self.gather(self.create() for _ in range(count))
            return count
        if op is OpKind.BULK_CHURN:
            return await self._bulk_churn()
        if op is OpKind.DELETE_GRACEFUL and self.kwok is None:
            self.stats.skipped[op.value] = self.kwok_unavailable
            return None
        if op in KUBELET_CHURN:
            return await self._kubelet_churn(op)
        names = self._pick(op, rng.randint(1, 5))
        if not names:
            return None
        await self.gather(self.mutate(op, name) for name in names)
        if op is OpKind.DELETE_GRACEFUL:
            await self._wait_gone(names)
        return len(names)

    async def _kubelet_churn(self, op: OpKind) -> int | None:
        churn = self.churn
        if churn is None:
            if op.value not in self.stats.skipped:
                self.log(f"differential: skipped {op.value}: {self.churn_unavailable}")
            self.stats.skipped[op.value] = self.churn_unavailable
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
        return self.rng.sample(names, min(count, len(names)))

    def _new_parent(self, current: str | None = None) -> str:
        choices = [f"cell-{i}" for i in range(self.config.parents) if f"cell-{i}" != current]
        return self.rng.choice(choices)

    async def _bulk_churn(self) -> int:
        size = self.config.bulk_size
        created = await self.gather(self.create() for _ in range(size))
        touched = self.rng.sample(created, size // 2)
        await self.gather(self.mutate(OpKind.RELABEL, name) for name in touched)
        moved = self.rng.sample(created, size // 4)
        await self.gather(self.mutate(OpKind.MOVE, name) for name in moved)
        doomed = self.rng.sample(created, size * 3 // 4)
        await self.gather(self.mutate(OpKind.DELETE_NOW, name) for name in doomed)
        return size + len(touched) + len(moved) + len(doomed)

    async def _label_patch(self, name: str, labels: Mapping[str, str | None]) -> None:
        await self.write_retried(
            "label patch",
            name,
            self.core.patch_namespaced_pod,
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

    async def _patch_condition(self, name: str, condition: dict[str, str]) -> None:
        await self.write_retried(
            "status patch",
            name,
            self.core.patch_namespaced_pod_status,
            name,
            self.namespace,
            {"status": {"conditions": [condition]}},
            _content_type=_MERGE_PATCH,
        )

    async def _delete(self, name: str, *, grace: int) -> None:
        if grace == 0:
            self._model.pop(name, None)
        await self.write_retried(
            "delete",
            name,
            self.core.delete_namespaced_pod,
            name,
            self.namespace,
            grace_period_seconds=grace,
        )

    async def write_retried(
        self, what: str, name: str, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> None:
        """One write, retried while the control plane recovers from a fault.

        A retried create that finds the object (409), or a retried delete that finds it gone
        (404), had succeeded the first time; a patch of an object that is gone is logged and
        skipped.
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
                    logger.warning("differential: %s of %s found nothing, skipped", what, name)
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
                    f"{what} of {name} kept failing for {_WRITE_RETRY_SECONDS:.0f}s: {problem}"
                ) from problem
            await asyncio.sleep(0.5)

    async def _wait_gone(self, names: Sequence[str]) -> None:
        """A graceful delete is done when KWOK deleted the pods at the end of their grace."""
        deadline = time.monotonic() + 30.0
        remaining = set(names)
        while remaining:
            if self.kwok is not None and (problem := self.kwok.failure()) is not None:
                raise HarnessAborted(f"KWOK died during a graceful delete: {problem}")
            pods = await _raw(self.core.list_namespaced_pod(self.namespace, _preload_content=False))
            present = {pod["metadata"]["name"] for pod in pods["items"]}
            remaining &= present
            if remaining and time.monotonic() > deadline:
                raise HarnessAborted(
                    f"KWOK did not finish graceful deletion of {sorted(remaining)} in 30s"
                )
            await asyncio.sleep(0.2)
        for name in names:
            self._model.pop(name, None)


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
