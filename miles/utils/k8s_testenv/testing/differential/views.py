"""The views a checkpoint compares, what each is expected to equal, and a readable diff.

Every view maps a pod name to its uid, resourceVersion and parent (the value of the parent label,
or None when the pod has none); the fresh LIST and our store also carry a one-line summary of the
status a kubelet writes (`status_summary`), which the oracle's snapshot does not report. The fresh
consistent LIST is the truth:
- client-go's store must equal it exactly, status aside (the same resourceVersion is the same
  object);
- our store must equal it minus the pods that have no parent, a deliberate deviation recorded in
  docs/reconcile-loop.md (`object_store.py`, `EnqueueRequestForOwner`): an object `key_map` cannot
  attribute is evicted, where Go would cache it; its status summary, read from our decoded `Pod`,
  must equal the one read from the LIST's JSON;
- what the last successful reconcile of each parent read must equal our store.

With engine pools watched too, a comparison holds a second one for them (`pools`), whose views
must equal what the pods' must (their status summary is `engine_pools.pool_summary`), and it
matches only when both do.

After a watch frame without a name, client-go's store of that kind is allowed one deviation,
which Go's semantics predict exactly (`NamelessGhost`, per pod and per pool); it is reported,
never counted as ours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from miles.utils.workers.reconcile.k8s_types import ContainerState, Pod

NOT_PRESENT = "-"


@dataclass(frozen=True)
class PodRow:
    uid: str
    resource_version: str
    parent: str | None
    status: str | None = None
    """`status_summary` of the pod; None where the view cannot report it (client-go's)."""

    def cell(self) -> str:
        status = f" [{self.status}]" if self.status is not None else ""
        return f"{self.uid[:8]} rv={self.resource_version} parent={self.parent}{status}"


View = Mapping[str, PodRow]


def ours_expected(truth: View) -> dict[str, PodRow]:
    """The deliberate deviation, explicitly: pods without a parent are not in our store."""
    return {name: row for name, row in truth.items() if row.parent is not None}


def without_status(view: View) -> dict[str, PodRow]:
    return {name: replace(row, status=None) for name, row in view.items()}


def status_summary(
    *,
    phase: str | None,
    ready: str | None,
    deleting: bool,
    containers: Iterable[tuple[str | None, bool | None, int, str, int | None]],
) -> str:
    """`Running ready=True` (+ ` deleting`), then per container `name ready=… r=restarts state
    last=exit code`: the fields a kubelet's crash, restart, probe and graceful delete change."""
    head = f"{phase} ready={ready}" + (" deleting" if deleting else "")
    return "; ".join(
        [head]
        + [
            f"{name} ready={ok} r={restarts} {state} last={last}"
            for name, ok, restarts, state, last in containers
        ]
    )


def _state_of_json(state: Mapping[str, Any]) -> str:
    if (waiting := state.get("waiting")) is not None:
        return f"waiting:{waiting.get('reason')}"
    if (terminated := state.get("terminated")) is not None:
        return f"terminated:{terminated.get('exitCode')}"
    return "running" if state.get("running") is not None else "none"


def status_of_json(pod: Mapping[str, Any]) -> str:
    """`status_summary` of a pod as the apiserver sent it (JSON)."""
    status = pod.get("status") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"), None
    )
    return status_summary(
        phase=status.get("phase"),
        ready=ready,
        deleting=pod["metadata"].get("deletionTimestamp") is not None,
        containers=(
            (
                c.get("name"),
                c.get("ready"),
                c.get("restartCount", 0),
                _state_of_json(c.get("state") or {}),
                ((c.get("lastState") or {}).get("terminated") or {}).get("exitCode"),
            )
            for c in status.get("containerStatuses") or ()
        ),
    )


def _state_of(state: ContainerState) -> str:
    if state.waiting is not None:
        return f"waiting:{state.waiting.reason}"
    if state.terminated is not None:
        return f"terminated:{state.terminated.exit_code}"
    return "running" if state.running is not None else "none"


def status_of_pod(pod: Pod) -> str:
    """`status_summary` of a pod as our store decoded it."""
    status = pod.status
    ready = next((c.status for c in status.conditions if c.type == "Ready"), None)
    return status_summary(
        phase=status.phase,
        ready=ready,
        deleting=pod.metadata.deletion_timestamp is not None,
        containers=(
            (
                c.name,
                c.ready,
                c.restart_count,
                _state_of(c.state),
                c.last_state.terminated.exit_code if c.last_state.terminated else None,
            )
            for c in status.container_statuses
        ),
    )


@dataclass(frozen=True)
class Comparison:
    """One poll of every view; `matches` says which of them equal what they should."""

    truth: View
    ours: View
    oracle: View
    reconciled: View
    pools: Comparison | None = None
    """The same four views of the engine pools, where the harness watches them."""

    @property
    def ours_matches(self) -> bool:
        return dict(self.ours) == ours_expected(self.truth) and (
            self.pools is None or self.pools.ours_matches
        )

    @property
    def oracle_matches(self) -> bool:
        return self.pod_oracle_matches and (self.pools is None or self.pools.oracle_matches)

    @property
    def pod_oracle_matches(self) -> bool:
        return dict(self.oracle) == without_status(self.truth)

    @property
    def reconciled_matches(self) -> bool:
        return dict(self.reconciled) == dict(self.ours) and (
            self.pools is None or self.pools.reconciled_matches
        )

    def kinds_differing(self) -> list[str]:
        """Which kinds some view gets wrong: "pods", "enginepools"."""
        kinds = [] if self._pods_match() else ["pods"]
        if self.pools is not None and not self.pools.all_match:
            kinds.append("enginepools")
        return kinds

    def _pods_match(self) -> bool:
        return (
            dict(self.ours) == ours_expected(self.truth)
            and self.pod_oracle_matches
            and dict(self.reconciled) == dict(self.ours)
        )

    @property
    def all_match(self) -> bool:
        return self.ours_matches and self.oracle_matches and self.reconciled_matches

    def describe(self) -> str:
        pods = self._describe_own()
        if self.pools is None or self.pools.all_match:
            return pods
        return f"{pods}\nengine pools:\n{self.pools.describe()}"

    def _describe_own(self) -> str:
        return render_diff(
            {
                "fresh LIST": self.truth,
                "ours": self.ours,
                "client-go": self.oracle,
                "reconciled": self.reconciled,
            },
            expected={
                "fresh LIST": self.truth,
                "ours": ours_expected(self.truth),
                "client-go": without_status(self.truth),
                "reconciled": self.ours,
            },
        )


GHOST_NAME = ""
"""The name of a nameless object in client-go's snapshot; its store keys it `namespace/`."""


@dataclass(frozen=True)
class NamelessGhost:
    """What client-go does with a watch frame whose object has no name. The frame decodes, the
    reflector's `handleAnyWatch` hands it to `store.Update`, `MetaNamespaceKeyFunc` keys it
    `namespace/` (`ObjectName.String` of an empty name), and the store holds the object's new
    state there while the object itself stays at its older resourceVersion, its cursor now past
    the write, until something relists (client-go v0.36 `tools/cache/reflector.go`,
    `object-names.go`). The dynamic informer over engine pools decodes `unstructured` the same way,
    so `pool` names the pool whose frame lost its name on the pools' watch, if one did."""

    pod: str
    pool: str | None = None

    def explain(self, comparison: Comparison) -> str | None:
        """How client-go's views are each either right or exactly their ghost, at least one a
        ghost; None otherwise."""
        kept = _ghost_kept(comparison.truth, comparison.oracle, self.pod)
        if kept is None:
            return None
        said = [] if kept == "" else [f"{kept} (pods)"]
        if comparison.pools is not None:
            pool_kept = (
                None
                if self.pool is None
                else _ghost_kept(comparison.pools.truth, comparison.pools.oracle, self.pool)
            )
            if pool_kept is None:
                return None
            if pool_kept:
                said.append(f"{pool_kept} (engine pools)")
        if not said:
            return None
        return "; ".join(said)


def _ghost_kept(truth_view: View, oracle_view: View, name: str) -> str | None:
    """ "" where client-go's view equals the LIST, how it keeps exactly the ghost of `name` where
    it does, None where it is wrong otherwise."""
    truth = without_status(truth_view)
    oracle = dict(oracle_view)
    if oracle == truth:
        return ""
    ghost, now = oracle.pop(GHOST_NAME, None), truth.get(name)
    stale = oracle.get(name)
    if ghost is None or now is None or stale is None or ghost != now:
        return None
    if stale.uid != now.uid or stale.resource_version == now.resource_version:
        return None
    if {**oracle, name: now} != truth:
        return None
    return (
        f"client-go stored the frame without a name under the key '<namespace>/' "
        f"(rv={now.resource_version}) and kept {name} at rv={stale.resource_version}"
    )


def render_diff(views: Mapping[str, View], *, expected: Mapping[str, View]) -> str:
    """A table of every pod some view gets wrong: one line per pod, one column per view, each
    wrong cell marked with `!`; a view that is right everywhere is said to be so."""
    names = sorted({name for view in (*views.values(), *expected.values()) for name in view})
    wrong = {label: _wrong_names(views[label], expected[label], names) for label in views}
    rows = sorted(set().union(*wrong.values()))
    header = [f"{len(rows)} object(s) differ; `!` marks a cell that differs from what it should be"]
    for label, view in views.items():
        verdict = "matches" if not wrong[label] else f"{len(wrong[label])} wrong"
        header.append(f"  {label:<11} {len(view):>4} pods, {verdict}")
    lines = [f"  {'pod':<14}" + "".join(f"{label:<44}" for label in views)]
    for name in rows:
        cells = []
        for label, view in views.items():
            row = view.get(name)
            text = row.cell() if row is not None else NOT_PRESENT
            mark = "!" if name in wrong[label] else " "
            cells.append(f"{mark}{text:<43}")
        lines.append(f"  {name:<14}" + "".join(cells))
    return "\n".join(header + lines)


def _wrong_names(view: View, expected: View, names: Iterable[str]) -> set[str]:
    return {name for name in names if view.get(name) != expected.get(name)}


def view_of(
    pods: Iterable[tuple[str, str, str, Mapping[str, str]]],
    *,
    parent_of: Callable[[Mapping[str, str]], str | None],
) -> dict[str, PodRow]:
    """A view from (name, uid, resourceVersion, labels) tuples."""
    return {
        name: PodRow(uid=uid, resource_version=rv, parent=parent_of(labels))
        for name, uid, rv, labels in pods
    }


def view_of_json(
    items: Iterable[Mapping[str, Any]], *, parent_of: Callable[[Mapping[str, str]], str | None]
) -> dict[str, PodRow]:
    """A view of a LIST's items, status summaries included."""
    return {
        item["metadata"]["name"]: PodRow(
            uid=item["metadata"]["uid"],
            resource_version=item["metadata"]["resourceVersion"],
            parent=parent_of(item["metadata"].get("labels") or {}),
            status=status_of_json(item),
        )
        for item in items
    }
