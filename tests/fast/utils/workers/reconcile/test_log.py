"""NamedLogger: every line names its loop, in the message and as a record attribute."""

from __future__ import annotations

import logging

import pytest

from miles.utils.workers.reconcile.log import LOOP_NAME_FIELD, NamedLogger, default_loop_name


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
