"""The differential's seeded plans (`scenario.py`): the kubelet churn is in CI's plan once per
operation and a bounded share of the soak's steps, and `without` leaves it out. No cluster."""

from __future__ import annotations

import random
from collections import Counter

from miles.utils.k8s_testenv.testing.differential.scenario import (
    KUBELET_CHURN,
    OpKind,
    ci_plan,
    soak_step,
)

_SOAK_STEPS = 4000


def test_ci_plan_runs_every_kubelet_churn_operation_once() -> None:
    plan = Counter(ci_plan(random.Random(1)))
    assert {op: plan[op] for op in KUBELET_CHURN} == dict.fromkeys(KUBELET_CHURN, 1)


def test_ci_plan_without_the_churn_has_none_of_it() -> None:
    plan = ci_plan(random.Random(1), without=frozenset(op.value for op in KUBELET_CHURN))
    assert KUBELET_CHURN.isdisjoint(plan)
    assert OpKind.DELETE_GRACEFUL in plan


def test_a_soak_draws_kubelet_churn_about_a_tenth_of_its_steps_and_every_kind_of_it() -> None:
    rng = random.Random(2)
    steps = Counter(soak_step(rng, index) for index in range(1, _SOAK_STEPS + 1))
    churn = sum(steps[op] for op in KUBELET_CHURN)
    assert 0.07 < churn / _SOAK_STEPS < 0.13
    assert all(steps[op] > 0 for op in KUBELET_CHURN)


def test_a_soak_without_one_churn_operation_never_draws_it() -> None:
    rng = random.Random(2)
    without = frozenset({OpKind.ENGINE_CRASH.value})
    steps = {soak_step(rng, index, without=without) for index in range(1, _SOAK_STEPS + 1)}
    assert OpKind.ENGINE_CRASH not in steps
    assert KUBELET_CHURN - {OpKind.ENGINE_CRASH} <= steps
