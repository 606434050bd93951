"""Checks an interop run's record and times its takeovers.

(a) at most one candidate acting at any instant: a candidate acts from one `acting` line to the
next while they are at most `max_gap` apart. A SIGSTOPped process executes nothing, so it cannot
act while stopped, and its interval ends at its last line before the stop; what it does after
SIGCONT is a new interval, judged against the Lease as it then stands. What it cannot stop is a
request already on the wire, which the apiserver may apply while it is stopped: within a round
trip, long before its lease can run out, unless the network holds it (the cut drops held bytes, so
no stale request lands late here; only a fencing token checked where the work lands would guard
against that, and neither elector has one). A line's `t` is read just after the candidate's check
that it leads, so a stop between the two (microseconds) would show as acting past the check. An
overlap is charged to whichever candidate did not hold the Lease at the overlap's end.

(b) the Lease changes holder only through expiry or a release: a takeover of a record whose lease
had not run out (timed, as the standbys time it, from when it was seen) is early.

(c) each takeover after a fault on the holder, timed from the fault (the holder goes silent) or,
for SIGTERM, from the release. `acted_on` measures how long a faulted holder acted on.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from miles.utils.k8s_testenv.testing.leader_interop.records import (
    SIDES,
    CandidateLine,
    FaultKind,
    FaultRecord,
    LeaseRecord,
    Side,
    Timing,
    side_of,
)

ACTING_MAX_GAP = 1.0
"""Acting lines come every 100 ms; a longer gap (a stop, a starved process) ends an interval."""
EARLY_TOLERANCE = 0.25
"""Watch delivery lag on this host, between two records' receipt times."""


@dataclass(frozen=True)
class Interval:
    id: str
    start: float
    end: float


@dataclass(frozen=True)
class Overlap:
    ids: tuple[str, str]
    start: float
    end: float
    holder: str
    offenders: tuple[str, ...]


@dataclass(frozen=True)
class Unheld:
    """Acting lines of one side printed while the Lease named another holder (or none)."""

    side: Side
    lines: int
    longest: float


@dataclass(frozen=True)
class Transition:
    old: str
    new: str
    seen: float
    taken: float
    duration: int | None


@dataclass(frozen=True)
class ForeignRelease:
    holder: str
    writers: tuple[str, ...]
    t: float


@dataclass(frozen=True)
class Takeover:
    fault: FaultKind
    old: str
    new: str
    silent: float
    taken: float
    bound: float

    @property
    def latency(self) -> float:
        return self.taken - self.silent

    @property
    def route(self) -> str:
        return f"{side_of(self.old)}→{side_of(self.new)}"


@dataclass(frozen=True)
class InteropReport:
    intervals: tuple[Interval, ...]
    overlaps: tuple[Overlap, ...]
    unheld: tuple[Unheld, ...]
    early: tuple[Transition, ...]
    foreign_releases: tuple[ForeignRelease, ...]
    takeovers: tuple[Takeover, ...]
    missing: tuple[FaultRecord, ...]
    unprovoked: tuple[Transition, ...]
    acted_on: tuple[ActedOn, ...] = ()

    def failures(self, side: Side) -> list[str]:
        """What breaks the properties and is `side`'s doing."""
        found = [
            f"{o.offenders} acted {o.end - o.start:.3f}s beside {o.ids} at {o.start:.3f} "
            f"(holder {o.holder!r})"
            for o in self.overlaps
            if any(side_of(i) == side for i in o.offenders)
        ]
        found += [
            f"{t.new} took {t.old}'s lease {t.taken - t.seen:.3f}s after its last renewal "
            f"(duration {t.duration}s)"
            for t in self.early
            if side_of(t.new) == side
        ]
        found += [
            f"{t.new} took over from {t.old} {t.latency:.2f}s after the {t.fault} "
            f"(bound {t.bound:.2f}s)"
            for t in self.takeovers
            if t.latency > t.bound and side_of(t.new) == side
        ]
        return found


def acting_intervals(lines: Iterable[CandidateLine], max_gap: float) -> list[Interval]:
    by_id: dict[str, list[float]] = {}
    for line in lines:
        if line.event == "acting":
            by_id.setdefault(line.id, []).append(line.t)
    intervals = []
    for ident, times in by_id.items():
        times.sort()
        start = previous = times[0]
        for t in times[1:]:
            if t - previous > max_gap:
                intervals.append(Interval(ident, start, previous))
                start = t
            previous = t
        intervals.append(Interval(ident, start, previous))
    return sorted(intervals, key=lambda i: i.start)


def holder_at(records: Sequence[LeaseRecord], t: float) -> str:
    index = bisect.bisect_right([r.t for r in records], t)
    return records[index - 1].holder if index else ""


def overlaps(intervals: Sequence[Interval], records: Sequence[LeaseRecord]) -> list[Overlap]:
    found = []
    for i, first in enumerate(intervals):
        for second in intervals[i + 1 :]:
            if second.start > first.end:
                break
            if second.id == first.id:
                continue
            start, end = second.start, min(first.end, second.end)
            holder = holder_at(records, end)
            offenders = tuple(x for x in (first.id, second.id) if x != holder)
            found.append(Overlap((first.id, second.id), start, end, holder, offenders))
    return found


def unheld(lines: Iterable[CandidateLine], records: Sequence[LeaseRecord]) -> list[Unheld]:
    stretches: dict[Side, list[list[float]]] = {side: [] for side in SIDES}
    last: dict[str, list[float]] = {}
    for line in sorted(lines, key=lambda x: x.t):
        if line.event != "acting":
            continue
        if holder_at(records, line.t) == line.id:
            last.pop(line.id, None)
            continue
        stretch = last.get(line.id)
        if stretch is None or line.t - stretch[-1] > ACTING_MAX_GAP:
            stretch = last[line.id] = []
            stretches[side_of(line.id)].append(stretch)
        stretch.append(line.t)
    return [
        Unheld(
            side=side,
            lines=sum(map(len, found)),
            longest=max((s[-1] - s[0] for s in found), default=0.0),
        )
        for side, found in stretches.items()
    ]


def transitions(records: Sequence[LeaseRecord]) -> list[Transition]:
    """Every change to a new, non-empty holder; `seen` is the last record before it (the
    previous holder's last renewal, or the release)."""
    return [
        Transition(before.holder, after.holder, before.t, after.t, before.duration)
        for before, after in itertools.pairwise(records)
        if after.holder and after.holder != before.holder
    ]


def early_takeovers(found: Iterable[Transition]) -> list[Transition]:
    return [
        t
        for t in found
        if t.old and t.duration is not None and t.taken - t.seen < t.duration - EARLY_TOLERANCE
    ]


def foreign_releases(records: Sequence[LeaseRecord]) -> list[ForeignRelease]:
    """Releases (the holder emptied) written by a candidate other than the holder, as far as the
    field managers tell: a candidate whose user agent is its identity."""
    found = []
    for before, after in itertools.pairwise(records):
        if not before.holder or after.holder or not after.writers:
            continue
        candidates = [w for w in after.writers if w.split("-", 1)[0] in SIDES]
        if candidates and before.holder not in candidates:
            found.append(ForeignRelease(before.holder, after.writers, after.t))
    return found


def takeovers(
    faults: Iterable[FaultRecord], records: Sequence[LeaseRecord], timing: Timing
) -> tuple[list[Takeover], list[FaultRecord]]:
    found, missing = [], []
    for fault in faults:
        if not fault.holder:
            continue
        after = [r for r in records if r.t >= fault.start]
        taken = next((r for r in after if r.holder not in ("", fault.target)), None)
        if taken is None:
            missing.append(fault)
            continue
        release = next((r for r in after if r.holder == "" and r.t <= taken.t), None)
        if fault.kind == "term" and release is not None:
            silent, bound = release.t, timing.release_bound
        else:
            silent, bound = fault.start, timing.observed_bound
        found.append(Takeover(fault.kind, fault.target, taken.holder, silent, taken.t, bound))
    return found, missing


@dataclass(frozen=True)
class ActedOn:
    """How long a faulted holder acted on: after a cut, from the cut to its last acting line;
    after SIGCONT, while the Lease named another holder (an interval that starts after the stop
    began starts after SIGCONT: the first line may come before the harness has noted the time)."""

    fault: FaultKind
    target: str
    seconds: float


def acted_on(
    faults: Iterable[FaultRecord],
    intervals: Sequence[Interval],
    records: Sequence[LeaseRecord],
) -> list[ActedOn]:
    found = []
    for fault in faults:
        mine = [i for i in intervals if i.id == fault.target]
        if not fault.holder or not mine:
            continue
        if fault.kind == "cut":
            cut = [i for i in mine if i.start <= fault.start <= i.end + ACTING_MAX_GAP]
            seconds = max((i.end - fault.start for i in cut), default=0.0)
            found.append(ActedOn("cut", fault.target, max(seconds, 0.0)))
        elif fault.kind == "stop":
            resumed = [
                i
                for i in mine
                if fault.start < i.start <= fault.end + ACTING_MAX_GAP
                and holder_at(records, i.start) != fault.target
            ]
            seconds = max((i.end - i.start for i in resumed), default=0.0)
            found.append(ActedOn("stop", fault.target, seconds))
    return found


def analyse(
    lines: Sequence[CandidateLine],
    records: Sequence[LeaseRecord],
    faults: Sequence[FaultRecord],
    timing: Timing,
    until: float,
) -> InteropReport:
    """`until` is when the faults ended and the teardown began: the releases of the teardown
    are not takeovers."""
    intervals = acting_intervals(lines, ACTING_MAX_GAP)
    changes = [c for c in transitions(records) if c.taken <= until]
    found, missing = takeovers(faults, records, timing)
    explained = {(t.new, t.taken) for t in found}
    return InteropReport(
        intervals=tuple(intervals),
        overlaps=tuple(overlaps(intervals, records)),
        unheld=tuple(unheld(lines, records)),
        early=tuple(early_takeovers(changes)),
        foreign_releases=tuple(foreign_releases(records)),
        takeovers=tuple(found),
        missing=tuple(missing),
        unprovoked=tuple(c for c in changes if (c.new, c.taken) not in explained),
        acted_on=tuple(acted_on(faults, intervals, records)),
    )


ROUTES = ("ours→go", "go→ours", "ours→ours", "go→go")


def takeover_table(report: InteropReport, timing: Timing) -> str:
    """Takeover times per route, after a silent holder and after a release, side by side."""
    rows = [
        f"{'route':<10} {'after':<8} {'count':>5} {'median s':>9} {'max s':>7} {'bound s':>8}"
        f" {'over ' + format(timing.silent_bound, 'g'):>9}"
    ]
    for route in ROUTES:
        for after, kinds in (("silence", ("kill", "stop", "cut")), ("release", ("term",))):
            found = [t for t in report.takeovers if t.route == route and t.fault in kinds]
            latencies = [t.latency for t in found]
            bound = timing.observed_bound if after == "silence" else timing.release_bound
            median = f"{statistics.median(latencies):.2f}" if latencies else "-"
            longest = f"{max(latencies):.2f}" if latencies else "-"
            over = sum(t.latency > timing.silent_bound for t in found) if after == "silence" else ""
            rows.append(
                f"{route:<10} {after:<8} {len(found):>5} {median:>9} {longest:>7} "
                f"{bound:>8.2f} {over!s:>9}"
            )
    return "\n".join(rows)
