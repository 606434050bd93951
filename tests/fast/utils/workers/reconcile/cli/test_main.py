"""The command line (``cli/__init__.py``'s ``main``): every usage mistake and every failure a person
can act on is one line and exit 2."""

from __future__ import annotations

from typing import Any

import pytest

from miles.utils.k8s_testenv.kubeconfig import write_kubeconfig
from miles.utils.workers.reconcile import cli


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
    closed = "http://127.0.0.1:1"
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", name="closed", server=closed, ca_cert=None, token="t"
    )
    code = cli.main(
        ["watch", "--kubeconfig", str(kubeconfig), "--selector", "app=x", "--parent-label", "cell"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith("miles-reconcile: error: cannot reach the apiserver at 127.0.0.1:1")
