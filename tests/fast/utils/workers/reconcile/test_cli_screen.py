"""The live view fitted to any screen, its status line, and the ``status`` command's output."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from miles.utils.workers.reconcile import cli
from miles.utils.workers.reconcile.cli.live_view import HOME, LiveView, Terminal
from miles.utils.workers.reconcile.cli.pool_view import (
    Mark,
    ParentBlock,
    Screen,
    ShownRow,
    clip,
    fit_columns,
    member_row,
    render_screen,
)
from miles.utils.workers.reconcile.cli.status_view import (
    ConnectionTracker,
    loop_status,
    status_record,
    status_text,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.status import (
    LoopStatus,
    RetryStatus,
    SourcePhase,
    SourceStatus,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NAMES = ("NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE")


def pod(name: str, cell: str = "cell-0", restarts: int = 0) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "labels": {"cell": cell},
                "creationTimestamp": (T0 - timedelta(minutes=4, seconds=3)).isoformat(),
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "engine"}]},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "containerStatuses": [
                    {
                        "name": "engine",
                        "ready": True,
                        "restartCount": restarts,
                        "state": {"running": {}},
                    }
                ],
            },
        }
    )


def pool(parents: int, members: int) -> list[ParentBlock]:
    return [
        ParentBlock(
            f"cell-{p}",
            tuple(
                ShownRow(member_row(pod(f"engine-{p}-{m}", f"cell-{p}"))) for m in range(members)
            ),
            members,
        )
        for p in range(parents)
    ]


@pytest.mark.parametrize("width", [120, 80, 60, 40, 30, 20, 12])
def test_no_line_is_wider_than_the_screen(width: int) -> None:
    lines = render_screen(
        pool(2, 2),
        now=T0,
        screen=Screen(width=width, height=50),
        header=["a title far longer than any narrow terminal can show in one line"],
        footer=["log: warning: a long log line " * 3],
        wide=True,
    )
    assert max(len(line) for line in lines) <= width


def test_columns_drop_wide_ones_first_and_name_shrinks_last() -> None:
    rows = [member_row(pod("engine-with-a-long-name")).cells(T0, wide=True)]
    full = fit_columns(NAMES, rows, None)
    assert [NAMES[i] for i in full.keep] == list(NAMES)
    at_62 = fit_columns(NAMES, rows, 62)
    assert [NAMES[i] for i in at_62.keep] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    at_55 = fit_columns(NAMES, rows, 55)
    assert [NAMES[i] for i in at_55.keep] == ["NAME", "READY", "STATUS", "RESTARTS"]
    at_44 = fit_columns(NAMES, rows, 44)
    assert [NAMES[i] for i in at_44.keep] == ["NAME", "READY", "STATUS"]
    assert at_44.widths[0] == len("engine-with-a-long-name")
    at_24 = fit_columns(NAMES, rows, 24)
    assert [NAMES[i] for i in at_24.keep] == ["NAME", "STATUS"]
    assert at_24.widths[0] < len("engine-with-a-long-name")
    assert len(at_24.format(rows[0], Mark.CHANGED)) <= 24


def test_a_pool_taller_than_the_screen_keeps_the_header_and_counts_what_is_hidden() -> None:
    lines = render_screen(
        pool(10, 3), now=T0, screen=Screen(width=80, height=12), header=["title", "status"]
    )
    assert len(lines) == 12
    assert lines[:3] == ["title", "status", lines[2]]
    assert lines[2].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[-1] == ("... 8 more parents (24 pods) hidden: enlarge the terminal or narrow -l")
    assert "cell-1  (3 members)" in lines
    assert "cell-2  (3 members)" not in lines


def test_the_hidden_line_drops_its_hint_on_a_narrow_screen() -> None:
    lines = render_screen(pool(10, 3), now=T0, screen=Screen(width=40, height=12))
    assert lines[-1] == "... 8 more parents (24 pods) hidden"


def test_one_parent_taller_than_the_screen_shows_what_fits_of_it() -> None:
    lines = render_screen(pool(2, 30), now=T0, screen=Screen(width=80, height=10))
    assert len(lines) == 10
    assert lines[1] == "cell-0  (30 members)"
    assert len([line for line in lines if "engine-0-" in line]) == 7
    assert lines[-1].startswith("... 53 more pods hidden (1 more parent)")
    one = render_screen(pool(2, 1), now=T0, screen=Screen(width=80, height=4))
    assert one[-1].startswith("... 1 more parent (1 pod) hidden")


def test_clip_keeps_styles_out_of_the_count() -> None:
    assert clip("\x1b[1m* engine-0  Running\x1b[0m", 10) == "\x1b[1m* engine-~\x1b[0m"
    assert clip("short", 10) == "short"
    assert clip("exactly-10", 10) == "exactly-10"


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def live_view(width: int, height: int, *, styled: bool = True) -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    terminal = Terminal(live=True, styled=styled, size=lambda: (width, height))
    view = LiveView(
        stream=out, output="table", tty=True, title="t", now=FakeClock(), terminal=terminal
    )
    return view, out


def test_the_live_view_redraws_at_the_size_it_reads_each_time() -> None:
    size = [80, 24]
    out = io.StringIO()
    view = LiveView(
        stream=out,
        output="wide",
        tty=True,
        title="t",
        now=FakeClock(),
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


def source(phase: SourcePhase, **kw: Any) -> SourceStatus:
    return SourceStatus(phase=phase, **kw)


def snapshot(src: SourceStatus, taken_at: float = 100.0, **kw: Any) -> LoopStatus:
    return LoopStatus(name="ns/app=x", taken_at=taken_at, synced=True, source=src, **kw)


WALL = 1_800_000_000.0


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


def test_loop_status_reads_status_where_the_loop_has_it() -> None:
    class WithStatus:
        def status(self) -> LoopStatus:
            return snapshot(source(SourcePhase.WATCHING))

    assert loop_status(object()) is None
    status = loop_status(WithStatus())
    assert status is not None
    assert status.source.phase is SourcePhase.WATCHING


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


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["watch", "-l", "app=x"], "the following arguments are required: --parent-label"),
        (["watch", "--parent-label", "c"], "the following arguments are required: --selector/-l"),
        (["watch", "-l", "a", "--parent-label", "c", "-o", "yaml"], "invalid choice: 'yaml'"),
        (["watch", "-l", "a", "--parent-label", " "], "--parent-label is empty"),
        (["watch", "-l", "a", "--parent-label", "c", "--bogus"], "unrecognized arguments: --bogus"),
        (["status", "-l", "a", "-o", "yaml"], "invalid choice: 'yaml'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_every_bad_argument_is_one_line_and_exit_2(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("miles-reconcile")
    assert ": error: " in lines[0]
    assert problem in lines[0]
    assert lines[0].endswith("--help)") or "--parent-label is empty" in lines[0]


async def test_status_command_syncs_a_loop_and_returns_its_snapshot() -> None:
    """``miles-reconcile status``: the snapshot after the store synced; on a runtime whose loop
    has no ``status()`` yet, one line saying so."""
    from miles.utils.k8s_testenv.testing.k8s_fakes import PARENT_LABEL, FakePodApi
    from miles.utils.k8s_testenv.testing.k8s_fakes import pod as k8s_pod
    from miles.utils.workers.reconcile.cli.failures import CliError
    from miles.utils.workers.reconcile.cli.pool_loop import PoolOptions
    from miles.utils.workers.reconcile.cli.status_command import take_status
    from miles.utils.workers.reconcile.k8s_values import PodListPage
    from miles.utils.workers.reconcile.loop import ReconcileLoop

    page = PodListPage(pods=(k8s_pod("e-0", resource_version="10"),), resource_version="10")
    api = FakePodApi(lists=[page, page])
    options = PoolOptions(namespace="ns", selector="app=x", parent_label=PARENT_LABEL)
    if not hasattr(ReconcileLoop, "status"):
        with pytest.raises(CliError, match=r"has no status\(\)"):
            await take_status(options, pod_api=api, drain_seconds=0.0)
        return
    status = await take_status(options, pod_api=api, drain_seconds=0.0)
    assert status.synced
    text = status_text(status)
    assert "Watch events:       0 received, 0 applied" in text, "the listing is no watch event"
    assert "Listings:           1 applied, 1 requested (relists: none)" in text
    assert "Objects:            1 in the store" in text


def test_a_loop_that_stopped_on_its_own_says_so_in_the_status_line() -> None:
    """Where the runtime's ``LoopStatus`` reports ``stopped``/``error``, the line leads with it."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Stopped(LoopStatus):
        stopped: bool = True
        error: str | None = "reconcile-worker crashed: boom\nTraceback"

    tracker = ConnectionTracker(now=lambda: WALL)
    status = Stopped(name="n", taken_at=1.0, synced=True, source=source(SourcePhase.STOPPED))
    tracker.observe(status)
    assert tracker.line() == "loop stopped: reconcile-worker crashed: boom"
    assert "Stopped:            reconcile-worker crashed: boom" in status_text(status)


def test_the_marks_legend_shows_only_where_it_fits() -> None:
    wide, out = live_view(120, 24)
    wide.draw()
    assert out.getvalue().split(HOME)[-1].startswith("t   (* changed, - gone: 5s)")
    narrow, out = live_view(20, 24)
    narrow.draw()
    assert out.getvalue().split(HOME)[-1].startswith("t\x1b[K")


@pytest.mark.parametrize(("signum", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
async def test_a_signal_cancels_the_command_wherever_it_waits_and_runs_its_finally(
    signum: str, code: int
) -> None:
    import asyncio
    import os
    import signal

    from miles.utils.workers.reconcile.cli.signals import SignalCancel

    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("terminal restored")

    signals = SignalCancel()
    task = asyncio.create_task(signals.run(waits_forever()))
    await asyncio.sleep(0)
    os.kill(os.getpid(), getattr(signal, signum))
    assert await task == code
    assert cleaned == ["terminal restored"]
    assert not asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
