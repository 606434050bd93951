"""Constructor argument checks shared by the runtime's classes. Go: none (Go's types are checked
by the compiler; a zero ``time.Duration`` is Go's usual "off", which ``optional_period`` keeps).
"""

from __future__ import annotations

import math


def positive_finite(name: str, value: float) -> float:
    """``value`` as a float if it is a finite number above zero; else ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a finite positive number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number of seconds, got {value!r}")
    return float(value)


def delay_range(base_name: str, base: float, max_name: str, maximum: float) -> tuple[float, float]:
    """Two finite positive delays, the second at least the first; else ``ValueError`` naming the
    argument at fault (both, when they are out of order)."""
    low, high = positive_finite(base_name, base), positive_finite(max_name, maximum)
    if high < low:
        raise ValueError(f"{max_name} ({maximum!r}) must be at least {base_name} ({base!r})")
    return low, high


def optional_period(name: str, value: float | None) -> float | None:
    """A period that may be switched off: ``None`` or ``<= 0`` is off (``None``); a positive
    value must be finite; anything else is a ``ValueError`` naming the argument."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number of seconds or None, got {value!r}")
    if value <= 0:
        return None
    return positive_finite(name, value)


def positive_whole(name: str, value: float) -> int:
    """``value`` as an int if it is a whole number of at least one (``300`` or ``300.0``); else
    ``ValueError`` naming it. For seconds a server takes only as an integer."""
    number = positive_finite(name, value)
    if number < 1 or not number.is_integer():
        raise ValueError(f"{name} must be a whole number of seconds, at least 1, got {value!r}")
    return int(number)
