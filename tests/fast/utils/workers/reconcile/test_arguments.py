"""Constructor argument checks: finite positive delays, periods that None or <= 0 switch off."""

from __future__ import annotations

import math
from typing import Any

import pytest

from miles.utils.workers.reconcile.arguments import optional_period, positive_finite


@pytest.mark.parametrize("good", [0.001, 1, 2.5, 1e9])
def test_positive_finite_accepts_finite_positive_numbers(good: float) -> None:
    assert positive_finite("retry_delay", good) == float(good)


@pytest.mark.parametrize("bad", [0, -1, math.inf, -math.inf, math.nan, None, "1", True])
def test_positive_finite_names_the_argument_and_the_value(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"retry_delay .*got ") as raised:
        positive_finite("retry_delay", bad)
    assert repr(bad) in str(raised.value)


@pytest.mark.parametrize("off", [None, 0, -5.0, -math.inf])
def test_optional_period_is_off_for_none_and_non_positive(off: float | None) -> None:
    assert optional_period("resync_period", off) is None


@pytest.mark.parametrize("bad", [math.inf, math.nan, "10", False])
def test_optional_period_refuses_what_is_not_a_finite_period(bad: Any) -> None:
    with pytest.raises(ValueError, match="resync_period"):
        optional_period("resync_period", bad)
