"""kubectl's pod columns: every recorded pod against the apiserver's own table row for it."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from miles.utils.workers.reconcile.cli.pod_columns import (
    age_cell,
    human_duration,
    pod_columns,
    restarts_cell,
)
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list

RECORDED = json.loads((Path(__file__).parents[1] / "wire" / "printer_pods.json").read_text())
RECORDED_AT = datetime.fromisoformat(RECORDED["recordedAt"])
ENTRIES = {entry["case"]: entry for entry in RECORDED["pods"]}
SECOND = 1.0
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def decoded(entry: dict[str, Any]) -> Any:
    """The pod as the reflector decodes it: through a LIST body, from bytes."""
    body = json.dumps({"metadata": {"resourceVersion": "1"}, "items": [entry["pod"]]}).encode()
    page, rejects = decode_pod_list(body)
    assert rejects == []
    return page.pods[0]


def same_restarts(ours: str, theirs: str) -> bool:
    """Equal, or both ``N (Ks ago)`` with K a second apart (the table was printed a moment
    before ``recordedAt`` was read)."""
    seconds = re.compile(r"(\d+) \((\d+)s ago\)")
    a, b = seconds.fullmatch(ours), seconds.fullmatch(theirs)
    if a and b:
        return a[1] == b[1] and abs(int(a[2]) - int(b[2])) <= 1
    return ours == theirs


def test_the_recording_has_pods_written_by_a_kubelet_kwok_and_through_pods_status() -> None:
    assert {entry["writer"] for entry in RECORDED["pods"]} == {"kubelet", "kwok", "pods/status"}
    kubelet = {e["kubectl"]["Status"] for e in RECORDED["pods"] if e["writer"] == "kubelet"}
    assert {"Running", "Completed", "Error", "Init:0/1", "Init:Error", "Terminating"} <= kubelet


@pytest.mark.parametrize("case", sorted(ENTRIES))
def test_columns_equal_the_apiservers_table_row(case: str) -> None:
    entry = ENTRIES[case]
    expected = entry["kubectl"]
    columns = pod_columns(decoded(entry))
    assert columns.name == expected["Name"]
    assert columns.ready == expected["Ready"]
    assert columns.status == expected["Status"]
    recorded_at = datetime.fromisoformat(entry.get("recordedAt", RECORDED["recordedAt"]))
    assert same_restarts(
        restarts_cell(columns.restarts, columns.last_restart, recorded_at),
        str(expected["Restarts"]),
    )
    assert columns.ip == expected["IP"]
    assert columns.node == expected["Node"]


def test_the_recording_covers_every_status_kubectl_computes() -> None:
    statuses = {entry["kubectl"]["Status"] for entry in RECORDED["pods"]}
    assert {
        "Pending",
        "ContainerCreating",
        "Running",
        "CrashLoopBackOff",
        "Error",
        "Completed",
        "Terminating",
        "Init:1/2",
        "Init:CrashLoopBackOff",
        "Init:ExitCode:2",
        "Evicted",
        "NotReady",
        "SchedulingGated",
        "Signal:9",
        "Unknown",
    } <= statuses


def test_age_is_the_recorded_tables_age_within_a_second() -> None:
    for entry in RECORDED["pods"]:
        recorded_at = datetime.fromisoformat(entry.get("recordedAt", RECORDED["recordedAt"]))
        age = age_cell(pod_columns(decoded(entry)).created, recorded_at)
        theirs = entry["kubectl"]["Age"]
        if age[:-1].isdigit() and theirs[:-1].isdigit():
            assert abs(int(age[:-1]) - int(theirs[:-1])) <= 1
        else:
            assert age == theirs


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-2, "<invalid>"),
        (-1.5, "0s"),
        (0, "0s"),
        (0.999, "0s"),
        (119.999, "119s"),
        (2 * MINUTE, "2m"),
        (2 * MINUTE + 1, "2m1s"),
        (4 * MINUTE + 3, "4m3s"),
        (10 * MINUTE - 0.001, "9m59s"),
        (10 * MINUTE + 1, "10m"),
        (3 * HOUR - 0.001, "179m"),
        (3 * HOUR + MINUTE, "3h1m"),
        (8 * HOUR - 0.001, "7h59m"),
        (8 * HOUR + 59 * MINUTE, "8h"),
        (2 * DAY - 0.001, "47h"),
        (2 * DAY + HOUR, "2d1h"),
        (8 * DAY - 0.001, "7d23h"),
        (8 * DAY + 23 * HOUR, "8d"),
        (2 * 365 * DAY - 0.001, "729d"),
        (2 * 365 * DAY + DAY, "2y1d"),
        (8 * 365 * DAY - 0.001, "7y364d"),
        (9 * 365 * DAY, "9y"),
    ],
)
def test_human_duration_is_apimachinerys(seconds: float, shown: str) -> None:
    """Cases from apimachinery's ``duration_test.go``."""
    assert human_duration(seconds) == shown


def test_restarts_show_how_long_ago_the_last_one_was() -> None:
    now = RECORDED_AT
    assert restarts_cell(3, now - timedelta(minutes=2, seconds=5), now) == "3 (2m5s ago)"
    assert restarts_cell(3, None, now) == "3"
    assert restarts_cell(0, now, now) == "0"
    assert age_cell(None, now) == "<unknown>"
