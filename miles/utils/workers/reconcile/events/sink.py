"""The event sink over the write client: a create, or a strategic merge patch of an event.
Go: client-go ``typed/core/v1.EventSinkImpl``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from miles.utils.workers.reconcile.client.patches import Patch, StrategicMergePatch
from miles.utils.workers.reconcile.events.correlator import Event
from miles.utils.workers.reconcile.resource import EVENTS, Resource


class EventWriter(Protocol):
    """What the sink needs of ``client.Client``."""

    async def create(
        self, resource: Resource, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> Any: ...

    async def patch(
        self, resource: Resource, name: str, patch: Patch, *, namespace: str | None = None
    ) -> Any: ...


class ClientEventSink:
    """``EventSink`` through a ``client.Client`` (its errors and its retries of 429 and 5xx)."""

    def __init__(self, client: EventWriter) -> None:
        self._client = client

    async def create(self, event: Event) -> Event:
        created: Event = await self._client.create(
            EVENTS, event, namespace=event["metadata"]["namespace"]
        )
        return created

    async def patch(self, event: Event, patch: Mapping[str, Any]) -> Event:
        metadata = event["metadata"]
        patched: Event = await self._client.patch(
            EVENTS,
            metadata["name"],
            StrategicMergePatch(dict(patch)),
            namespace=metadata["namespace"],
        )
        return patched
