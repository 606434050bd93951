"""What a checkpoint expects of each view, and the diff it prints when one is wrong.

Layer: k8s_apiserver (differential), though pure: it proves the comparison can fail, names the pod
and the view, and expects the recorded deviation (parent-less pods are not in our store) exactly,
and client-go's ghost after a frame without a name exactly.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from miles.utils.k8s_testenv.testing.differential.views import (
    GHOST_NAME,
    Comparison,
    NamelessGhost,
    PodRow,
    status_of_json,
    status_of_pod,
)
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list

RECORDED = json.loads(
    (Path(__file__).parents[2] / "fast/utils/workers/reconcile/wire/printer_pods.json").read_text()
)
"""Pods recorded from a real apiserver, statuses written by the real node's kubelet among them."""

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


def test_an_engine_pool_client_go_holds_stale_fails_the_comparison_naming_the_kind() -> None:
    pods = {"a": A}
    pool = PodRow(uid="uid-p-000000", resource_version="20", parent="cell-0", status="replicas=2")
    stale = PodRow(uid=pool.uid, resource_version="19", parent="cell-0")
    agreed = Comparison(
        truth={"pool-1": pool},
        ours={"pool-1": pool},
        oracle={"pool-1": dataclasses.replace(pool, status=None)},
        reconciled={"pool-1": pool},
    )
    whole = Comparison(truth=pods, ours=pods, oracle=pods, reconciled=pods, pools=agreed)
    assert whole.all_match
    pools = dataclasses.replace(agreed, oracle={"pool-1": stale})
    comparison = dataclasses.replace(whole, pools=pools)
    assert not comparison.all_match
    assert not comparison.oracle_matches
    assert comparison.ours_matches
    assert comparison.kinds_differing() == ["enginepools"]
    assert "engine pools:" in comparison.describe()
    assert "!uid-p-00 rv=19" in comparison.describe()


def test_a_stale_resource_version_is_shown_with_the_view_that_has_it() -> None:
    stale = PodRow(uid=B.uid, resource_version="9", parent=B.parent)
    truth = {"a": A, "b": B}
    comparison = Comparison(truth=truth, ours=truth, oracle={"a": A, "b": stale}, reconciled=truth)
    diff = comparison.describe()
    assert not comparison.all_match
    assert "1 object(s) differ" in diff
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


def test_a_status_our_store_misread_is_a_divergence_and_client_go_is_held_to_the_rest() -> None:
    crash_looping = dataclasses.replace(A, status="Running ready=False; main r=2 waiting:X last=7")
    misread = dataclasses.replace(crash_looping, status="Running ready=False; main r=2 none last=7")
    truth = {"a": crash_looping}
    comparison = Comparison(truth=truth, ours={"a": misread}, oracle={"a": A}, reconciled={})
    assert comparison.oracle_matches
    assert not comparison.ours_matches
    line = next(line for line in comparison.describe().splitlines() if "none last=7" in line)
    assert "!uid-a-00" in line


@pytest.mark.parametrize(
    "case", sorted(e["case"] for e in RECORDED["pods"] if e["writer"] == "kubelet")
)
def test_the_status_summary_of_our_decoded_pod_equals_the_one_of_its_json(case: str) -> None:
    """Pods whose status a real kubelet wrote (running, crashed, crash-looping, terminating):
    the summary the checkpoint compares reads the same from our `Pod` as from the LIST's JSON."""
    raw = next(e["pod"] for e in RECORDED["pods"] if e["case"] == case)
    body = json.dumps({"metadata": {"resourceVersion": "1"}, "items": [raw]}).encode()
    page, rejects = decode_pod_list(body)
    assert rejects == []
    assert status_of_pod(page.pods[0]) == status_of_json(raw)
    assert status_of_json(raw).startswith(f"{raw['status'].get('phase')} ready=")


def test_client_go_keeping_a_nameless_frame_as_a_ghost_is_told_exactly() -> None:
    """After a frame without a name client-go holds the pod's new state under the empty name and
    the pod at its older resourceVersion; that and nothing else is the predicted ghost."""
    moved = PodRow(uid=A.uid, resource_version="13", parent="cell-1")
    truth = {"a": moved, "b": B}
    ghost = NamelessGhost("a")
    kept = {GHOST_NAME: moved, "a": A, "b": B}
    explained = ghost.explain(Comparison(truth=truth, ours=truth, oracle=kept, reconciled=truth))
    assert explained is not None
    assert "rv=13" in explained
    assert "kept a at rv=10" in explained
    for wrong in (
        {GHOST_NAME: moved, "a": A},
        {GHOST_NAME: moved, "a": moved, "b": B},
        {GHOST_NAME: B, "a": A, "b": B},
        {"a": A, "b": B},
        truth,
    ):
        comparison = Comparison(truth=truth, ours=truth, oracle=wrong, reconciled=truth)
        assert ghost.explain(comparison) is None, wrong


def test_client_go_keeping_a_nameless_pool_frame_as_a_ghost_is_told_per_kind() -> None:
    """The pools' frame loses its name too: client-go's dynamic informer keeps the pool's ghost in
    its own store, which is explained with the pods' ghost, or alone where the pods' view is right;
    a pool view wrong in any other way, or a pool ghost where none was predicted, is not."""
    pool = PodRow(uid="uid-p-000000", resource_version="20", parent="cell-0")
    moved = dataclasses.replace(pool, resource_version="21")
    pool_truth = {"pool-1": moved}
    pool_ghost = {GHOST_NAME: moved, "pool-1": pool}

    def comparison(pod_oracle: dict[str, PodRow], pool_oracle: dict[str, PodRow]) -> Comparison:
        pods = {"a": A, "b": B}
        pools = Comparison(
            truth=pool_truth, ours=pool_truth, oracle=pool_oracle, reconciled=pool_truth
        )
        return Comparison(truth=pods, ours=pods, oracle=pod_oracle, reconciled=pods, pools=pools)

    pods_right = {"a": A, "b": B}
    alone = NamelessGhost("a", "pool-1").explain(comparison(pods_right, pool_ghost))
    assert alone is not None
    assert "kept pool-1 at rv=20 (engine pools)" in alone
    assert "(pods)" not in alone
    moved_a = dataclasses.replace(A, resource_version="13")
    both_truth = comparison(pods_right, pool_ghost)
    both = dataclasses.replace(
        both_truth, truth={"a": moved_a, "b": B}, oracle={GHOST_NAME: moved_a, "a": A, "b": B}
    )
    explained = NamelessGhost("a", "pool-1").explain(both)
    assert explained is not None
    assert "kept a at rv=10 (pods)" in explained
    assert "kept pool-1 at rv=20 (engine pools)" in explained
    assert NamelessGhost("a").explain(comparison(pods_right, pool_ghost)) is None
    assert NamelessGhost("a", "pool-1").explain(comparison(pods_right, pool_truth)) is None
    for wrong in ({"pool-1": pool}, {GHOST_NAME: moved}, {GHOST_NAME: pool, "pool-1": pool}):
        assert NamelessGhost("a", "pool-1").explain(comparison(pods_right, wrong)) is None, wrong
