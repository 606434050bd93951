"""Exponential backoff with jitter and a reset. Go: ``wait.Backoff`` + ``Backoff.DelayWithReset``.

client-go's Reflector backs its relists and reconnects off with 800 ms, factor 2, jitter 1.0, cap
30 s, reset every 2 minutes (``tools/cache/reflector.go``, since client-go commit b5668cea2).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.clock import Clock

DEFAULT_INITIAL = 0.8
DEFAULT_FACTOR = 2.0
DEFAULT_JITTER = 1.0
DEFAULT_CAP = 30.0
DEFAULT_RESET_AFTER = 120.0
MINIMUM_INITIAL = 0.001
"""A smaller ``initial`` is raised to this: from 5e-324, doubling would take 1,000 steps to reach
a second, one request each."""


class Backoff:
    """Delays that start at ``initial`` and double up to ``cap``, each stretched by a random
    ``[0, jitter)`` fraction of itself, as Go's ``wait.Jitter``; so a delay lies in
    ``[d, d * (1 + jitter))`` and is never zero. ``initial`` is at least ``MINIMUM_INITIAL``, so
    the steps from it to ``cap`` are at most 15.

    As Go's ``backoffManager.Step``, the first delay asked for more than ``reset_after`` seconds
    after the last reset starts over at ``initial``, failures or not: under faults that never
    stop, the steps climb to the cap and start over every ``reset_after``. The first delay ever
    asked for counts as a reset (Go's is the construction; nothing steps before either). ``reset()``
    starts over at once.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        initial: float = DEFAULT_INITIAL,
        factor: float = DEFAULT_FACTOR,
        jitter: float = DEFAULT_JITTER,
        cap: float = DEFAULT_CAP,
        reset_after: float = DEFAULT_RESET_AFTER,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._clock = clock
        self._initial = max(positive_finite("initial", initial), MINIMUM_INITIAL)
        self._factor = factor if factor >= 1.0 else 1.0
        self._jitter = max(0.0, jitter)
        self._cap = max(self._initial, positive_finite("cap", cap))
        self._reset_after = positive_finite("reset_after", reset_after)
        self._rand = rand
        self._next = self._initial
        self._last_reset: float | None = None

    @property
    def initial(self) -> float:
        return self._initial

    def next_delay(self) -> float:
        """The delay to wait now; the one after it grows by ``factor``, up to ``cap``."""
        now = self._clock.time()
        if self._last_reset is None or now - self._last_reset > self._reset_after:
            self._next = self._initial
            self._last_reset = now
        delay = self._next
        self._next = min(self._next * self._factor, self._cap)
        return delay + self._rand() * self._jitter * delay

    def reset(self) -> None:
        self._next = self._initial
        self._last_reset = self._clock.time()
