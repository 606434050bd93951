"""The runtime's log lines as notes under the live view (``cli/log_notes``): while the view owns
the terminal, a warning or worse is one note, its first line, level first; nothing reaches stderr;
the root logger's handlers come back after."""

from __future__ import annotations

import logging

import pytest

from miles.utils.workers.reconcile.cli.log_notes import logs_into


def test_while_enabled_each_warning_is_one_note_and_nothing_else_is_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    before = root.handlers[:]
    notes: list[str] = []
    logger = logging.getLogger("miles.utils.workers.reconcile.k8s_reflector")
    with logs_into(notes, enabled=True):
        logger.info("listed 3 pods")
        logger.warning("pod watch failed: %s\nTraceback (most recent call last):", "refused")
        logger.error("reconcile of %s failed", "cell-0")
        assert root.handlers != before
    assert root.handlers == before
    assert notes == ["warning: pod watch failed: refused", "error: reconcile of cell-0 failed"]
    assert capsys.readouterr().err == ""


def test_disabled_it_leaves_the_handlers_alone() -> None:
    root = logging.getLogger()
    before = root.handlers[:]
    notes: list[str] = []
    with logs_into(notes, enabled=False):
        assert root.handlers == before
        logging.getLogger("x").warning("not a note")
    assert notes == []
