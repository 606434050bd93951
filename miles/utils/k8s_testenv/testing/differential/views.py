"""The views a checkpoint compares, what each is expected to equal, and a readable diff.

Every view maps a pod name to its uid, resourceVersion and parent (the value of the parent label,
or None when the pod has none). The fresh consistent LIST is the truth:
- client-go's store must equal it exactly;
- our store must equal it minus the pods that have no parent, a deliberate deviation recorded in
  docs/reconcile-loop.md (`object_store.py`, `EnqueueRequestForOwner`): an object `key_map` cannot
  attribute is evicted, where Go would cache it;
- what the last successful reconcile of each parent read must equal our store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

NOT_PRESENT = "-"


@dataclass(frozen=True)
class PodRow:
    uid: str
    resource_version: str
    parent: str | None

    def cell(self) -> str:
        return f"{self.uid[:8]} rv={self.resource_version} parent={self.parent}"


View = Mapping[str, PodRow]


def ours_expected(truth: View) -> dict[str, PodRow]:
    """The deliberate deviation, explicitly: pods without a parent are not in our store."""
    return {name: row for name, row in truth.items() if row.parent is not None}


@dataclass(frozen=True)
class Comparison:
    """One poll of every view; `matches` says which of them equal what they should."""

    truth: View
    ours: View
    oracle: View
    reconciled: View

    @property
    def ours_matches(self) -> bool:
        return dict(self.ours) == ours_expected(self.truth)

    @property
    def oracle_matches(self) -> bool:
        return dict(self.oracle) == dict(self.truth)

    @property
    def reconciled_matches(self) -> bool:
        return dict(self.reconciled) == dict(self.ours)

    @property
    def all_match(self) -> bool:
        return self.ours_matches and self.oracle_matches and self.reconciled_matches

    def describe(self) -> str:
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
                "client-go": self.truth,
                "reconciled": self.ours,
            },
        )


def render_diff(views: Mapping[str, View], *, expected: Mapping[str, View]) -> str:
    """A table of every pod some view gets wrong: one line per pod, one column per view, each
    wrong cell marked with `!`; a view that is right everywhere is said to be so."""
    names = sorted({name for view in (*views.values(), *expected.values()) for name in view})
    wrong = {label: _wrong_names(views[label], expected[label], names) for label in views}
    rows = sorted(set().union(*wrong.values()))
    header = [f"{len(rows)} pod(s) differ; `!` marks a cell that differs from what it should be"]
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
