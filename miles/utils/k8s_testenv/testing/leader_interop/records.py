"""What an interop run records: candidates' lines, the Lease's history, the faults injected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Side = Literal["ours", "go"]
FaultKind = Literal["kill", "stop", "cut", "term"]
SIDES: tuple[Side, ...] = ("ours", "go")
JITTER_FACTOR = 1.2
"""client-go's `leaderelection.JitterFactor`: a retry waits RetryPeriod x [1, 1 + 1.2)."""


def identity(side: Side, slot: int, incarnation: int) -> str:
    return f"{side}-{slot}-{incarnation}"


def side_of(identity: str) -> Side:
    side = identity.split("-", 1)[0]
    if side not in SIDES:
        raise ValueError(f"identity {identity!r} names no side ({', '.join(SIDES)})")
    return "ours" if side == "ours" else "go"


@dataclass(frozen=True)
class Timing:
    """The election's durations in seconds (client-go's defaults)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    @property
    def longest_retry(self) -> float:
        return self.retry_period * (1 + JITTER_FACTOR)

    @property
    def silent_bound(self) -> float:
        """The bound asked for on a takeover after the holder goes silent: LeaseDuration +
        RetryPeriod x (1 + jitter), which leaves out the standby's own observation lag."""
        return self.lease_duration + self.longest_retry

    @property
    def observed_bound(self) -> float:
        """The bound a standby's loop guarantees: it times expiry from the first poll that sees
        the holder's last renewal, up to one jittered retry after that renewal, and takes over
        at the first poll past expiry, up to another jittered retry later."""
        return self.lease_duration + 2 * self.longest_retry

    @property
    def release_bound(self) -> float:
        """A released Lease (empty holder) is taken at a standby's next poll."""
        return self.longest_retry

    def flags(self) -> list[str]:
        return [
            f"--lease-duration={self.lease_duration:g}",
            f"--renew-deadline={self.renew_deadline:g}",
            f"--retry-period={self.retry_period:g}",
        ]


@dataclass(frozen=True)
class CandidateLine:
    """One line a candidate printed; `t` is the candidate's own clock (this host's)."""

    t: float
    id: str
    event: str
    leader: str | None

    @classmethod
    def parse(cls, raw: Any) -> CandidateLine:
        if not isinstance(raw, dict):
            raise ValueError(f"not a JSON object: {raw!r}")
        t, ident, event, leader = raw.get("t"), raw.get("id"), raw.get("event"), raw.get("leader")
        if not isinstance(t, (int, float)) or not isinstance(ident, str):
            raise ValueError(f"no numeric t or string id: {raw!r}")
        if event not in ("leading", "stopped", "new_leader", "acting"):
            raise ValueError(f"unknown event: {raw!r}")
        if leader is not None and not isinstance(leader, str):
            raise ValueError(f"leader is neither a string nor null: {raw!r}")
        return cls(t=float(t), id=ident, event=event, leader=leader)


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease as a watch delivered it, at `t` (the watcher's clock, this host's): `writers`
    are the field managers owning `spec.holderIdentity` (a candidate's user agent)."""

    t: float
    holder: str
    duration: int | None
    transitions: int | None
    resource_version: str
    writers: tuple[str, ...] = ()


@dataclass(frozen=True)
class FaultRecord:
    """A fault on `target`, from `start` to `end` (this host's clock); `holder` is whether the
    target held the Lease when it began."""

    kind: FaultKind
    target: str
    holder: bool
    start: float
    end: float
