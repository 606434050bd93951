"""examples/controller_process: what every example process shares, without a cluster: the loop's
line for an ``ExplainedFailure`` carries no stack once ``main_of`` runs (each example's
``NotLeadingError`` is one), other failures keep theirs, and ``--help`` shows the first line of
the description it is given (a module's docstring)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from miles.utils.workers.reconcile.examples import colocate_pairing, engine_pool
from miles.utils.workers.reconcile.examples.controller_process import (
    ExplainedFailure,
    NotLeadingError,
    ProcessConfig,
    main_of,
)

LOOP_LOGGER = "miles.utils.workers.reconcile.loop"


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_main_of_logs_an_explained_failure_without_its_stack() -> None:
    failures = [NotLeadingError("not leading"), RuntimeError("boom")]

    async def run(config: ProcessConfig, kubeconfig: str | None, env: Mapping[str, str]) -> int:
        for failure in failures:
            try:
                raise failure
            except Exception:
                logging.getLogger(LOOP_LOGGER).exception("reconcile failed")
        return 0

    kept = _Kept()
    logging.getLogger(LOOP_LOGGER).addHandler(kept)
    try:
        assert main_of(prog="p", description="P.", config=ProcessConfig, run=run, argv=[]) == 0
    finally:
        logging.getLogger(LOOP_LOGGER).removeHandler(kept)
    assert [r.exc_info is None for r in kept.records] == [True, False]


def test_both_examples_share_one_not_leading_error() -> None:
    assert colocate_pairing.NotLeadingError is engine_pool.NotLeadingError is NotLeadingError
    assert issubclass(colocate_pairing.PairingForbiddenError, ExplainedFailure)
    assert issubclass(NotLeadingError, RuntimeError)


def test_help_shows_the_first_line_of_the_description(capsys: pytest.CaptureFixture[str]) -> None:
    async def run(config: ProcessConfig, kubeconfig: str | None, env: Mapping[str, str]) -> int:
        raise AssertionError("--help runs nothing")

    with pytest.raises(SystemExit):
        main_of(
            prog="p", description="First line.\n\nMore.", config=ProcessConfig, run=run, argv=["-h"]
        )
    out = capsys.readouterr().out
    assert "First line." in out
    assert "More." not in out
