"""The one report engine of ``bench/``: metrics, their rounds, medians, paired ratios and figures.

Go counterpart: none (benchmark report). A ratio compares two contenders within one round, and the
figure is the median of those per-round ratios, so that one noisy round moves neither side.
``advantage`` is how many times better the first side is (> 1: better); a cost is its inverse.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

Values = dict[str, float | None]
"""One contender's figures in one round, by metric key."""


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    scale: float
    higher_is_better: bool
    compared: bool = True
    """False: a description (a share, a count), not a cost to take ratios of or hold to a target."""


def advantage(metric: Metric, mine: float | None, theirs: float | None) -> float | None:
    """How many times better `mine` is than `theirs`; None unless both are positive."""
    if mine is None or theirs is None or min(mine, theirs) <= 0:
        return None
    return mine / theirs if metric.higher_is_better else theirs / mine


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values present, or None when none is."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def percentile(samples: Sequence[float], q: float) -> float | None:
    """The sample at rank `q` (nearest rank), or None when there is none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Results:
    """Every round's figures, by contender and then by metric key."""

    rounds: list[dict[str, Values]] = field(default_factory=list)

    def median(self, name: str, key: str) -> float | None:
        return median(self.per_round(name, key))

    def per_round(self, name: str, key: str) -> list[float | None]:
        return [r.get(name, {}).get(key) for r in self.rounds]

    def best(self, name: str, key: str, metric: Metric) -> float | None:
        """The best round's figure: interference only ever slows a run down."""
        present = [value for value in self.per_round(name, key) if value is not None]
        if not present:
            return None
        return max(present) if metric.higher_is_better else min(present)

    def advantages(
        self, key: str, metric: Metric, others: Sequence[str], *, mine: str = "ours"
    ) -> list[float]:
        """Per round, how many times better `mine` is than the best of `others` in that round."""
        ratios = []
        for r in self.rounds:
            theirs = [v for o in others if (v := r.get(o, {}).get(key)) is not None]
            best = (max(theirs) if metric.higher_is_better else min(theirs)) if theirs else None
            ratio = advantage(metric, r.get(mine, {}).get(key), best)
            if ratio is not None:
                ratios.append(ratio)
        return ratios

    def advantage(
        self, key: str, metric: Metric, others: Sequence[str], *, mine: str = "ours"
    ) -> float | None:
        """The median over rounds of `advantages`."""
        return median(self.advantages(key, metric, others, mine=mine))

    def cost(
        self, key: str, metric: Metric, others: Sequence[str], *, mine: str = "ours"
    ) -> float | None:
        """The median over rounds of what `mine` costs against the best of `others` (> 1: worse)."""
        return median([1 / ratio for ratio in self.advantages(key, metric, others, mine=mine)])


def fmt(value: float | None, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    scaled = value * scale
    if abs(scaled) >= 100:
        return f"{scaled:,.0f}"
    return f"{scaled:.2f}" if abs(scaled) >= 1 else f"{scaled:.3f}"
