"""Fast layer: the ``env`` and ``demo`` subcommands without a control plane: dispatch through the
entry points, the per-user plane records ``env down`` reads, one-line mistakes, the demo's
verdict and the build progress display."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import state
from miles.utils.k8s_testenv.commands.build_progress import progress_line, run_with_progress
from miles.utils.k8s_testenv.commands.demo import Verdict, group_by_parent, story, until_stopped
from miles.utils.k8s_testenv.testing.k8s_fakes import PARENT_LABEL, pod
from miles.utils.k8s_testenv.user_dirs import user_cache_dir, user_state_dir
from miles.utils.workers.reconcile import cli
from miles.utils.workers.reconcile.cli.pool_loop import parent_label_map


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "miles-reconcile" / "planes"


def record_plane(tmp_path: Path, name: str, owner: int | None) -> Path:
    (tmp_path / name).mkdir()
    return state.write_state(work_dir=tmp_path / name, pids={}, kubeconfigs={}, owner_pid=owner)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = cli.main(argv, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def test_demo_verdict_matches_only_when_names_and_resource_versions_agree() -> None:
    listed = {"cell-0": {"e-0": "5", "e-1": "6"}}
    assert Verdict(matched=True, loop_view=listed, listed=listed).lines() == [
        "verdict: match (1 parents, 2 pods: the loop's view equals a fresh LIST)"
    ]
    ours = {"cell-0": {"e-0": "4"}, "cell-9": {"e-9": "1"}}
    lines = Verdict(matched=False, loop_view=ours, listed=listed).lines()
    assert lines == [
        "verdict: MISMATCH (loop view vs fresh LIST)",
        "  cell-0/e-0: loop has rv 4, LIST has 5",
        "  cell-0/e-1: in LIST (rv 6), missing from loop",
        "  cell-9/e-9: in loop (rv 1), not in LIST",
    ]


def test_demo_groups_a_listing_by_parent_and_drops_unlabelled_pods() -> None:
    pods = [pod("e-0", "cell-0", "3"), pod("e-1", "cell-1", "4"), pod("x", "")]
    assert group_by_parent(pods, parent_label_map(PARENT_LABEL)) == {
        "cell-0": {"e-0": "3"},
        "cell-1": {"e-1": "4"},
    }


def test_demo_story_covers_every_scripted_event_of_the_issue() -> None:
    captions = " | ".join(step.caption for step in story())
    for event in (
        "create the pool: 3 cells x 4 engines",
        "scale-up",
        "container restart",
        "graceful delete",
        "relabelled into cell-2",
        "apiserver restart",
        "leave the selector",
    ):
        assert event in captions


async def test_until_stopped_cancels_the_work_when_stop_is_set_first() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever() -> int:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return 1

    async def done() -> int:
        return 7

    stop.set()
    assert await until_stopped(forever(), stop) is None
    assert cancelled.is_set()
    assert await until_stopped(done(), asyncio.Event()) == 7


async def test_build_progress_echoes_build_lines_off_a_terminal() -> None:
    out = io.StringIO()

    def build(log: Callable[[str], None]) -> str:
        log("k8s_testenv: building kube-apiserver (k8s.io/kubernetes v1.36.3) ...")
        log("k8s_testenv: built kube-apiserver in 301.0s (120.0 MB)")
        return "paths"

    assert await run_with_progress(build, stream=out, tty=False) == "paths"
    assert out.getvalue().splitlines() == [
        "building kube-apiserver (k8s.io/kubernetes v1.36.3) ...",
        "built kube-apiserver in 301.0s (120.0 MB)",
    ]


def test_build_progress_line_shows_spinner_and_elapsed_time() -> None:
    line = progress_line("building etcd ...", started=100.0, now=163.0, frame=1)
    assert line == "/ building etcd ... (1m03s)"


def test_user_folders_follow_xdg_and_ignore_relative_values(tmp_path: Path) -> None:
    home = Path.home()
    assert user_cache_dir({}) == home / ".cache" / "miles-reconcile"
    assert user_state_dir({}) == home / ".local" / "state" / "miles-reconcile"
    assert user_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "miles-reconcile"
    assert user_state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "miles-reconcile"
    assert user_state_dir({"XDG_STATE_HOME": "relative"}) == user_state_dir({})


def test_planes_are_recorded_in_the_users_state_folder(state_home: Path, tmp_path: Path) -> None:
    assert record_plane(tmp_path, "miles-k8s-a", None) == state_home / "miles-k8s-a.json"
    assert [plane.name for plane in state.running_planes()] == ["miles-k8s-a"]


def test_env_down_with_nothing_recorded_says_so(
    state_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["env", "down"], capsys) == (0, "nothing is running\n", "")


def test_env_down_lists_every_plane_and_stops_only_the_abandoned_ones(
    state_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_plane(tmp_path, "miles-k8s-left", None)
    record_plane(tmp_path, "miles-k8s-owned", os.getpid())
    code, out, _ = run_cli(["env", "down"], capsys)
    assert code == 0
    assert out.splitlines() == [
        "stopped miles-k8s-left (left running)",
        f"left miles-k8s-owned running (owned by pid {os.getpid()}); "
        "stop it with: miles-reconcile env down miles-k8s-owned",
    ]
    assert [plane.name for plane in state.running_planes()] == ["miles-k8s-owned"]
    assert not (tmp_path / "miles-k8s-left").exists()


def test_env_down_name_stops_that_plane_only_even_when_owned(
    state_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_plane(tmp_path, "miles-k8s-a", os.getpid())
    record_plane(tmp_path, "miles-k8s-b", None)
    code, out, _ = run_cli(["env", "down", "miles-k8s-a"], capsys)
    assert (code, out) == (0, f"stopped miles-k8s-a (owned by pid {os.getpid()})\n")
    assert [plane.name for plane in state.running_planes()] == ["miles-k8s-b"]


def test_env_down_of_an_unknown_name_is_one_line_naming_the_running_ones(
    state_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_plane(tmp_path, "miles-k8s-b", None)
    code, out, err = run_cli(["env", "down", "miles-k8s-zzz"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "miles-reconcile: error: no control plane named 'miles-k8s-zzz' (running: miles-k8s-b); "
        "`env down` lists them"
    ]
    assert [plane.name for plane in state.running_planes()] == ["miles-k8s-b"]


def test_an_unreadable_plane_record_is_skipped_with_a_warning(
    state_home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record_plane(tmp_path, "miles-k8s-a", None)
    (state_home / "garbage.json").write_text("[1, 2")
    assert [plane.name for plane in state.running_planes()] == ["miles-k8s-a"]
    assert "ignoring unreadable state file" in caplog.text
    assert "garbage.json" in caplog.text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["env"], "miles-reconcile env: error: the following arguments are required: ACTION"),
        (["env", "sideways"], "miles-reconcile env: error: argument ACTION: invalid choice"),
        (["demo", "--long"], "miles-reconcile: error: unrecognized arguments: --long"),
        (["nope"], "miles-reconcile: error: argument COMMAND: invalid choice: 'nope'"),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith(expected)
    assert "--help)" in err


def test_every_declared_command_is_listed_and_the_built_in_ones_first() -> None:
    names = [command.name for command in cli.commands_for(["--help"])]
    assert names == ["watch", "status", "demo", "env"]
    built_in = ["watch", "status"]
    assert [command.name for command in cli.commands_for(["watch", "-l", "a"])] == built_in
    assert [command.name for command in cli.commands_for(["env", "up"])] == [*built_in, "env"]


def test_version_comes_from_the_installed_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"miles-reconcile {version('miles-reconcile')}\n"


def _declare(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    point = EntryPoint(name="broken", value=value, group="miles_reconcile.commands")
    monkeypatch.setattr(cli, "declared_commands", lambda: {"broken": point})


def test_a_declared_command_that_cannot_load_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _declare(monkeypatch, "miles_no_such_module:COMMAND")
    code, out, err = run_cli(["broken", "x"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "miles-reconcile: error: the broken command (miles_no_such_module:COMMAND) cannot be "
        "loaded: ModuleNotFoundError: No module named 'miles_no_such_module'; "
        "reinstall miles-reconcile"
    ]


def test_a_declared_command_missing_the_k8s_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = ModuleNotFoundError("No module named 'kubernetes_asyncio'", name="kubernetes_asyncio")

    def load(self: EntryPoint) -> object:
        raise missing

    _declare(monkeypatch, "somewhere:COMMAND")
    monkeypatch.setattr(EntryPoint, "load", load)
    code, _, err = run_cli(["broken"], capsys)
    assert code == 2
    assert err.splitlines() == [
        "miles-reconcile: error: kubernetes_asyncio is not installed: "
        "pip install 'miles-reconcile[k8s]'"
    ]


def test_a_declared_object_that_is_not_a_subcommand_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _declare(monkeypatch, "miles.utils.k8s_testenv.commands:describe_testenv_failure")
    code, _, err = run_cli(["broken"], capsys)
    assert code == 2
    assert "is a function, not a Subcommand" in err
    assert len(err.splitlines()) == 1
