"""The pool every command shows (``cli/pool_loop``): the key map by parent label, the note for an
empty selection."""

from __future__ import annotations

from miles.utils.workers.reconcile.cli.pool_loop import (
    PoolOptions,
    empty_selection_note,
    parent_label_map,
)
from tests.fast.utils.workers.reconcile.cli.view_fakes import (
    make_pod,
)


def test_parent_label_map_names_the_cell_or_nothing() -> None:
    key_map = parent_label_map("cell")
    assert key_map(make_pod("e-0", cell="cell-3")) == "cell-3"
    assert key_map(make_pod("e-0", cell="")) is None


def test_empty_selection_note_says_what_matched_nothing() -> None:
    options = PoolOptions(namespace="ns", selector="app=x", parent_label="cell")
    assert "no pods in namespace 'ns' match selector 'app=x'" in empty_selection_note(options, 0)
    assert "none carries label 'cell'" in empty_selection_note(options, 3)
