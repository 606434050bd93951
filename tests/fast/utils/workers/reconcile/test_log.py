"""NamedLogger: every line names its loop, in the message and as a record attribute."""

from __future__ import annotations

import logging

import pytest

from miles.utils.workers.reconcile.log import (
    LOOP_NAME_FIELD,
    NamedLogger,
    default_loop_name,
    one_line,
)


def test_each_line_carries_the_loop_name(caplog: pytest.LogCaptureFixture) -> None:
    log = NamedLogger(logging.getLogger("test.named"), "train/role=engine")
    with caplog.at_level(logging.INFO, logger="test.named"):
        log.warning("pod LIST failed: %s", "boom")
    (record,) = caplog.records
    assert record.getMessage() == "[train/role=engine] pod LIST failed: boom"
    assert getattr(record, LOOP_NAME_FIELD) == "train/role=engine"


def test_default_name_is_namespace_and_selector() -> None:
    assert default_loop_name("train", "miles/role=engine") == "train/miles/role=engine"
    assert default_loop_name("train", "") == "train"


class _Api(Exception):
    def __str__(self) -> str:
        return "(500)\nReason: Internal Server Error\nHTTP response body: {}\n"


@pytest.mark.parametrize(
    ("error", "limit", "line"),
    [
        (RuntimeError("store index corrupted"), None, "RuntimeError: store index corrupted"),
        (TimeoutError(), None, "TimeoutError"),
        (ValueError("   "), None, "ValueError"),
        (_Api(), None, "_Api: (500) Reason: Internal Server Error HTTP response body: {}"),
        ("reconcile-worker crashed: boom", None, "reconcile-worker crashed: boom"),
        ("connection refused\nmore", None, "connection refused"),
        (RuntimeError("x" * 400), 300, "RuntimeError: " + "x" * 286 + "..."),
        (RuntimeError("short"), 300, "RuntimeError: short"),
    ],
)
def test_one_line_is_the_one_error_summary(
    error: BaseException | str, limit: int | None, line: str
) -> None:
    """The loop's summaries (cut at 300 with ``...``), the adapter's (whole) and the command's
    (a text) all read as before for what they were given."""
    assert one_line(error, limit) == line
