"""The loop's status as the command shows it (``cli/status_view``): the status line, the text and
JSON snapshot."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

from miles.utils.workers.reconcile.cli.status_view import (
    ConnectionTracker,
    status_record,
    status_text,
)
from miles.utils.workers.reconcile.status import (
    LoopStatus,
    RetryStatus,
    SourcePhase,
    WatchStatus,
)
from tests.fast.utils.workers.reconcile.cli.view_fakes import (
    WALL,
    snapshot,
    source,
)


def test_status_line_says_connected_reconnecting_since_and_relisting() -> None:
    tracker = ConnectionTracker(now=lambda: WALL)
    assert tracker.line() == ""
    assert not tracker.observe(snapshot(source(SourcePhase.WATCHING)))
    assert tracker.line() == "connected"
    down = source(SourcePhase.BACKING_OFF, phase_since=90.0, last_error="connection refused\nmore")
    tracker.observe(snapshot(down))
    since = datetime.fromtimestamp(WALL - 10).astimezone()
    assert tracker.line() == f"reconnecting since {since:%H:%M:%S} local: connection refused"
    tracker.observe(snapshot(source(SourcePhase.LISTING, phase_since=99.0), taken_at=101.0))
    assert tracker.line().startswith(f"reconnecting since {since:%H:%M:%S} local")
    tracker.observe(snapshot(source(SourcePhase.RELISTING, relist_reason="expired")))
    assert tracker.line() == "relisting (expired)"
    assert tracker.observe(snapshot(source(SourcePhase.WATCHING)))
    assert tracker.line() == "connected"
    tracker.observe(snapshot(source(SourcePhase.WATCHING, suspect=True)))
    assert "watch suspect" in tracker.line()


def test_status_text_and_json_carry_every_field() -> None:
    status = snapshot(
        source(
            SourcePhase.BACKING_OFF,
            phase_since=95.0,
            cursor="812",
            backoff_until=103.0,
            last_event_at=90.0,
            events=7,
            lists=2,
            relists={"expired": 1},
            last_error="410 Gone",
            last_error_at=95.0,
        ),
        events_applied=7,
        listings_applied=2,
        watch_events_applied=5,
        objects_stored=30,
        reconciles=4,
        reconcile_failures=1,
        queue_depth=2,
        retries=(RetryStatus("cell-1", 2, 104.0, "boom\ntrace"),),
    )
    text = "\n".join(status_text(status, now=lambda: WALL))
    for expected in (
        "Source:             backing off, since",
        "(5s ago)",
        "Cursor:             812",
        "Last bookmark:      never",
        "Watch events:       7 received, 5 applied",
        "Listings:           2 applied, 2 requested (relists: expired=1)",
        "Objects:            30 in the store",
        "Reconciles:         4 (1 failed)",
        "Queue depth:        2",
        "Backing off until:",
        "(in 3s)",
        "Last error:         410 Gone",
        "  cell-1: 2 failures, next at",
    ):
        assert expected in text
    assert "trace" not in text
    record = json.loads(json.dumps(status_record(status, now=lambda: WALL)))
    assert record["source"]["phase"] == "backing off"
    assert record["source"]["relists"] == {"expired": 1}
    assert record["source"]["events"] == record["source"]["watch_events_received"] == 7
    assert record["source"]["lists"] == record["source"]["listings_requested"] == 2
    assert (record["listings_applied"], record["watch_events_applied"]) == (2, 5)
    assert (record["events_applied"], record["objects_stored"]) == (7, 30)
    assert record["source"]["last_bookmark_at"] is None
    assert record["retries"][0]["parent"] == "cell-1"
    assert record["source"]["phase_since"] == (
        datetime.fromtimestamp(WALL - 5).astimezone().isoformat()
    )


def test_a_loop_that_stopped_on_its_own_says_so_in_the_status_line() -> None:
    """A ``LoopStatus`` that reports ``stopped`` with its ``error``: the line leads with it."""
    tracker = ConnectionTracker(now=lambda: WALL)
    status = LoopStatus(
        name="n",
        taken_at=1.0,
        synced=True,
        source=source(SourcePhase.STOPPED),
        stopped=True,
        error="reconcile-worker crashed: boom\nTraceback",
    )
    tracker.observe(status)
    assert tracker.line() == "loop stopped: reconcile-worker crashed: boom"
    assert "Stopped:            reconcile-worker crashed: boom" in status_text(status)


def test_a_loop_over_several_sources_shows_each_in_text_and_json() -> None:
    pods = WatchStatus(
        name="pods",
        synced=False,
        source=source(SourcePhase.BACKING_OFF, last_error="403 Forbidden"),
        objects_stored=0,
    )
    pools = WatchStatus(
        name="pools", synced=True, source=source(SourcePhase.WATCHING), objects_stored=2
    )
    status = LoopStatus(
        name="n", taken_at=1.0, synced=False, source=pools.source, sources=(pools, pods)
    )
    text = status_text(status)
    assert "Sources:            2" in text
    assert "  pools: watching, synced, 2 objects, 0 watch events" in text
    assert (
        "  pods: backing off, not synced, 0 objects, 0 watch events; last error: 403 Forbidden"
        in text
    )
    record = json.loads(json.dumps(status_record(status)))
    assert [w["name"] for w in record["sources"]] == ["pools", "pods"]
    assert record["sources"][1]["source"]["last_error"] == "403 Forbidden"
    one = dataclasses.replace(status, sources=(pools,))
    assert not any(line.startswith("Sources:") for line in status_text(one))
