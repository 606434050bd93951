"""The interop run's summary as text: the three checks per side, then the takeover table."""

from __future__ import annotations

import statistics
from collections import Counter

from miles.utils.k8s_testenv.testing.leader_interop.analysis import (
    InteropReport,
    takeover_table,
    transitions,
)
from miles.utils.k8s_testenv.testing.leader_interop.harness import InteropRun
from miles.utils.k8s_testenv.testing.leader_interop.records import SIDES, side_of


def render(run: InteropRun, report: InteropReport) -> str:
    timing = run.timing
    faults = Counter(
        f"{f.kind}/{side_of(f.target)}{'' if f.holder else ' (standby)'}" for f in run.faults
    )
    changes = [c for c in transitions(run.records) if c.taken <= run.until]
    expiries = [c.taken - c.seen for c in changes if c.old]
    shortest = f"; shortest after a holder's last renewal {min(expiries):.2f} s" if expiries else ""
    lines = [
        f"run: {run.until - run.started:.0f} s, LeaseDuration {timing.lease_duration:g} s, "
        f"RenewDeadline {timing.renew_deadline:g} s, RetryPeriod {timing.retry_period:g} s; "
        f"{len(run.lines)} candidate lines, {len(run.records)} Lease versions",
        "faults: " + ", ".join(f"{k} x{n}" for k, n in sorted(faults.items())),
        f"(a) acting intervals: {len(report.intervals)}; overlaps: {len(report.overlaps)}",
    ]
    for side in SIDES:
        mine = [o for o in report.overlaps if any(side_of(i) == side for i in o.offenders)]
        held = next(u for u in report.unheld if u.side == side)
        lines.append(
            f"    {side}: overlaps it caused {len(mine)}"
            + (f" (longest {max(o.end - o.start for o in mine):.3f} s)" if mine else "")
            + f"; acting lines while the Lease named another holder or none: {held.lines}"
            + (f" (longest stretch {held.longest:.3f} s)" if held.lines else "")
        )
    for side in SIDES:
        for kind, what in (
            ("cut", "after a cut"),
            ("stop", "after SIGCONT, beside the new holder"),
        ):
            found = [
                a.seconds for a in report.acted_on if a.fault == kind and side_of(a.target) == side
            ]
            if found:
                lines.append(
                    f"    {side} acted on {what}: max {max(found):.2f} s, "
                    f"median {statistics.median(found):.2f} s ({len(found)} faults)"
                )
    lines.append(
        f"(b) holder changes: {len(changes)}; early (before the old lease ran out): "
        f"{len(report.early)}"
        + shortest
        + f"; releases written by another candidate: {len(report.foreign_releases)}"
    )
    lines += [
        f"    {r.holder}'s lease emptied by {', '.join(r.writers)} at {r.t:.3f}"
        for r in report.foreign_releases
    ]
    lines.append(
        f"(c) takeovers: {len(report.takeovers)}; bound after silence "
        f"{timing.observed_bound:.2f} s (LeaseDuration + 2 x RetryPeriod x 2.2; the issue's "
        f"{timing.silent_bound:.2f} s leaves out a standby's observation lag), after a release "
        f"{timing.release_bound:.2f} s"
    )
    lines.append(takeover_table(report, timing))
    lines += [
        f"    no takeover after the {f.kind} of {f.target} at {f.start:.3f}" for f in report.missing
    ]
    lines += [
        f"    holder change without a fault: {c.old!r} → {c.new} at {c.taken:.3f}"
        for c in report.unprovoked
    ]
    exits = Counter(f"{side_of(i)} exit {code}" for i, code in run.term_exits)
    if exits:
        lines.append("SIGTERM: " + ", ".join(f"{k} x{n}" for k, n in sorted(exits.items())))
    lines += [f"problem: {p}" for p in run.problems]
    for side in SIDES:
        failures = report.failures(side)
        lines.append(f"{side}: " + ("no failure" if not failures else f"{len(failures)} failures"))
        lines += [f"    {f}" for f in failures]
    return "\n".join(lines)
