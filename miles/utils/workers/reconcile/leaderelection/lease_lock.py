"""The leader election record kept in a coordination.k8s.io/v1 Lease. Go: client-go's
``tools/leaderelection/resourcelock`` (``LeaseLock``, ``LeaderElectionRecord``).

``LeaseLock`` reads and writes the record with Go's ``Get`` / ``Create`` / ``Update``: ``update``
writes the whole Lease last read or written, its ``spec`` replaced by the record, so the apiserver
refuses it (409) when anyone wrote the Lease meanwhile. The record is read leniently: a field that
is absent or not of its type reads as Go's zero value, and a Lease whose spec has such a field is
logged once (per distinct spec), naming the Lease, the field and the value.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from miles.utils.workers.reconcile.log import NamedLogger, describe

logger = logging.getLogger(__name__)

LeaseObject = dict[str, Any]
"""A coordination.k8s.io/v1 Lease as its JSON object: ``apiVersion``, ``kind``, ``metadata``
(``name``, ``namespace``, ``resourceVersion``, ...), ``spec``."""

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
"""``LeaseSpec``'s ``leaseDurationSeconds`` and ``leaseTransitions`` are int32."""


class LeaseNotFoundError(Exception):
    """The Lease does not exist (HTTP 404)."""


class LeaseConflictError(Exception):
    """The write lost a race (HTTP 409): the Lease changed since it was read, or a create found
    it already there."""


class LeaseApi(Protocol):
    """Get, create and replace a Lease in a namespace. Go: ``LeasesGetter``'s ``Get``, ``Create``
    and ``Update``. Raises ``LeaseNotFoundError`` for a 404 and ``LeaseConflictError`` for a 409;
    any other failure as whatever exception the transport raises."""

    async def get_lease(self, *, namespace: str, name: str) -> LeaseObject: ...

    async def create_lease(self, *, namespace: str, lease: LeaseObject) -> LeaseObject: ...

    async def replace_lease(self, *, namespace: str, name: str, lease: LeaseObject) -> LeaseObject:
        """A PUT carrying ``lease['metadata']['resourceVersion']``: 409 if it is not the
        current one."""
        ...


@dataclass(frozen=True)
class LeaderElectionRecord:
    """Who holds the lease, for how long, and how often it changed hands. Go:
    ``LeaderElectionRecord``. ``holder_identity`` ``None`` or ``""``: nobody holds it (a release
    writes ``""``). Times are aware datetimes with microseconds (Go's ``MicroTime``), ``None`` where
    Go has its zero time; they are for people to read, never for deciding (the elector times
    everything by its own clock)."""

    holder_identity: str | None
    lease_duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    leader_transitions: int


def record_from_spec(spec: object) -> tuple[LeaderElectionRecord, list[str]]:
    """The record a Lease spec holds, and what in it could not be read. Go:
    ``LeaseSpecToLeaderElectionRecord``: a field absent, or here not of its type, reads as zero;
    but a holder that is not a string reads as a holder nobody is (``<unreadable: ...>``), whose
    lease is waited out, since zero would be no holder at all."""
    problems: list[str] = []
    fields: dict[str, Any] = spec if isinstance(spec, dict) else {}
    if not isinstance(spec, dict) and spec is not None:
        problems.append(f"spec is not an object: {describe(spec)}")

    def integer(key: str) -> int:
        value = fields.get(key)
        if value is None:
            return 0
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"spec.{key} is not an integer: {describe(value)}")
            return 0
        if not INT32_MIN <= value <= INT32_MAX:
            problems.append(f"spec.{key} is outside int32: {describe(value)}")
            return INT32_MAX if value > 0 else 0
        return value

    def time(key: str) -> datetime | None:
        value = fields.get(key)
        if value is None:
            return None
        parsed = parse_micro_time(value)
        if parsed is None:
            problems.append(f"spec.{key} is not a time: {describe(value)}")
        return parsed

    holder = fields.get("holderIdentity")
    if holder is not None and not isinstance(holder, str):
        problems.append(f"spec.holderIdentity is not a string: {describe(holder)}")
        holder = f"<unreadable: {describe(holder, 60)}>"
    record = LeaderElectionRecord(
        holder_identity=holder,
        lease_duration_seconds=integer("leaseDurationSeconds"),
        acquire_time=time("acquireTime"),
        renew_time=time("renewTime"),
        leader_transitions=integer("leaseTransitions"),
    )
    return record, problems


def spec_from_record(record: LeaderElectionRecord) -> dict[str, Any]:
    """The Lease spec for a record. Go: ``LeaderElectionRecordToLeaseSpec`` (holder always written,
    ``""`` for none; a zero time as null, which Go's ``MicroTime`` marshals it to)."""
    return {
        "holderIdentity": record.holder_identity or "",
        "leaseDurationSeconds": record.lease_duration_seconds,
        "acquireTime": format_micro_time(record.acquire_time),
        "renewTime": format_micro_time(record.renew_time),
        "leaseTransitions": record.leader_transitions,
    }


def parse_micro_time(value: object) -> datetime | None:
    """An RFC 3339 time with a zone as an aware UTC datetime; ``None`` for anything else (a naive
    time, a year Python cannot hold, in UTC or as written, another type)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
        return parsed.astimezone(UTC) if parsed.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None


def format_micro_time(value: datetime | None) -> str | None:
    """Go's ``MicroTime`` wire form, ``2006-01-02T15:04:05.000000Z``."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class LeaseLock:
    """The record in one Lease, for one identity. Go: ``resourcelock.LeaseLock``.

    ``get`` returns the record and the spec's canonical JSON (Go's raw record: the elector compares
    it to tell a renewal from no change). ``update`` needs a ``get`` or ``create`` before it.
    """

    def __init__(self, *, lease_api: LeaseApi, namespace: str, name: str, identity: str) -> None:
        for argument, value in (("namespace", namespace), ("name", name), ("identity", identity)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{argument} must be a non-empty str, got {value!r}")
        self._api = lease_api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._lease: LeaseObject | None = None
        self._log = NamedLogger(logger, self.describe())
        self._complained_about: bytes | None = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def get(self) -> tuple[LeaderElectionRecord, bytes]:
        lease = await self._api.get_lease(namespace=self.namespace, name=self.name)
        self._lease = lease
        spec = lease.get("spec")
        raw = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=repr).encode()
        record, problems = record_from_spec(spec)
        if problems and raw != self._complained_about:
            self._complained_about = raw
            self._log.warning(
                "Lease %s holds fields that cannot be read, read as zero: %s",
                self.describe(),
                "; ".join(problems),
            )
        return record, raw

    async def create(self, record: LeaderElectionRecord) -> None:
        lease: LeaseObject = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec_from_record(record),
        }
        self._lease = await self._api.create_lease(namespace=self.namespace, lease=lease)

    async def update(self, record: LeaderElectionRecord) -> None:
        if self._lease is None:
            raise RuntimeError("lease not initialized, call get or create first")
        lease = {
            **self._lease,
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "spec": spec_from_record(record),
        }
        self._lease = await self._api.replace_lease(
            namespace=self.namespace, name=self.name, lease=lease
        )
