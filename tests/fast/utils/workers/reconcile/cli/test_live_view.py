"""The live view (``cli/live_view``): redrawn in place on a terminal at the size it reads, printed
once then by change off one, JSON per reconcile, marks for their seconds, a reader gone."""

from __future__ import annotations

import io
import json
from datetime import timedelta

from miles.utils.workers.reconcile.cli.live_view import HOME, MARK_SECONDS, LiveView, Terminal
from miles.utils.workers.reconcile.status import (
    SourcePhase,
)
from tests.fast.utils.workers.reconcile.cli.view_fakes import (
    T0,
    Clock,
    live_view,
    make_pod,
    pod,
    snapshot,
    source,
)


def test_the_live_view_redraws_at_the_size_it_reads_each_time() -> None:
    size = [80, 24]
    out = io.StringIO()
    view = LiveView(
        stream=out,
        output="wide",
        tty=True,
        title="t",
        now=Clock(),
        terminal=Terminal(live=True, styled=False, size=lambda: (size[0], size[1])),
    )
    view.start_marking({"cell-0": [pod("engine-0")]})
    view.draw()
    wide = out.getvalue().split(HOME)[-1]
    size[:] = [30, 24]
    view.draw()
    narrow = out.getvalue().split(HOME)[-1]
    assert "node-a" in wide
    assert "node-a" not in narrow
    assert (
        max(len(line) for line in narrow.replace("\x1b[K", "").replace("\x1b[J", "").split("\n"))
        <= 30
    )


def test_terminal_of_honours_no_color_and_term_dumb() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert Terminal.of(Tty(), {"TERM": "xterm"}).styled
    assert Terminal.of(Tty(), {"TERM": "xterm"}).live
    assert not Terminal.of(Tty(), {"TERM": "xterm", "NO_COLOR": "1"}).styled
    assert Terminal.of(Tty(), {"TERM": "xterm", "NO_COLOR": "1"}).live
    dumb = Terminal.of(Tty(), {"TERM": "dumb"})
    assert (dumb.live, dumb.styled) == (False, False)
    piped = Terminal.of(io.StringIO(), {"TERM": "xterm"})
    assert (piped.live, piped.styled) == (False, False)


def test_no_color_draws_marks_without_escape_styles() -> None:
    view, out = live_view(80, 24, styled=False)
    view.start_marking({"cell-0": [pod("engine-0")]})
    view.show_parent("cell-0", [pod("engine-0", restarts=1)])
    frame = out.getvalue().split(HOME)[-1]
    assert "* engine-0" in frame
    assert "\x1b[1m" not in frame
    assert "\x1b[2m" not in frame


def test_warnings_clear_once_the_stream_is_healthy_again() -> None:
    view, out = live_view(100, 24)
    view.observe(snapshot(source(SourcePhase.WATCHING)))
    view.observe(snapshot(source(SourcePhase.BACKING_OFF, phase_since=99.0)))
    view.notes.append("warning: pod watch failed")
    view.draw()
    assert "log: warning: pod watch failed" in out.getvalue().split(HOME)[-1]
    assert "reconnecting since" in out.getvalue().split(HOME)[-1]
    view.observe(snapshot(source(SourcePhase.WATCHING)))
    view.draw()
    frame = out.getvalue().split(HOME)[-1]
    assert "log:" not in frame
    assert "connected |" in frame


def test_the_marks_legend_shows_only_where_it_fits() -> None:
    wide, out = live_view(120, 24)
    wide.draw()
    assert out.getvalue().split(HOME)[-1].startswith("t   (* changed, - gone: 5s)")
    narrow, out = live_view(20, 24)
    narrow.draw()
    assert out.getvalue().split(HOME)[-1].startswith("t\x1b[K")


def test_live_view_jsonl_prints_one_object_per_reconcile() -> None:
    out = io.StringIO()
    view = LiveView(stream=out, output="jsonl", tty=False, title="t", now=Clock())
    view.show_parent("cell-0", [make_pod("e-0"), make_pod("e-1")])
    view.show_parent("cell-0", [])
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["parent"], [m["name"] for m in r["members"]]) for r in records] == [
        ("cell-0", ["e-0", "e-1"]),
        ("cell-0", []),
    ]


def test_live_view_json_prints_indented_objects() -> None:
    out = io.StringIO()
    view = LiveView(stream=out, output="json", tty=False, title="t", now=Clock())
    view.show_parent("cell-0", [make_pod("e-0")])
    assert out.getvalue().startswith('{\n  "time"')
    assert json.loads(out.getvalue())["members"][0]["name"] == "e-0"


def test_live_view_on_a_terminal_redraws_in_place() -> None:
    out = io.StringIO()
    view = LiveView(stream=out, output="table", tty=True, title="t", now=Clock())
    view.show_parent("cell-0", [make_pod("e-0")])
    view.show_parent("cell-1", [make_pod("e-1", cell="cell-1")])
    frames = out.getvalue().split(HOME)[1:]
    assert len(frames) == 2
    assert "e-0" in frames[1]
    assert "e-1" in frames[1]


def test_live_view_off_a_terminal_prints_the_sync_once_then_only_what_changed() -> None:
    out = io.StringIO()
    view = LiveView(stream=out, output="table", tty=False, title="t", now=Clock())
    view.show_parent("cell-0", [make_pod("e-0")])
    assert out.getvalue() == ""
    view.start_marking({"cell-0": [make_pod("e-0"), make_pod("e-1")]})
    synced = out.getvalue()
    view.show_parent("cell-0", [make_pod("e-0", restarts=1)])
    view.show_parent("cell-0", [make_pod("e-0", restarts=1)])
    changes = out.getvalue()[len(synced) :].splitlines()
    assert "\x1b" not in out.getvalue()
    assert "cell-0  (2 members)" in synced
    assert [line.split()[:3] for line in changes] == [
        ["*", "cell-0", "e-0"],
        ["-", "cell-0", "e-1"],
    ]
    assert changes[0].split()[3:] == ["1/1", "Running", "1", "0s"]


def test_live_view_does_not_mark_the_initial_sync() -> None:
    """The synced store is the baseline: the initial reconciles that follow draw unmarked."""
    out = io.StringIO()
    view = LiveView(stream=out, output="table", tty=True, title="t", now=Clock())
    view.start_marking({"cell-0": [make_pod("e-0")], "cell-1": [make_pod("e-1", cell="cell-1")]})
    view.show_parent("cell-0", [make_pod("e-0")])
    view.show_parent("cell-1", [make_pod("e-1", cell="cell-1")])
    view.show_parent("cell-2", [make_pod("e-2", cell="cell-2")])
    last = out.getvalue().split(HOME)[-1]
    assert "* e-0" not in last
    assert "* e-1" not in last
    assert "* e-2" in last


def test_a_mark_stays_for_its_seconds_whatever_reconciles_follow() -> None:
    """A changed row and a pod that left stay marked for MARK_SECONDS after the reconcile that
    saw them, through later reconciles of the same parent, and no longer."""
    out = io.StringIO()
    clock = Clock()
    view = LiveView(stream=out, output="table", tty=True, title="t", now=clock)
    view.start_marking({"cell-0": [make_pod("e-0"), make_pod("e-1")]})
    view.show_parent("cell-0", [make_pod("e-0", restarts=1)])
    for _ in range(3):
        clock.now += timedelta(seconds=1)
        view.show_parent("cell-0", [make_pod("e-0", restarts=1)])
    last = out.getvalue().split(HOME)[-1]
    assert "* e-0" in last
    assert "- e-1" in last
    clock.now = T0 + timedelta(seconds=MARK_SECONDS)
    view.draw()
    last = out.getvalue().split(HOME)[-1]
    assert "* e-0" not in last
    assert "e-1" not in last


def test_live_view_stops_writing_and_reports_once_when_the_reader_goes_away() -> None:
    """``watch -o jsonl | head -1``: a broken pipe stops the command, not every reconcile."""

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    closed: list[bool] = []
    view = LiveView(
        stream=ClosedPipe(),
        output="jsonl",
        tty=False,
        title="t",
        now=Clock(),
        on_output_closed=lambda: closed.append(True),
    )
    view.show_parent("cell-0", [make_pod("e-0")])
    view.show_parent("cell-0", [make_pod("e-0")])
    assert view.output_closed
    assert closed == [True]


def test_off_a_terminal_draw_prints_only_caption_lines_not_printed_yet() -> None:
    out = io.StringIO()
    view = LiveView(stream=out, output="table", tty=False, title="t", now=Clock())
    view.start_marking({})
    before = out.getvalue()
    view.caption = ["step 1/2: scale-up"]
    view.draw()
    view.draw()
    view.caption = ["step 1/2: scale-up", "verdict: match"]
    view.draw()
    assert out.getvalue()[len(before) :].splitlines() == ["step 1/2: scale-up", "verdict: match"]
