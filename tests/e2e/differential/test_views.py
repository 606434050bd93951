"""What a checkpoint expects of each view, and the diff it prints when one is wrong.

Layer: k8s_apiserver (differential), though pure: it proves the comparison can fail, names the pod
and the view, and expects the recorded deviation (parent-less pods are not in our store) exactly.
"""

from __future__ import annotations

from miles.utils.k8s_testenv.testing.differential.views import Comparison, PodRow

A = PodRow(uid="uid-a-000000", resource_version="10", parent="cell-0")
B = PodRow(uid="uid-b-000000", resource_version="11", parent="cell-1")
ORPHAN = PodRow(uid="uid-o-000000", resource_version="12", parent=None)


def test_our_store_is_expected_without_the_parent_less_pod_and_client_go_with_it() -> None:
    truth = {"a": A, "o": ORPHAN}
    comparison = Comparison(truth=truth, ours={"a": A}, oracle=truth, reconciled={"a": A})
    assert comparison.all_match


def test_our_store_holding_a_parent_less_pod_is_a_divergence() -> None:
    truth = {"a": A, "o": ORPHAN}
    comparison = Comparison(truth=truth, ours=truth, oracle=truth, reconciled=truth)
    assert not comparison.ours_matches


def test_a_stale_resource_version_is_shown_with_the_view_that_has_it() -> None:
    stale = PodRow(uid=B.uid, resource_version="9", parent=B.parent)
    truth = {"a": A, "b": B}
    comparison = Comparison(truth=truth, ours=truth, oracle={"a": A, "b": stale}, reconciled=truth)
    diff = comparison.describe()
    assert not comparison.all_match
    assert "1 pod(s) differ" in diff
    assert "client-go      2 pods, 1 wrong" in diff
    line = next(line for line in diff.splitlines() if line.strip().startswith("b "))
    assert "!uid-b-00 rv=9" in line
    assert " uid-b-00 rv=11" in line


def test_a_reconcile_that_missed_a_move_is_a_divergence() -> None:
    moved = PodRow(uid=A.uid, resource_version="13", parent="cell-1")
    truth = {"a": moved}
    comparison = Comparison(truth=truth, ours=truth, oracle=truth, reconciled={"a": A})
    assert comparison.ours_matches
    assert comparison.oracle_matches
    assert not comparison.reconciled_matches
