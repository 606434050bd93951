"""Fast layer: ``list_memory.listing`` (row ``list_memory.py``): the collector is off for the LIST,
and only a LIST that succeeded trims the heap."""

from __future__ import annotations

import gc

import pytest

from miles.utils.workers.reconcile import list_memory


def test_a_list_pauses_the_collector_and_a_failed_one_only_ends_the_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[bool] = []
    monkeypatch.setattr(list_memory, "trim_free_heap", lambda: trims.append(True))
    assert gc.isenabled()
    with list_memory.listing():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert trims == [True]
    with pytest.raises(RuntimeError), list_memory.listing():
        raise RuntimeError("the LIST failed")
    assert gc.isenabled()
    assert trims == [True]
