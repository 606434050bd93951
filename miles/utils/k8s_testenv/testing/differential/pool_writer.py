"""The differential harness's writes to engine pools: one seeded operation on the pools it wrote
with every pod operation (creates, spec changes, status subresource writes, parent moves, leaving
and re-entering the selector, orphaning and adopting, deletes), made through the writers'
apiserver and retried as the pods' writes are.

Go counterpart: none. The choices come from a `random.Random` of their own, seeded from the run's
seed, so the pods' writes are the same as without pools and a seed replays both.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from miles.utils.k8s_testenv.testing.differential.config import SELECT_LABEL
from miles.utils.k8s_testenv.testing.differential.engine_pools import ENGINE_POOLS
from miles.utils.k8s_testenv.testing.differential.errors import HarnessAborted
from miles.utils.k8s_testenv.testing.differential.membership import Membership
from miles.utils.k8s_testenv.testing.differential.ours import PARENT_LABEL

_NAME_PREFIX = "pool-"
_TOUCH_LABEL = "miles.diff/touched"
_MERGE_PATCH = "application/merge-patch+json"
INITIAL_POOLS = 8
_REREAD_SECONDS = 60.0

WriteFn = Callable[..., Awaitable[None]]
"""`Writer.write_retried`: (what, name, call, *args, **kwargs), retried while the plane recovers."""


class PoolOp(enum.StrEnum):
    CREATE = "pool-create"
    SPEC = "pool-spec-update"
    STATUS = "pool-status-update"
    MOVE = "pool-move-parent"
    LEAVE = "pool-leave-selector"
    REENTER = "pool-reenter-selector"
    ORPHAN = "pool-drop-parent-label"
    ADOPT = "pool-restore-parent-label"
    DELETE = "pool-delete"


@dataclass
class _ModelPool:
    parent: str | None
    selected: bool
    replicas: int
    ready: int = 0


@dataclass(kw_only=True, eq=False)
class PoolWriter:
    """`await pools.step()` makes one seeded operation on an engine pool and returns it."""

    custom: Any
    """`CustomObjectsApi` on the writers' apiserver."""
    namespace: str
    parents: int
    rng: random.Random
    write: WriteFn
    _model: dict[str, _ModelPool] = field(default_factory=dict, init=False)
    _created: int = field(default=0, init=False)
    _touched: int = field(default=0, init=False)

    async def step(self) -> list[PoolOp]:
        if not self._model:
            for _ in range(INITIAL_POOLS):
                await self._create()
            return [PoolOp.CREATE] * INITIAL_POOLS
        op = self.rng.choice(list(PoolOp))
        name = self._pick(op)
        if name is None:
            op, name = PoolOp.CREATE, None
        if op is PoolOp.CREATE or name is None:
            await self._create()
            return [PoolOp.CREATE]
        await self._mutate(op, name)
        return [op]

    async def reread(self) -> None:
        """The model read again from the server (after etcd was rolled back), retried while the
        apiserver answers 429 "storage is (re)initializing" for the custom resource, as it does
        for a few seconds after its restart."""
        from kubernetes_asyncio.client.exceptions import ApiException

        deadline = time.monotonic() + _REREAD_SECONDS
        while True:
            try:
                body = await self.custom.list_namespaced_custom_object(
                    *self._args(), _request_timeout=10
                )
                break
            except ApiException as err:
                if (err.status < 500 and err.status != 429) or time.monotonic() > deadline:
                    raise HarnessAborted(f"engine pools could not be read again: {err}") from err
            except (OSError, TimeoutError) as err:
                if time.monotonic() > deadline:
                    raise HarnessAborted(f"engine pools could not be read again: {err}") from err
            await asyncio.sleep(0.5)
        self._model = {}
        for item in body["items"]:
            labels = item["metadata"].get("labels") or {}
            self._model[item["metadata"]["name"]] = _ModelPool(
                parent=labels.get(PARENT_LABEL) or None,
                selected=labels.get(SELECT_LABEL) == "in",
                replicas=(item.get("spec") or {}).get("replicas", 0),
                ready=(item.get("status") or {}).get("readyReplicas", 0),
            )

    def held(self) -> str | None:
        """A pool, drawn by the seed, that both clients' stores hold (selected, with a parent),
        or None if there is none."""
        held = sorted(
            name for name, pool in self._model.items() if pool.selected and pool.parent is not None
        )
        return self.rng.choice(held) if held else None

    async def touch(self, name: str) -> None:
        """A label write to `name` that changes nothing the model holds: one MODIFIED frame."""
        self._touched += 1
        await self._labels(name, {_TOUCH_LABEL: str(self._touched)})

    def _pick(self, op: PoolOp) -> str | None:
        def eligible(pool: _ModelPool) -> bool:
            if op is PoolOp.REENTER:
                return not pool.selected
            if op is PoolOp.ADOPT:
                return pool.parent is None
            if op in (PoolOp.LEAVE, PoolOp.ORPHAN):
                return pool.selected and pool.parent is not None
            return True

        names = sorted(name for name, pool in self._model.items() if eligible(pool))
        return self.rng.choice(names) if names else None

    def _new_parent(self, current: str | None = None) -> str:
        return self.rng.choice([f"cell-{i}" for i in range(self.parents) if f"cell-{i}" != current])

    def _args(self) -> tuple[str, str, str, str]:
        pools = ENGINE_POOLS
        return pools.group, pools.version, self.namespace, pools.plural

    async def _create(self) -> None:
        self._created += 1
        name = f"{_NAME_PREFIX}{self._created:04d}"
        pool = _ModelPool(parent=self._new_parent(), selected=True, replicas=self.rng.randint(0, 4))
        self._model[name] = pool
        body = {
            "apiVersion": ENGINE_POOLS.api_version,
            "kind": ENGINE_POOLS.kind,
            "metadata": {
                "name": name,
                "labels": {SELECT_LABEL: "in", PARENT_LABEL: pool.parent or ""},
            },
            "spec": {"replicas": pool.replicas, "engine": self.rng.choice(["sglang", "vllm"])},
        }
        await self.write(
            "create", name, self.custom.create_namespaced_custom_object, *self._args(), body
        )

    async def _mutate(self, op: PoolOp, name: str) -> None:
        pool = self._model[name]
        if op is PoolOp.SPEC:
            pool.replicas = self.rng.randint(0, 6)
            await self._patch(name, {"spec": {"replicas": pool.replicas}})
        elif op is PoolOp.STATUS:
            pool.ready = self.rng.randint(0, pool.replicas)
            await self._patch_status(name, pool.ready)
        elif (change := Membership.of(op)) is not None:
            await self._labels(name, change.apply(pool, self._new_parent))
        elif op is PoolOp.DELETE:
            del self._model[name]
            await self.write(
                "delete", name, self.custom.delete_namespaced_custom_object, *self._args(), name
            )

    async def _labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        await self._patch(name, {"metadata": {"labels": dict(labels)}})

    async def _patch(self, name: str, body: Mapping[str, Any]) -> None:
        await self.write(
            "patch",
            name,
            self.custom.patch_namespaced_custom_object,
            *self._args(),
            name,
            body,
            _content_type=_MERGE_PATCH,
        )

    async def _patch_status(self, name: str, ready: int) -> None:
        await self.write(
            "status patch",
            name,
            self.custom.patch_namespaced_custom_object_status,
            *self._args(),
            name,
            {"status": {"readyReplicas": ready}},
            _content_type=_MERGE_PATCH,
        )
