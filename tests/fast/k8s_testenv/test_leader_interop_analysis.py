"""Fast layer: the interop run's checks on hand-made records (no process, no apiserver)."""

from __future__ import annotations

import pytest

from bench.leader_interop import interleaved
from miles.utils.k8s_testenv.testing.leader_interop.analysis import (
    acting_intervals,
    analyse,
    foreign_releases,
    takeover_table,
)
from miles.utils.k8s_testenv.testing.leader_interop.lease_watch import lease_record
from miles.utils.k8s_testenv.testing.leader_interop.records import (
    CandidateLine,
    FaultRecord,
    LeaseRecord,
    Timing,
    side_of,
)

TIMING = Timing()


def acting(ident: str, start: float, end: float) -> list[CandidateLine]:
    count = round((end - start) / 0.1)
    return [CandidateLine(start + i * 0.1, ident, "acting", ident) for i in range(count + 1)]


def lease(t: float, holder: str, *, duration: int = 15, writer: str = "") -> LeaseRecord:
    return LeaseRecord(
        t, holder, duration, None, f"{t}", (writer or holder,) if holder or writer else ()
    )


def test_a_stop_splits_the_acting_interval_so_a_stopped_process_acts_nowhere() -> None:
    lines = acting("go-0-0", 0.0, 5.0) + acting("go-0-0", 30.0, 31.0)
    intervals = acting_intervals(lines, max_gap=1.0)
    assert [(i.start, round(i.end, 3)) for i in intervals] == [(0.0, 5.0), (30.0, 31.0)]


def test_an_overlap_is_charged_to_the_candidate_that_did_not_hold_the_lease() -> None:
    records = [lease(0.0, "go-0-0"), lease(20.0, "ours-1-0")]
    lines = (
        acting("go-0-0", 0.1, 5.0) + acting("ours-1-0", 20.1, 40.0) + acting("go-0-0", 30.0, 32.0)
    )
    fault = FaultRecord("stop", "go-0-0", True, 5.05, 30.0)
    report = analyse(lines, records, [fault], TIMING, until=50.0)
    assert [(o.offenders, round(o.end - o.start, 1)) for o in report.overlaps] == [
        (("go-0-0",), 2.0)
    ]
    assert report.failures("ours") == []
    assert len(report.failures("go")) == 1
    unheld = {u.side: u for u in report.unheld}
    assert unheld["go"].lines == 21
    assert unheld["ours"].lines == 0


def test_takeovers_are_timed_from_the_silence_or_from_the_release() -> None:
    records = [
        lease(0.0, "go-0-0"),
        lease(1.0, "go-0-0"),
        lease(18.0, "ours-1-0"),
        lease(30.0, ""),
        lease(31.5, "go-2-0"),
    ]
    faults = [
        FaultRecord("kill", "go-0-0", True, 1.5, 2.0),
        FaultRecord("term", "ours-1-0", True, 29.9, 30.1),
    ]
    report = analyse([], records, faults, TIMING, until=40.0)
    assert [(t.route, t.fault, round(t.latency, 2)) for t in report.takeovers] == [
        ("go→ours", "kill", 16.5),
        ("ours→go", "term", 1.5),
    ]
    assert report.early == ()
    assert report.unprovoked == ()
    table = takeover_table(report, TIMING)
    assert "go→ours    silence      1     16.50   16.50    23.80" in table
    assert "ours→go    release      1      1.50    1.50     4.40" in table


def test_a_takeover_of_an_unexpired_lease_is_early_and_the_takers_failure() -> None:
    records = [lease(0.0, "go-0-0"), lease(10.0, "go-0-0"), lease(20.0, "ours-1-0")]
    report = analyse([], records, [], TIMING, until=30.0)
    assert [(t.old, t.new) for t in report.early] == [("go-0-0", "ours-1-0")]
    assert [(t.old, t.new) for t in report.unprovoked] == [("go-0-0", "ours-1-0")]
    assert report.failures("ours") == [
        "ours-1-0 took go-0-0's lease 10.000s after its last renewal (duration 15s)"
    ]


def test_a_takeover_past_its_bound_and_a_fault_without_one_are_reported() -> None:
    records = [lease(0.0, "go-0-0"), lease(30.0, "ours-1-0")]
    faults = [
        FaultRecord("cut", "go-0-0", True, 1.0, 2.0),
        FaultRecord("stop", "ours-1-0", True, 40.0, 60.0),
    ]
    report = analyse([], records, faults, TIMING, until=70.0)
    assert report.failures("ours") == [
        "ours-1-0 took over from go-0-0 29.00s after the cut (bound 23.80s)"
    ]
    assert [f.target for f in report.missing] == ["ours-1-0"]


def test_a_release_written_by_another_candidate_is_foreign() -> None:
    records = [lease(0.0, "go-1-0"), lease(5.0, "", duration=1, writer="go-0-0")]
    assert [(r.holder, r.writers) for r in foreign_releases(records)] == [("go-1-0", ("go-0-0",))]
    own = [lease(0.0, "go-1-0"), lease(5.0, "", duration=1, writer="go-1-0")]
    assert foreign_releases(own) == []


def test_the_lease_record_reads_the_holder_and_its_writer_from_managed_fields() -> None:
    raw = {
        "metadata": {
            "resourceVersion": "42",
            "managedFields": [
                {"manager": "kubectl", "fieldsV1": {"f:metadata": {}}},
                {"manager": "go-0-0", "fieldsV1": {"f:spec": {"f:holderIdentity": {}}}},
            ],
        },
        "spec": {"holderIdentity": "go-0-0", "leaseDurationSeconds": 15, "leaseTransitions": 3},
    }
    assert lease_record(raw, 1.0) == LeaseRecord(1.0, "go-0-0", 15, 3, "42", ("go-0-0",))
    assert lease_record({}, 2.0).holder == ""


def test_candidate_lines_are_checked_and_identities_name_their_side() -> None:
    line = CandidateLine.parse({"t": 1, "id": "go-0-0", "event": "acting", "leader": None})
    assert line == CandidateLine(1.0, "go-0-0", "acting", None)
    bad_lines: list[object] = [[], {"t": "x", "id": "a"}, {"t": 1, "id": "a", "event": "x"}]
    for bad in bad_lines:
        with pytest.raises(ValueError, match=r"JSON object|numeric t|unknown event"):
            CandidateLine.parse(bad)
    assert side_of("ours-3-1") == "ours"
    with pytest.raises(ValueError, match="names no side"):
        side_of("rust-0-0")
    assert interleaved(2, 3) == ("ours", "go", "ours", "go", "go")


def test_the_bounds_follow_client_gos_defaults() -> None:
    assert TIMING.silent_bound == pytest.approx(19.4)
    assert TIMING.observed_bound == pytest.approx(23.8)
    assert TIMING.release_bound == pytest.approx(4.4)
    assert Timing(4, 3, 1).flags() == [
        "--lease-duration=4",
        "--renew-deadline=3",
        "--retry-period=1",
    ]


def test_how_long_a_cut_or_resumed_holder_acted_on_is_measured() -> None:
    records = [lease(0.0, "go-0-0"), lease(20.0, "ours-1-0"), lease(45.0, "go-2-0")]
    lines = acting("go-0-0", 0.1, 12.0) + acting("ours-1-0", 20.1, 30.0)
    lines += acting("ours-1-0", 51.0, 55.0)
    faults = [
        FaultRecord("cut", "go-0-0", True, 2.0, 28.0),
        FaultRecord("stop", "ours-1-0", True, 30.05, 51.0),
    ]
    report = analyse(lines, records, faults, TIMING, until=70.0)
    assert [(a.fault, a.target, round(a.seconds, 1)) for a in report.acted_on] == [
        ("cut", "go-0-0", 10.0),
        ("stop", "ours-1-0", 4.0),
    ]
    assert report.failures("ours") == []
    assert report.unheld[0].side == "ours"
    assert report.unheld[0].lines == 41
