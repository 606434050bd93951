"""Run a read-modify-write again when the apiserver answers Conflict. Go: client-go
``util/retry`` (``RetryOnConflict``, ``OnError``, ``DefaultRetry``, ``DefaultBackoff``).

``Steps`` is the most calls of the function, and a sleep of ``duration`` (times ``factor`` after
each) plus up to ``jitter`` of it comes between two calls, as apimachinery's
``wait.ExponentialBackoff`` with ``Jitter`` does. When the steps run out, the last error is raised.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.k8s_errors import is_conflict

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBackoff:
    """Go: ``wait.Backoff`` with ``Cap`` unset."""

    steps: int
    duration: float
    factor: float = 1.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"RetryBackoff steps must be at least 1, not {self.steps}")
        if not (self.duration >= 0 and self.factor >= 0 and self.jitter >= 0):
            raise ValueError("RetryBackoff duration, factor and jitter must not be negative")

    def delays(self, draw: Callable[[], float]) -> list[float]:
        """The sleeps between the ``steps`` calls, each with its jitter drawn from ``draw``."""
        delays, duration = [], self.duration
        for _ in range(self.steps - 1):
            delays.append(duration + (duration * self.jitter * draw() if self.jitter else 0.0))
            duration *= self.factor
        return delays


DEFAULT_RETRY = RetryBackoff(steps=5, duration=0.010, factor=1.0, jitter=0.1)
"""Go: ``retry.DefaultRetry``: at most 5 calls, about 10-11 ms apart."""
DEFAULT_BACKOFF = RetryBackoff(steps=4, duration=0.010, factor=5.0, jitter=0.1)
"""Go: ``retry.DefaultBackoff``: at most 4 calls, sleeping about 10, 50 and 250 ms."""


async def on_error(
    backoff: RetryBackoff,
    retriable: Callable[[BaseException], bool],
    fn: Callable[[], Awaitable[T]],
    *,
    clock: Clock | None = None,
    draw: Callable[[], float] = random.random,
) -> T:
    """``await fn()`` until it returns, raises an error ``retriable`` refuses, or has been called
    ``backoff.steps`` times (the last error is raised). Go: ``retry.OnError``."""
    sleep = (clock or RealClock()).sleep
    delays = backoff.delays(draw)
    for delay in delays:
        try:
            return await fn()
        except Exception as err:
            if not retriable(err):
                raise
        await sleep(delay)
    return await fn()


async def retry_on_conflict(
    fn: Callable[[], Awaitable[T]],
    *,
    backoff: RetryBackoff = DEFAULT_RETRY,
    clock: Clock | None = None,
    draw: Callable[[], float] = random.random,
) -> T:
    """``fn`` (which reads the object, changes it and writes it) again after a Conflict, as
    ``retry.RetryOnConflict(retry.DefaultRetry, fn)`` does. Go: ``retry.RetryOnConflict``."""
    return await on_error(backoff, is_conflict, fn, clock=clock, draw=draw)
