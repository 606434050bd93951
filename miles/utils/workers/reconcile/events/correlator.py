"""What becomes of each event before it is written: counted, aggregated, or skipped as spam.
Go: client-go ``tools/record/events_cache.go`` (``EventCorrelator``).

Three caches of at most 4,096 entries each, least recently used first out, in Go's order:

- the aggregator: ten events about one object that differ only in their message, each within
  600 s of the last, become one event "(combined from similar events): <message>", whose count and
  last timestamp later ones update in place;
- the logger: an event seen before (same source, object, type, reason and message) becomes a PATCH
  of the first one's count, last timestamp and message;
- the spam filter: a token bucket per source, object and type, 25 deep, refilled at one token per
  300 s; an event without a token is skipped (the logger has counted it already, so the next write
  carries the whole count).

Events are core/v1 ``Event`` JSON objects (dicts).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from miles.utils.workers.reconcile.clock import Clock

LRU_CACHE_ENTRIES = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL = 600.0
SPAM_BURST = 25
SPAM_QPS = 1.0 / 300.0
AGGREGATE_PREFIX = "(combined from similar events): "

Event = dict[str, Any]
K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Go: ``github.com/golang/groupcache/lru``: a get refreshes an entry, an add past the size
    evicts the least recently used."""

    def __init__(self, size: int = LRU_CACHE_ENTRIES) -> None:
        self._size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def add(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class TokenBucket:
    """Go: ``golang.org/x/time/rate.Limiter`` as ``flowcontrol`` uses it: starts full."""

    def __init__(self, *, qps: float, burst: int, now: float) -> None:
        self._qps, self._burst = qps, burst
        self._tokens, self._last = float(burst), now

    def try_accept(self, now: float) -> bool:
        if now > self._last:
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def _source(event: Event) -> dict[str, Any]:
    source = event.get("source")
    return source if isinstance(source, dict) else {}


def _involved(event: Event) -> dict[str, Any]:
    ref = event.get("involvedObject")
    return ref if isinstance(ref, dict) else {}


def _object_key(event: Event) -> tuple[str, ...]:
    source, ref = _source(event), _involved(event)
    return (
        str(source.get("component", "")),
        str(source.get("host", "")),
        str(ref.get("kind", "")),
        str(ref.get("namespace", "")),
        str(ref.get("name", "")),
        str(ref.get("uid", "")),
        str(ref.get("apiVersion", "")),
    )


def spam_key(event: Event) -> tuple[str, ...]:
    """Go: ``getSpamKey``: source, object and type (reason and message are not in it)."""
    return (*_object_key(event), str(event.get("type", "")))


def event_key(event: Event) -> tuple[str, ...]:
    """Go: ``getEventKey``: what makes two events the same event."""
    ref = _involved(event)
    return (
        *_object_key(event),
        str(ref.get("fieldPath", "")),
        str(event.get("type", "")),
        str(event.get("reason", "")),
        str(event.get("message", "")),
    )


def aggregate_key(event: Event) -> tuple[str, ...]:
    """Go: ``EventAggregatorByReasonFunc``: events that differ only by message."""
    return (
        *spam_key(event),
        str(event.get("reason", "")),
        str(event.get("reportingComponent", "")),
        str(event.get("reportingInstance", "")),
    )


def event_name(object_name: str, unix_nano: int) -> str:
    """Go: ``GenerateEventName``: ``<name>.<hex unix nanoseconds>``, or a UUID where that is not
    a DNS subdomain."""
    name = f"{object_name}.{unix_nano:x}"
    if len(name) > 253 or not _is_dns_subdomain(name):
        return str(uuid.uuid4())
    return name


def _is_dns_subdomain(name: str) -> bool:
    labels = name.split(".")
    return all(
        label
        and label[0].isalnum()
        and label[-1].isalnum()
        and all(c.isdigit() or ("a" <= c <= "z") or c == "-" for c in label)
        for label in labels
    )


def timestamp(unix_seconds: float) -> str:
    """Go: ``metav1.Time`` as JSON: RFC 3339 in whole seconds, UTC."""
    return datetime.fromtimestamp(int(unix_seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Aggregate:
    local_keys: set[str] = field(default_factory=set)
    last: float = float("-inf")


@dataclass(frozen=True, slots=True)
class _Observation:
    count: int
    first_timestamp: Any
    name: str
    resource_version: str


@dataclass(frozen=True, slots=True)
class Correlated:
    """Go: ``EventCorrelateResult``: the event to write, the patch when it updates one already
    written (``None``: create it), or ``skip``."""

    event: Event
    patch: dict[str, Any] | None = None
    skip: bool = False


class EventCorrelator:
    """Go: ``EventCorrelator`` with ``NewEventCorrelator``'s defaults. ``wall`` gives Unix
    seconds for the names and timestamps of aggregate events; ``clock`` times the intervals."""

    def __init__(
        self,
        *,
        clock: Clock,
        wall: Callable[[], float],
        cache_size: int = LRU_CACHE_ENTRIES,
        burst: int = SPAM_BURST,
        qps: float = SPAM_QPS,
    ) -> None:
        self._clock, self._wall = clock, wall
        self._burst, self._qps = burst, qps
        self._spam: LruCache[tuple[str, ...], TokenBucket] = LruCache(cache_size)
        self._aggregates: LruCache[tuple[str, ...], _Aggregate] = LruCache(cache_size)
        self._observed: LruCache[tuple[str, ...], _Observation] = LruCache(cache_size)

    def correlate(self, event: Event) -> Correlated:
        aggregated, key = self._aggregate(event)
        observed, patch = self._observe(aggregated, key)
        if self._is_spam(observed):
            return Correlated(event=observed, skip=True)
        return Correlated(event=observed, patch=patch)

    def update_state(self, event: Event) -> None:
        """The server's answer to a write: its name and resourceVersion for the next PATCH."""
        self._observed.add(event_key(event), _observation(event))

    def _aggregate(self, event: Event) -> tuple[Event, tuple[str, ...]]:
        now = self._clock.time()
        key = aggregate_key(event)
        record = self._aggregates.get(key)
        if record is None or now - record.last > AGGREGATE_INTERVAL:
            record = _Aggregate()
        record.local_keys.add(str(event.get("message", "")))
        record.last = now
        self._aggregates.add(key, record)
        if len(record.local_keys) < AGGREGATE_MAX_EVENTS:
            return event, event_key(event)
        record.local_keys.pop()
        wall = self._wall()
        metadata = event.get("metadata") or {}
        ref = _involved(event)
        combined: Event = {
            "metadata": {
                "name": event_name(str(ref.get("name", "")), int(wall * 1e9)),
                "namespace": metadata.get("namespace"),
            },
            "count": 1,
            "firstTimestamp": timestamp(wall),
            "lastTimestamp": timestamp(wall),
            "involvedObject": ref,
            "message": AGGREGATE_PREFIX + str(event.get("message", "")),
            "type": event.get("type"),
            "reason": event.get("reason"),
            "source": event.get("source"),
        }
        return combined, key

    def _observe(self, event: Event, key: tuple[str, ...]) -> tuple[Event, dict[str, Any] | None]:
        event = dict(event)
        last = self._observed.get(key)
        patch = None
        if last is not None and last.count > 0:
            metadata = dict(event.get("metadata") or {})
            metadata["name"] = last.name
            if last.resource_version:
                metadata["resourceVersion"] = last.resource_version
            event["metadata"] = metadata
            event["firstTimestamp"] = last.first_timestamp
            event["count"] = last.count + 1
            # Go's two-way merge patch against a copy with count 0, lastTimestamp at the epoch and
            # no message: exactly these three fields.
            patch = {
                "count": event["count"],
                "lastTimestamp": event.get("lastTimestamp"),
                "message": event.get("message"),
            }
        self._observed.add(key, _observation(event))
        return event, patch

    def _is_spam(self, event: Event) -> bool:
        now = self._clock.time()
        key = spam_key(event)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = TokenBucket(qps=self._qps, burst=self._burst, now=now)
        accepted = bucket.try_accept(now)
        self._spam.add(key, bucket)
        return not accepted


def _observation(event: Event) -> _Observation:
    metadata = event.get("metadata") or {}
    count = event.get("count")
    return _Observation(
        count=count if isinstance(count, int) else 0,
        first_timestamp=event.get("firstTimestamp"),
        name=str(metadata.get("name", "")),
        resource_version=str(metadata.get("resourceVersion") or ""),
    )
