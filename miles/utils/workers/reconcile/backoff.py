"""Exponential backoff with jitter and a reset. Go: ``wait.Backoff`` + ``Backoff.DelayWithReset``.

client-go's Reflector backs its relists and reconnects off with 800 ms, factor 2, jitter 1.0, cap
30 s, reset every 2 minutes (``tools/cache/reflector.go``, since client-go commit b5668cea2).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

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


@dataclass(frozen=True, slots=True)
class BackoffSchedule:
    """``Backoff``'s arithmetic as a value, for a caller that decides purely: ``step(now, draw)``
    returns the delay to wait now and the schedule after it, ``draw`` standing for the random
    ``[0, 1)`` the jitter scales. Made by ``backoff_schedule``, which checks its arguments."""

    initial: float
    factor: float
    jitter: float
    cap: float
    reset_after: float
    upcoming: float
    last_reset: float | None = None

    def step(self, now: float, draw: float) -> tuple[float, BackoffSchedule]:
        base, reset_at = self.upcoming, self.last_reset
        if reset_at is None or now - reset_at > self.reset_after:
            base, reset_at = self.initial, now
        after = replace(self, upcoming=min(base * self.factor, self.cap), last_reset=reset_at)
        return base + draw * self.jitter * base, after

    def reset(self, now: float) -> BackoffSchedule:
        return replace(self, upcoming=self.initial, last_reset=now)


def backoff_schedule(
    *,
    initial: float = DEFAULT_INITIAL,
    factor: float = DEFAULT_FACTOR,
    jitter: float = DEFAULT_JITTER,
    cap: float = DEFAULT_CAP,
    reset_after: float = DEFAULT_RESET_AFTER,
) -> BackoffSchedule:
    """A schedule not stepped yet; ``ValueError`` names an ``initial``, ``cap`` or ``reset_after``
    that is not finite and positive."""
    first = max(positive_finite("initial", initial), MINIMUM_INITIAL)
    return BackoffSchedule(
        initial=first,
        factor=factor if factor >= 1.0 else 1.0,
        jitter=max(0.0, jitter),
        cap=max(first, positive_finite("cap", cap)),
        reset_after=positive_finite("reset_after", reset_after),
        upcoming=first,
    )


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
        self._rand = rand
        self._schedule = backoff_schedule(
            initial=initial, factor=factor, jitter=jitter, cap=cap, reset_after=reset_after
        )

    @property
    def initial(self) -> float:
        return self._schedule.initial

    def next_delay(self) -> float:
        """The delay to wait now; the one after it grows by ``factor``, up to ``cap``."""
        delay, self._schedule = self._schedule.step(self._clock.time(), self._rand())
        return delay

    def reset(self) -> None:
        self._schedule = self._schedule.reset(self._clock.time())
