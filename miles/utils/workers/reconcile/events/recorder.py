"""Events about objects, written to the apiserver without ever blocking a reconcile.
Go: client-go ``tools/record`` (``EventBroadcaster``, ``EventRecorder``, ``recordToSink``).

``recorder.record(obj, "Normal", "Created", "created pod x")`` is synchronous: it builds the
core/v1 Event and puts it on a queue of at most 1,000; an event that finds the queue full is
dropped and counted, and each burst of drops is one WARNING line naming the count, written when
the queue has room again (or at close). One task, owned by ``async with recorder:``, takes the
events in order, correlates them (``correlator.py``) and writes each through the ``EventSink``:
a create, or a patch of count, last timestamp and message (a patch answered 404 becomes a create).
A write that fails below HTTP is tried again, 12 tries at most, 10 s apart (the first sleep a
random part of that), holding the events behind it; an answer from the server (any HTTP status)
or an event that cannot be sent is given up at once. Leaving the block ends a retry's sleep and
writes what is queued, one try each, for at most ``close_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.events.correlator import (
    Event,
    EventCorrelator,
    event_name,
    timestamp,
)
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.tasks import first_of

logger = logging.getLogger(__name__)

MAX_TRIES_PER_EVENT = 12
SLEEP_DURATION = 10.0
MAX_QUEUED_EVENTS = 1000
DEFAULT_CLOSE_TIMEOUT = 5.0
EVENT_TYPES = frozenset({"Normal", "Warning"})
NAMESPACE_TERMINATING = "NamespaceTerminating"


class EventSink(Protocol):
    """Where events are written. Go: ``record.EventSink`` (``Create``, ``Patch``)."""

    async def create(self, event: Event) -> Event: ...

    async def patch(self, event: Event, patch: Mapping[str, Any]) -> Event: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectReference:
    """Go: ``v1.ObjectReference``, what an event is about."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    field_path: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any] | BaseModel) -> ObjectReference:
        """A reference to an object (its JSON, or a model written by alias); ``ValueError`` when
        it has no kind or name."""
        if isinstance(obj, BaseModel):
            obj = obj.model_dump(mode="json", by_alias=True, exclude_none=True)
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        api_version, kind, name = obj.get("apiVersion"), obj.get("kind"), metadata.get("name")
        if not (isinstance(kind, str) and kind and isinstance(name, str) and name):
            raise ValueError(f"an event needs an object with a kind and a name, not {obj!r:.200}")
        return cls(
            api_version=api_version if isinstance(api_version, str) else "",
            kind=kind,
            name=name,
            namespace=str(metadata.get("namespace") or ""),
            uid=str(metadata.get("uid") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
        )

    def wire(self) -> dict[str, str]:
        fields = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "resourceVersion": self.resource_version,
            "fieldPath": self.field_path,
        }
        return {key: value for key, value in fields.items() if value}


class EventRecorder:
    """Records events for one component (``source.component`` and ``reportingComponent``) on one
    host (default: this host's name). Use it as ``async with EventRecorder(...) as recorder:``."""

    def __init__(
        self,
        *,
        sink: EventSink,
        component: str,
        host: str | None = None,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
        draw: Callable[[], float] = random.random,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    ) -> None:
        if not component:
            raise ValueError("an event recorder needs a component name")
        self._sink = sink
        self._component = component
        self._host = socket.gethostname() if host is None else host
        self._clock: Clock = RealClock() if clock is None else clock
        self._wall = wall
        self._draw = draw
        self._close_timeout = positive_finite("close_timeout", close_timeout)
        self._correlator = EventCorrelator(clock=self._clock, wall=wall)
        self._queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._dropped = 0
        self.written = 0
        self.skipped = 0
        self.given_up = 0
        self.dropped = 0

    def record(
        self,
        obj: Mapping[str, Any] | BaseModel | ObjectReference,
        event_type: str,
        reason: str,
        message: str,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Queues an event about ``obj`` (its JSON or a reference) and returns at once. Go:
        ``EventRecorder.AnnotatedEventf``. A type other than Normal or Warning, or an object
        without a kind and a name, is one ERROR line and no event."""
        try:
            ref = obj if isinstance(obj, ObjectReference) else ObjectReference.of(obj)
        except ValueError as err:
            logger.error("not recording event %s %r: %s", event_type, reason, err)
            return
        if event_type not in EVENT_TYPES:
            logger.error(
                "not recording event %r about %s %s: unsupported event type %r",
                reason,
                ref.kind,
                ref.name,
                event_type,
            )
            return
        event = self._make_event(ref, annotations, event_type, reason, message)
        if self._closing:
            self._drop()
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._drop()
            return
        self._report_drops()

    async def __aenter__(self) -> EventRecorder:
        if self._task is not None:
            raise RuntimeError("an EventRecorder is entered once")
        self._task = asyncio.create_task(self._run(), name=f"event-recorder-{self._component}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._closing = True
        self._closed.set()
        task = self._task
        assert task is not None
        cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
        if not cancelled and not task.done():
            await self._flush(task)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        left = self._queue.qsize()
        if left:
            self.dropped += left
            self._dropped += left
        self._report_drops()

    async def _flush(self, task: asyncio.Task[None]) -> None:
        """Waits until the queue is written (one try each, as ``_closing`` is set) or the task
        died, for at most ``close_timeout`` on the recorder's clock."""
        await first_of(self._queue.join(), self._clock.sleep(self._close_timeout), task)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def _make_event(
        self,
        ref: ObjectReference,
        annotations: Mapping[str, str] | None,
        event_type: str,
        reason: str,
        message: str,
    ) -> Event:
        wall = self._wall()
        metadata: dict[str, Any] = {
            "name": event_name(ref.name, int(wall * 1e9)),
            "namespace": ref.namespace or "default",
        }
        if annotations:
            metadata["annotations"] = dict(annotations)
        at = timestamp(wall)
        return {
            "metadata": metadata,
            "involvedObject": ref.wire(),
            "reason": reason,
            "message": message,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
            "type": event_type,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
        }

    def _drop(self) -> None:
        self._dropped += 1
        self.dropped += 1

    def _report_drops(self) -> None:
        if self._dropped:
            logger.warning(
                "event recorder %s dropped %d events: its queue of %d was full",
                self._component,
                self._dropped,
                MAX_QUEUED_EVENTS,
            )
            self._dropped = 0

    async def _run(self) -> None:
        queue = self._queue
        while True:
            event = await queue.get()
            try:
                await self._record_to_sink(event)
            except Exception as err:
                self.given_up += 1
                logger.error("event %s not written: %r", _describe(event), err)
            finally:
                queue.task_done()

    async def _record_to_sink(self, event: Event) -> None:
        result = self._correlator.correlate(event)
        if result.skip:
            self.skipped += 1
            return
        tries = 0
        while not await self._write(result.event, result.patch):
            tries += 1
            if tries < MAX_TRIES_PER_EVENT and not self._closing:
                # Go: the first sleep is a random part of the period, so that clients restarted
                # together do not retry together.
                delay = SLEEP_DURATION * (self._draw() if tries == 1 else 1.0)
                await first_of(self._closed.wait(), self._clock.sleep(delay))
            if tries >= MAX_TRIES_PER_EVENT or self._closing:
                self.given_up += 1
                logger.error(
                    "unable to write event %s about %s after %d tries%s; giving it up",
                    _describe(result.event),
                    _about(result.event),
                    tries,
                    " (the recorder is closing)" if self._closing else "",
                )
                return

    async def _write(self, event: Event, patch: Mapping[str, Any] | None) -> bool:
        """One try; ``True`` when the event is written or given up."""
        try:
            written = await self._write_once(event, patch)
        except KubernetesApiError as err:
            self.given_up += 1
            quiet = err.code == 409 or NAMESPACE_TERMINATING in _cause_types(err)
            logger.log(
                logging.DEBUG if quiet else logging.ERROR,
                "server rejected event %s about %s (not retried): %s",
                _describe(event),
                _about(event),
                err,
            )
            return True
        except (ValueError, TypeError) as err:
            self.given_up += 1
            logger.error("unable to construct event %s (not retried): %s", _describe(event), err)
            return True
        except Exception as err:
            logger.warning(
                "unable to write event %s about %s (will retry after sleeping): %s",
                _describe(event),
                _about(event),
                err,
            )
            return False
        self._correlator.update_state(written)
        self.written += 1
        return True

    async def _write_once(self, event: Event, patch: Mapping[str, Any] | None) -> Event:
        if patch is not None and event.get("count", 1) > 1:
            try:
                return await self._sink.patch(event, patch)
            except KubernetesApiError as err:
                if err.code != 404:
                    raise
        metadata = dict(event.get("metadata") or {})
        metadata.pop("resourceVersion", None)
        return await self._sink.create({**event, "metadata": metadata})


def _cause_types(err: KubernetesApiError) -> set[str]:
    causes = getattr(err, "causes", None) or ()
    return {str(getattr(cause, "type", "") or getattr(cause, "reason", "")) for cause in causes}


def _describe(event: Event) -> str:
    metadata = event.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')} ({event.get('reason')})"


def _about(event: Event) -> str:
    ref = event.get("involvedObject") or {}
    return f"{ref.get('kind')} {ref.get('namespace', '')}/{ref.get('name')}"
