"""bench/apiserver_objects.py: an engine pool made of a served pod carries the pod's labels and
about its bytes and decodes into the bench's model; the targets judge each ratio within a round and
fail the run when one is over its ceiling or a writer fell behind its pace. Layer: fast (no
cluster; the objects are built here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.apiserver import parse_args
from bench.apiserver_callgrind import RATE
from bench.apiserver_objects import (
    CEILINGS,
    CONTENDERS,
    PACE,
    SERVED_POOL_EXTRA,
    check_ceilings,
    engine_pool,
    pace_kept,
)
from bench.objects import EnginePool
from bench.report import Results
from miles.utils.k8s_testenv.testing.k8s_fakes import realistic_pod
from miles.utils.workers.reconcile.k8s_wire import ObjectDecoder


def _size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def test_a_pool_has_the_pods_labels_and_size_and_the_model_reads_it() -> None:
    pod = realistic_pod("engine-3", "cell-3", namespace="pods")
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f": "v" * 3000}}]
    body, status = engine_pool(pod, "pools")
    assert body["metadata"]["namespace"] == "pools"
    assert body["metadata"]["labels"] == pod["metadata"]["labels"]
    assert _size({**body, "status": status}) + SERVED_POOL_EXTRA == pytest.approx(_size(pod), abs=2)
    served = {**body, "status": status, "metadata": {**body["metadata"], "resourceVersion": "5"}}
    line = json.dumps({"type": "MODIFIED", "object": served}).encode()
    pool = ObjectDecoder(EnginePool, kind="EnginePool").decode_watch_line(line).object
    assert pool is not None
    assert pool.status.ready_replicas == 3
    assert [c.type for c in pool.status.conditions][-1] == "Engines"


def test_a_ratio_over_its_ceiling_fails_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    def round_(typed_cpu: float) -> dict[str, dict[str, float | None]]:
        return {
            "ours": {"cpu_per_event": 100e-6},
            "ours-typed": {"sync_s": 1.2, "cpu_per_event": typed_cpu},
            "ours-dynamic": {"sync_s": 1.2, "cpu_per_event": 140e-6},
            "floor-objects": {"sync_s": 1.0},
        }

    assert check_ceilings(Results([round_(105e-6), round_(108e-6), round_(300e-6)]), CEILINGS)
    assert not check_ceilings(Results([round_(120e-6), round_(108e-6), round_(300e-6)]), CEILINGS)
    assert "typed CPU per WATCH event / the pods': 1.20x" in capsys.readouterr().out


def test_kind_enginepools_runs_the_pods_beside_the_pools() -> None:
    assert parse_args(["--kind", "enginepools"]).contenders == ["ours", *CONTENDERS]
    assert parse_args([]).contenders == ["ours", "ka", "go", "kube-rs", "wire"]


def test_kind_enginepools_paces_every_writer_alike_unless_told() -> None:
    assert parse_args(["--kind", "enginepools"]).writer_rate == PACE
    assert parse_args(["--kind", "enginepools", "--writer-rate", "0"]).writer_rate == 0.0
    assert parse_args([]).writer_rate == 0.0
    assert parse_args(["--instructions"]).writer_rate == RATE


def test_a_writer_behind_its_pace_fails_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    Round = dict[str, dict[str, float | None]]
    kept: Round = {"ours": {"writer_rate": 199.0}, "ours-typed": {"writer_rate": 185.0}}
    behind: Round = {"ours": {"writer_rate": 200.0}, "ours-typed": {"writer_rate": 150.0}}
    assert pace_kept(Results([kept, kept]), 200.0)
    assert not pace_kept(Results([kept, behind]), 200.0)
    assert "round 2, ours-typed: the writer kept 150 of 200 patches/s" in capsys.readouterr().out
    assert pace_kept(Results([behind]), 0.0)
