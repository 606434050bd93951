"""The ``miles-reconcile`` CLI without a cluster: pure rendering, JSON lines, one-line errors."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import PARENT_LABEL, FakePodApi
from miles.utils.k8s_testenv.testing.k8s_fakes import pod as k8s_pod
from miles.utils.workers.reconcile import cli
from miles.utils.workers.reconcile.cli.failures import describe_failure
from miles.utils.workers.reconcile.cli.live_view import HOME, MARK_SECONDS, LiveView
from miles.utils.workers.reconcile.cli.pool_loop import (
    PoolOptions,
    empty_selection_note,
    parent_label_map,
)
from miles.utils.workers.reconcile.cli.pool_view import (
    Mark,
    MemberRow,
    ParentBlock,
    Screen,
    ShownRow,
    member_row,
    reconcile_record,
    render_screen,
)
from miles.utils.workers.reconcile.cli.watch_command import watch_pool
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConnectionError,
)
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import PodListPage, PodWatchEvent
from tests.fast.utils.workers.reconcile.fakes import run_until

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def make_pod(
    name: str,
    *,
    cell: str = "cell-0",
    phase: str = "Running",
    ready: bool = True,
    restarts: int = 0,
    ip: str | None = "10.0.0.1",
    rv: str = "1",
    deleting: bool = False,
) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": f"uid-{name}",
                "resourceVersion": rv,
                "labels": {"cell": cell, "app": "engine"},
                "creationTimestamp": T0.isoformat(),
                "deletionTimestamp": T0.isoformat() if deleting else None,
            },
            "spec": {"nodeName": "fake-node", "containers": [{"name": "engine"}]},
            "status": {
                "phase": phase,
                "podIP": ip,
                "containerStatuses": [
                    {
                        "name": "engine",
                        "ready": ready,
                        "restartCount": restarts,
                        "state": {"running": {}},
                    }
                ],
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


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


def test_parent_label_map_names_the_cell_or_nothing() -> None:
    key_map = parent_label_map("cell")
    assert key_map(make_pod("e-0", cell="cell-3")) == "cell-3"
    assert key_map(make_pod("e-0", cell="")) is None


def test_empty_selection_note_says_what_matched_nothing() -> None:
    options = PoolOptions(namespace="ns", selector="app=x", parent_label="cell")
    assert "no pods in namespace 'ns' match selector 'app=x'" in empty_selection_note(options, 0)
    assert "none carries label 'cell'" in empty_selection_note(options, 3)


def test_failures_become_one_line() -> None:
    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config.config_exception import ConfigException

    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = json.dumps(
        {"kind": "Status", "message": 'pods is forbidden: User "x"'}
    ).encode()
    assert describe_failure(forbidden) == 'forbidden by RBAC: pods is forbidden: User "x"'
    assert describe_failure(ConfigException("Invalid kube-config file.")) == (
        "kubeconfig: Invalid kube-config file."
    )
    key = ConnectionKey("127.0.0.1", 1, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))
    assert (
        describe_failure(refused) == "cannot reach the apiserver at 127.0.0.1:1: Connection refused"
    )
    assert describe_failure(KubernetesApiError(403, "Forbidden", "no list")) == (
        "forbidden by RBAC: no list"
    )
    assert describe_failure(ValueError("a bug")) is None


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        (
            ConnectionFailure.TLS_VERIFICATION,
            "TLS verification of the apiserver at h:6443 failed: why; "
            "check the kubeconfig's certificate-authority",
        ),
        (
            ConnectionFailure.TLS_HANDSHAKE,
            "TLS handshake with the apiserver at h:6443 failed: why; "
            "check the kubeconfig's certificates and the server URL",
        ),
        (ConnectionFailure.REFUSED, "cannot reach the apiserver at h:6443: why"),
        (ConnectionFailure.UNREACHABLE, "cannot reach the apiserver at h:6443: why"),
        (ConnectionFailure.TIMEOUT, "timed out waiting for the apiserver"),
        (ConnectionFailure.BROKEN, "talking to the apiserver failed: why"),
    ],
)
def test_a_connection_failure_is_described_from_our_own_error(
    kind: ConnectionFailure, line: str
) -> None:
    """The command reads the kind, server and reason the transport put on the error."""
    failure = KubernetesConnectionError("pod LIST failed", kind=kind, server="h:6443", reason="why")
    assert describe_failure(failure) == line
    assert describe_failure(KubernetesConnectionError("nothing read for 90s", idle=True)) == (
        "talking to the apiserver failed: nothing read for 90s"
    )


def test_main_without_kubeconfig_prints_one_line_and_exits_2(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    code = cli.main(["watch", "--selector", "app=x", "--parent-label", "cell"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        f"miles-reconcile: error: kubeconfig {tmp_path / 'absent'} (from $KUBECONFIG): no such "
        "file; point KUBECONFIG at an existing file or unset it"
    ]


def test_main_against_a_closed_port_prints_one_line_and_exits_2(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    code = cli.main(
        ["watch", "--kubeconfig", str(kubeconfig), "--selector", "app=x", "--parent-label", "cell"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith("miles-reconcile: error: cannot reach the apiserver at 127.0.0.1:1")


async def _watch_until(
    api: FakePodApi, condition: Any, *, options: PoolOptions, output: str = "table"
) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    view = LiveView(stream=out, output=output, tty=False, title="t", now=Clock())  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(
        watch_pool(options, pod_api=api, view=view, stop=stop, err=err, tick=False)
    )
    await run_until(lambda: condition(out.getvalue(), err.getvalue()) or task.done())
    stop.set()
    await task
    return out.getvalue(), err.getvalue()


async def test_watch_says_once_when_the_selector_matches_nothing_and_keeps_watching() -> None:
    """An empty selection is reported on stderr, and the loop keeps running."""
    empty = PodListPage(pods=(), resource_version="5")
    api = FakePodApi(lists=[empty, empty])
    options = PoolOptions(namespace="ns", selector="app=none", parent_label=PARENT_LABEL)
    out, err = await _watch_until(api, lambda out, err: "watching" in err, options=options)
    assert err.splitlines()[0] == (
        "miles-reconcile: no pods in namespace 'ns' match selector 'app=none'; watching for them"
    )
    assert "(no pods)" in out
    assert len(api.watch_calls) == 1


async def test_watch_draws_the_pool_and_marks_a_pod_the_watch_changed() -> None:
    """The reconcile reads ``loop.get_by_parent`` and the view marks what the event changed."""
    first = k8s_pod("e-0", resource_version="10")
    page = PodListPage(pods=(first, k8s_pod("e-1", resource_version="11")), resource_version="11")
    restarted = k8s_pod("e-0", resource_version="12", restart_count=1)
    drawn = asyncio.Event()
    api = FakePodApi(
        lists=[page, page], watches=[[drawn.wait, PodWatchEvent("MODIFIED", restarted, "12")]]
    )
    options = PoolOptions(namespace="default", selector="app=x", parent_label=PARENT_LABEL)

    def marked(out: str, err: str) -> bool:
        if "cell-0" in out:
            drawn.set()
        return "* cell-0" in out

    out, err = await _watch_until(api, marked, options=options)
    first_draw, changes = out.split("* cell-0", 1)
    assert "cell-0  (2 members)" in first_draw
    assert "* " not in first_draw
    assert changes.split()[:4] == ["e-0", "1/1", "Running", "1"]
    assert err == ""


async def test_watch_jsonl_records_follow_the_watch() -> None:
    """``--output jsonl``: one object per reconcile, carrying what the store holds then."""
    page = PodListPage(pods=(k8s_pod("e-0", resource_version="10"),), resource_version="10")
    gone = k8s_pod("e-0", resource_version="13")
    synced = asyncio.Event()
    api = FakePodApi(
        lists=[page, page], watches=[[synced.wait, PodWatchEvent("DELETED", gone, "13")]]
    )
    options = PoolOptions(namespace="default", selector="app=x", parent_label=PARENT_LABEL)

    def two_records(out: str, err: str) -> bool:
        if out.count("\n") == 1:
            synced.set()
        return out.count("\n") >= 2

    out, _ = await _watch_until(api, two_records, options=options, output="jsonl")
    records = [json.loads(line) for line in out.splitlines()]
    assert [[m["resourceVersion"] for m in r["members"]] for r in records] == [["10"], []]


async def test_watch_forbidden_list_fails_before_the_loop_starts() -> None:
    api = FakePodApi(lists=[KubernetesApiError(403, "Forbidden", "pods is forbidden")])
    options = PoolOptions(namespace="ns", selector="app=x", parent_label=PARENT_LABEL)
    with pytest.raises(KubernetesApiError) as caught:
        await _watch_until(api, lambda out, err: False, options=options)
    assert describe_failure(caught.value) == "forbidden by RBAC: pods is forbidden"
    assert api.watch_calls == []


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


def test_a_missing_kubernetes_extra_is_one_line() -> None:
    missing = ModuleNotFoundError("No module named 'kubernetes_asyncio'", name="kubernetes_asyncio")
    assert describe_failure(missing) == (
        "kubernetes_asyncio is not installed: pip install 'miles-reconcile[k8s]'"
    )
    assert describe_failure(ModuleNotFoundError("x", name="numpy")) is None


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
