"""What a differential run does: the operations and faults, and the seeded order of them.

Go counterpart: none (test-side). `ci_plan` is the bounded scenario CI runs on every submission;
`soak_step` draws the steps of `bench/soak.py`.
"""

from __future__ import annotations

import enum
import random

_BULK_EVERY = 20
_CHURN_SHARE = 0.1 / 0.75


class OpKind(enum.StrEnum):
    CREATE = "create"
    STATUS = "status-update"
    OUT_OF_RANGE_TIME = "out-of-range-timestamp"
    RELABEL = "label-update"
    MOVE = "move-parent"
    LEAVE = "leave-selector"
    REENTER = "reenter-selector"
    ORPHAN = "drop-parent-label"
    ADOPT = "restore-parent-label"
    DELETE_GRACEFUL = "graceful-delete"
    DELETE_NOW = "immediate-delete"
    BULK_CHURN = "bulk-churn"
    ENGINE_CRASH = "engine-crash"
    ENGINE_GRACEFUL_DELETE = "engine-graceful-delete"
    ENGINE_RECREATE = "engine-recreate"
    ENGINE_READINESS = "engine-readiness-flip"


KUBELET_CHURN = frozenset(
    (
        OpKind.ENGINE_CRASH,
        OpKind.ENGINE_GRACEFUL_DELETE,
        OpKind.ENGINE_RECREATE,
        OpKind.ENGINE_READINESS,
    )
)
"""Operations only a real kubelet can carry out (`kubelet_churn.py`); skipped without one."""


class FaultKind(enum.StrEnum):
    APISERVER_RESTART = "apiserver-restart"
    COMPACT_410 = "compaction-410"
    ETCD_RESTART = "etcd-stop-start"
    ETCD_RESTORE = "etcd-restore"
    CUT_MID_FRAME = "cut-mid-frame"
    SILENT = "silent-connection"
    WATCH_500 = "watch-500"
    CURSOR_REJECTED = "cursor-rejected"
    THROTTLED_429 = "throttled-429"
    CORRUPT_CHUNK = "corrupt-chunk"
    DEAD_CONNECTION = "dead-connection"
    FRAME_WITHOUT_NAME = "frame-without-name"
    FRAME_CUT = "frame-json-cut"
    FRAME_CHUNK_CORRUPT = "frame-chunk-corrupt"
    RECONCILE_SLOW = "reconcile-slow"
    RECONCILE_RAISES = "reconcile-raises"


BROKEN_FRAMES = frozenset(
    (FaultKind.FRAME_WITHOUT_NAME, FaultKind.FRAME_CUT, FaultKind.FRAME_CHUNK_CORRUPT)
)
"""Faults that break the frame of one write on each client's watch, timed from it."""

Step = OpKind | FaultKind
_PAIRS = ((OpKind.LEAVE, OpKind.REENTER), (OpKind.ORPHAN, OpKind.ADOPT))
_ORDERED = frozenset(op for pair in _PAIRS for op in pair)


def ci_plan(rng: random.Random, *, without: frozenset[str] = frozenset()) -> list[Step]:
    """Every operation and every fault at least once, in a seeded order, bulk churn included;
    the steps named in `without` are left out (the pairs that must keep their order excepted)."""
    ops: list[Step] = [kind for kind in OpKind if kind is not OpKind.CREATE]
    ops += [OpKind.CREATE, OpKind.MOVE, OpKind.RELABEL, OpKind.LEAVE, OpKind.REENTER]
    faults: list[Step] = list(FaultKind)
    ops = [op for op in ops if op.value not in without or op in _ORDERED]
    faults = [fault for fault in faults if fault.value not in without]
    rng.shuffle(ops)
    rng.shuffle(faults)
    plan: list[Step] = [OpKind.CREATE]
    while ops or faults:
        plan.append(ops.pop() if ops and (not faults or rng.random() < 0.6) else faults.pop())
    for first, then in _PAIRS:
        i, j = plan.index(first), plan.index(then)
        if j < i:
            plan[i], plan[j] = then, first
    return plan


def soak_step(rng: random.Random, index: int, *, without: frozenset[str] = frozenset()) -> Step:
    """Step `index` of a soak: bulk churn every `_BULK_EVERY` steps, else a fault a quarter of
    the time, kubelet churn a tenth of it (its steps last seconds each), and another operation
    otherwise, never one named in `without`."""
    if index % _BULK_EVERY == 0 and OpKind.BULK_CHURN.value not in without:
        return OpKind.BULK_CHURN
    faults = [kind for kind in FaultKind if kind.value not in without]
    if rng.random() < 0.25 and faults:
        return rng.choice(faults)
    churn = sorted(kind for kind in KUBELET_CHURN if kind.value not in without)
    if rng.random() < _CHURN_SHARE and churn:
        return rng.choice(churn)
    return rng.choice(
        [
            kind
            for kind in OpKind
            if kind is not OpKind.BULK_CHURN
            and kind not in KUBELET_CHURN
            and kind.value not in without
        ]
    )
