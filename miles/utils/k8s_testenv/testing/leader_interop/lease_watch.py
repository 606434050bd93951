"""Records every version of one Lease a watch delivers, with the time it arrived.

Go counterpart: a `cache.ListWatch` on `coordination.k8s.io/v1` leases with a name field selector;
the watch resumes from the last resourceVersion and lists again after a 410 or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv.client import api_client
from miles.utils.k8s_testenv.testing.leader_interop.records import LeaseRecord

_log = logging.getLogger(__name__)
_RETRY = 0.5
_WATCH_SECONDS = 240


def lease_record(raw: Any, t: float) -> LeaseRecord:
    spec = raw.get("spec") or {}
    metadata = raw.get("metadata") or {}
    writers = tuple(
        entry.get("manager", "")
        for entry in metadata.get("managedFields") or ()
        if "f:holderIdentity" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
    )
    return LeaseRecord(
        t=t,
        holder=spec.get("holderIdentity") or "",
        duration=spec.get("leaseDurationSeconds"),
        transitions=spec.get("leaseTransitions"),
        resource_version=metadata.get("resourceVersion", ""),
        writers=writers,
    )


class LeaseWatch:
    """`async with LeaseWatch(kubeconfig, namespace, name) as watch:` fills `watch.records`."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str) -> None:
        self._kubeconfig = kubeconfig
        self._namespace = namespace
        self._name = name
        self.records: list[LeaseRecord] = []
        self.relists = 0
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    async def __aenter__(self) -> LeaseWatch:
        self._task = asyncio.create_task(self._run(), name=f"lease-watch-{self._name}")
        await self._started.wait()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    @property
    def holder(self) -> str:
        return self.records[-1].holder if self.records else ""

    def _add(self, raw: Any) -> None:
        record = lease_record(raw, time.time())
        if not self.records or self.records[-1].resource_version != record.resource_version:
            self.records.append(record)

    async def _run(self) -> None:
        from kubernetes_asyncio import client, watch

        async with api_client(self._kubeconfig) as api:
            leases = client.CoordinationV1Api(api)
            selector = f"metadata.name={self._name}"
            while True:
                try:
                    listed = await leases.list_namespaced_lease(
                        self._namespace, field_selector=selector
                    )
                    for item in listed.items:
                        self._add(api.sanitize_for_serialization(item))
                    version = listed.metadata.resource_version
                    self._started.set()
                    while True:
                        stream = watch.Watch().stream(
                            leases.list_namespaced_lease,
                            self._namespace,
                            field_selector=selector,
                            resource_version=version,
                            timeout_seconds=_WATCH_SECONDS,
                        )
                        async for event in stream:
                            if event["type"] == "ERROR":
                                raise RuntimeError(f"watch error: {event['raw_object']}")
                            raw = event["raw_object"]
                            version = raw["metadata"]["resourceVersion"]
                            if event["type"] != "DELETED":
                                self._add(raw)
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    self.relists += 1
                    _log.warning("lease watch %s: %s; listing again", self._name, err)
                    await asyncio.sleep(_RETRY)
