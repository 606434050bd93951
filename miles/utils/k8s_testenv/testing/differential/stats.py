"""What a differential run counts and prints. Go counterpart: none (test-side)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from miles.utils.k8s_testenv.testing.differential.scenario import FaultKind


@dataclass
class Convergence:
    """Seconds from a fault being healed to each view matching the fresh LIST for good;
    `reconciled` is when, in addition, every parent's last reconcile had read its final members.
    `client_go` is None when client-go did not converge and `client_go_diverged` says how, by Go's
    semantics (a ghost the harness predicted, `views.NamelessGhost`)."""

    ours: float
    client_go: float | None
    reconciled: float
    client_go_diverged: str | None = None


@dataclass
class Stats:
    ops: Counter[str] = field(default_factory=Counter)
    pool_ops: Counter[str] = field(default_factory=Counter)
    """Engine pool operations (`pool_writer.PoolOp`), one with each pod operation."""
    faults: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, str] = field(default_factory=dict)
    checkpoints: int = 0
    divergences: int = 0
    divergences_by_kind: Counter[str] = field(default_factory=Counter)
    """Which kind a divergence was in ("pods", "enginepools"; both when both differed)."""
    pool_checkpoints: int = 0
    """Checkpoints at which the engine pools' views were compared too."""
    our_lists: int = 0
    oracle_lists: int = 0
    our_relists: Counter[str] = field(default_factory=Counter)
    oracle_relists: Counter[str] = field(default_factory=Counter)
    convergence: dict[str, list[Convergence]] = field(default_factory=dict)
    kubelet: Counter[str] = field(default_factory=Counter)
    """Kubelet-written states of engine pods that ours, client-go and a fresh LIST agreed on."""
    client_go_diverged: Counter[str] = field(default_factory=Counter)
    """Faults after which client-go kept the deviation Go's semantics predict (not divergences:
    the harness restarts client-go after each and compares again)."""
    backend: str = "not started"
    """Where the pods ran (the real node, KWOK), as the report's first line says."""

    def report(self) -> str:
        lines = [
            f"pods ran on: {self.backend}",
            f"operations applied: {sum(self.ops.values())}  "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.ops.items())),
            f"faults injected:    {sum(self.faults.values())}  "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())),
            f"engine pool operations: {sum(self.pool_ops.values())}  "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.pool_ops.items())),
            f"checkpoints compared: {self.checkpoints} (engine pools compared at "
            f"{self.pool_checkpoints})",
            f"divergences: {self.divergences}"
            + "".join(f", {k}={v}" for k, v in sorted(self.divergences_by_kind.items())),
            f"relists (LISTs after the initial one): ours {max(0, self.our_lists - 1)}, "
            f"client-go {max(0, self.oracle_lists - 1)}",
            "convergence after each fault kind: seconds from healed until the store equals a fresh"
            " LIST for good, median / worst (one poll is about 0.1 s); `reconciled` also waits for"
            " every parent's last reconcile to have read its final members",
            f"  {'fault':<20} {'n':>3}  {'ours':>13}  {'client-go':>13}  {'ours reconciled':>15}"
            f"  {'relists ours/go':>15}",
        ]
        for kind in FaultKind:
            samples = self.convergence.get(kind, [])
            if not samples:
                continue
            ours = _med_max([s.ours for s in samples])
            go = _med_max([s.client_go for s in samples if s.client_go is not None])
            if diverged := self.client_go_diverged[kind]:
                go = f"never x{diverged}" if go == "-" else f"{go} +{diverged} never"
            reconciled = _med_max([s.reconciled for s in samples])
            relists = f"{self.our_relists[kind]}/{self.oracle_relists[kind]}"
            lines.append(
                f"  {kind.value:<20} {len(samples):>3}  {ours:>13}  {go:>13}  {reconciled:>15}"
                f"  {relists:>15}"
            )
        for after, count in sorted(self.client_go_diverged.items()):
            lines.append(
                f"client-go did not converge after {after} {count} time(s), as Go's semantics "
                "predict (each nameless object, pod or pool, stored under '<namespace>/', the "
                "object left stale); restarted each time, not counted as a divergence"
            )
        if self.kubelet:
            lines.append(
                "kubelet states agreed at checkpoints (engine pods on the real node): "
                + ", ".join(f"{k}={v}" for k, v in sorted(self.kubelet.items()))
            )
        for what, reason in sorted(self.skipped.items()):
            lines.append(f"skipped {what}: {reason}")
        return "\n".join(lines)


def _med_max(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"
