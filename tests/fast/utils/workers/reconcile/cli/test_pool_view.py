"""The pool's rendering (``cli/pool_view``): kubectl's columns per member, parents under one header,
marks, JSON records, and the screen fitted to any size."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from miles.utils.workers.reconcile.cli.pool_view import (
    Mark,
    MemberRow,
    ParentBlock,
    Screen,
    ShownRow,
    clip,
    fit_columns,
    member_row,
    reconcile_record,
    render_screen,
)
from tests.fast.utils.workers.reconcile.cli.view_fakes import (
    T0,
    make_pod,
    pod,
)

NAMES = ("NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE")


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


def row(name: str, **changes: Any) -> MemberRow:
    return member_row(make_pod(name, **changes))


def test_member_row_reads_kubectls_columns() -> None:
    assert row("e-0", restarts=2, ready=False).cells(T0, wide=True) == (
        "e-0",
        "0/1",
        "Running",
        "2",
        "0s",
        "10.0.0.1",
        "fake-node",
    )
    assert row("e-1", deleting=True).columns.status == "Terminating"
    assert row("e-2", ip=None).columns.ip == "<none>"


def blocks_of(
    rows: dict[str, list[MemberRow]], marks: dict[str, Mark] | None = None
) -> list[ParentBlock]:
    marks = marks or {}
    return [
        ParentBlock(
            parent,
            tuple(ShownRow(r, marks.get(r.name, Mark.NONE)) for r in members),
            sum(1 for r in members if marks.get(r.name) is not Mark.GONE),
        )
        for parent, members in sorted(rows.items())
    ]


def test_render_lists_every_parent_under_one_column_header() -> None:
    snapshot = {"cell-0": [row("e-0"), row("e-1")], "cell-1": [row("e-2", cell="cell-1")]}
    lines = render_screen(blocks_of(snapshot), now=T0 + timedelta(seconds=7), screen=Screen())
    assert "cell-0  (2 members)" in lines
    assert "cell-1  (1 member)" in lines
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert "  e-0    1/1     Running   0          7s" in lines
    assert not any(line.startswith(("*", "-")) for line in lines)


def test_render_wide_adds_ip_and_node() -> None:
    lines = render_screen(blocks_of({"cell-0": [row("e-0")]}), now=T0, screen=Screen(), wide=True)
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    assert lines[2].split() == ["e-0", "1/1", "Running", "0", "0s", "10.0.0.1", "fake-node"]


def test_render_marks_changed_and_gone_rows() -> None:
    rows = {"cell-0": [row("e-0"), row("e-1"), row("e-2")]}
    lines = render_screen(
        blocks_of(rows, {"e-1": Mark.CHANGED, "e-2": Mark.GONE}), now=T0, screen=Screen()
    )
    marks = {line[2:].split()[0]: line[0] for line in lines if line[2:].startswith("e-")}
    assert marks == {"e-0": " ", "e-1": "*", "e-2": "-"}


def test_render_styles_only_on_request() -> None:
    blocks = blocks_of({"cell-0": [row("e-0")]}, {"e-0": Mark.CHANGED})
    assert not any("\x1b[" in line for line in render_screen(blocks, now=T0, screen=Screen()))
    styled = render_screen(blocks, now=T0, screen=Screen(styled=True))
    assert any(line.startswith("\x1b[1m* e-0") for line in styled)


def test_render_shows_a_parent_that_lost_every_member_as_gone() -> None:
    blocks = blocks_of({"cell-9": [row("e-0", cell="cell-9")]}, {"e-0": Mark.GONE})
    assert "cell-9  (gone)" in render_screen(blocks, now=T0, screen=Screen())
    assert render_screen([], now=T0, screen=Screen())[-1] == "(no pods)"


def test_reconcile_record_is_json_with_names_and_resource_versions() -> None:
    record = reconcile_record("cell-0", [row("e-0", rv="17", ip=None)], now=T0)
    decoded = json.loads(json.dumps(record))
    assert decoded["parent"] == "cell-0"
    assert decoded["members"] == [
        {
            "name": "e-0",
            "ready": "1/1",
            "status": "Running",
            "restarts": 0,
            "lastRestart": None,
            "created": T0.isoformat(),
            "ip": None,
            "node": "fake-node",
            "resourceVersion": "17",
            "uid": "uid-e-0",
        }
    ]
