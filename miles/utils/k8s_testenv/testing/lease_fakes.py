"""An in-memory ``LeaseApi``: Leases with resourceVersions, 404 and 409 as an apiserver answers
them, an apiserver that is down, and edits by someone else."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

from miles.utils.workers.reconcile.leaderelection.lease_lock import (
    LeaseConflictError,
    LeaseNotFoundError,
    LeaseObject,
)


@dataclass
class FakeLeaseApi:
    """Leases by ``(namespace, name)``. ``down`` makes every call raise ``ConnectionError``.
    ``writes`` lists each successful create or replace as ``(namespace, name, spec)``; ``calls``
    counts every call."""

    leases: dict[tuple[str, str], LeaseObject] = field(default_factory=dict)
    down: bool = False
    writes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    calls: int = 0
    _version: int = 0

    async def get_lease(self, *, namespace: str, name: str) -> LeaseObject:
        await self._enter()
        lease = self.leases.get((namespace, name))
        if lease is None:
            raise LeaseNotFoundError(f"leases.coordination.k8s.io {name!r} not found")
        return copy.deepcopy(lease)

    async def create_lease(self, *, namespace: str, lease: LeaseObject) -> LeaseObject:
        await self._enter()
        name = lease["metadata"]["name"]
        if (namespace, name) in self.leases:
            raise LeaseConflictError(f"leases.coordination.k8s.io {name!r} already exists")
        return self._store(namespace, name, copy.deepcopy(lease))

    async def replace_lease(self, *, namespace: str, name: str, lease: LeaseObject) -> LeaseObject:
        await self._enter()
        current = self.leases.get((namespace, name))
        if current is None:
            raise LeaseNotFoundError(f"leases.coordination.k8s.io {name!r} not found")
        sent = lease.get("metadata", {}).get("resourceVersion")
        if sent != current["metadata"]["resourceVersion"]:
            raise LeaseConflictError(
                f"Operation cannot be fulfilled on leases.coordination.k8s.io {name!r}: the object"
                " has been modified; please apply your changes to the latest version and try again"
            )
        return self._store(namespace, name, copy.deepcopy(lease))

    def edit(self, namespace: str, name: str, **spec: Any) -> None:
        """Someone else writes these spec fields (camelCase), bumping the resourceVersion."""
        lease = self.leases[(namespace, name)]
        lease["spec"] = {**(lease.get("spec") or {}), **spec}
        self._version += 1
        lease["metadata"]["resourceVersion"] = str(self._version)

    def spec(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.leases[(namespace, name)].get("spec") or {})

    async def _enter(self) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.down:
            raise ConnectionError("apiserver unreachable")

    def _store(self, namespace: str, name: str, lease: LeaseObject) -> LeaseObject:
        self._version += 1
        lease.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.leases[(namespace, name)] = lease
        self.writes.append((namespace, name, copy.deepcopy(lease.get("spec") or {})))
        return copy.deepcopy(lease)
