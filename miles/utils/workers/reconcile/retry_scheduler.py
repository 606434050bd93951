"""Per-key exponential backoff, latest deadline wins. Go: workqueue rate limiter + delaying queue"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from miles.utils.workers.reconcile.arguments import delay_range
from miles.utils.workers.reconcile.clock import Clock
from miles.utils.workers.reconcile.log import NamedLogger

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

POLL_INTERVAL = 1.0
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class PendingRetry(Generic[K]):
    """A key waiting for its retry: ``failures`` in a row, due at ``due_at``."""

    key: K
    failures: int
    due_at: float
    last_error: str


class RetryScheduler(Generic[K]):
    """Hands each failed key back to ``on_retry`` after ``base * 2**(failures-1)``, capped at max.

    A new failure overwrites the key's deadline instead of adding a second one, so the delay always
    matches the latest failure. One poller, started here and cancelled by :meth:`shutdown`, sweeps
    the deadlines every ``POLL_INTERVAL``; a retry therefore fires at most one interval late.
    Both delays must be finite and positive, and the maximum at least the base (``ValueError``
    naming the argument otherwise), so no configuration retries without waiting.

    Once :meth:`cancel` or :meth:`shutdown` has run nothing fires again, so nothing is pending:
    the retries waiting are dropped and a failure noted later records nothing.
    """

    def __init__(
        self,
        *,
        on_retry: Callable[[K], None],
        failure_base_delay: float,
        failure_max_delay: float,
        clock: Clock,
        name: str = "reconcile",
    ) -> None:
        self._on_retry = on_retry
        self._base_delay, self._max_delay = delay_range(
            "failure_base_delay", failure_base_delay, "failure_max_delay", failure_max_delay
        )
        self._clock = clock
        self._log = NamedLogger(logger, name)
        self._failures: dict[K, int] = {}
        self._deadlines: dict[K, float] = {}
        self._errors: dict[K, str] = {}
        self.retries = 0
        """Failures noted so far: each schedules one retry (Go: ``workqueue_retries_total``)."""
        self._poller = asyncio.get_running_loop().create_task(
            self._poll(), name="reconcile-retry-poller"
        )

    def note_failure(self, key: K, error: str = "") -> float:
        """Schedules the key's retry; returns the delay until it is due, ``math.inf`` once the
        scheduler has stopped (nothing is recorded then)."""
        if self.stopped:
            return math.inf
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self._delay_after(failures)
        self._deadlines[key] = self._clock.time() + delay
        self._errors[key] = error
        self.retries += 1
        return delay

    def requeue_after(self, key: K, delay: float) -> None:
        """Hands ``key`` back after ``delay`` without counting a failure; a deadline already
        earlier is kept. Go: the delaying queue's ``AddAfter``. Like a retry, it fires at most one
        ``POLL_INTERVAL`` late; nothing is recorded once the scheduler has stopped."""
        if self.stopped:
            return
        due = self._clock.time() + delay
        current = self._deadlines.get(key)
        if current is None or due < current:
            self._deadlines[key] = due

    def note_success(self, key: K) -> None:
        if self._failures:
            self._failures.pop(key, None)
            self._deadlines.pop(key, None)
            self._errors.pop(key, None)

    def failures(self, key: K) -> int:
        """Failures in a row so far for ``key``; 0 after a success."""
        return self._failures.get(key, 0) if self._failures else 0

    def pending(self) -> list[PendingRetry[K]]:
        """The keys waiting for a retry, soonest first."""
        waiting = [
            PendingRetry(key, self._failures.get(key, 0), due_at, self._errors.get(key, ""))
            for key, due_at in self._deadlines.items()
        ]
        waiting.sort(key=lambda retry: retry.due_at)
        return waiting

    def _delay_after(self, failures: int) -> float:
        exponent = min(failures - 1, _MAX_EXPONENT)
        return float(min(self._base_delay * 2**exponent, self._max_delay))

    @property
    def stopped(self) -> bool:
        return self._poller.done() or self._poller.cancelling() > 0

    def cancel(self) -> None:
        """Stops the poller without waiting for it, and drops what was pending; ``shutdown()``
        still waits."""
        self._poller.cancel()
        self._failures.clear()
        self._deadlines.clear()
        self._errors.clear()

    async def shutdown(self) -> None:
        self.cancel()
        await asyncio.wait([self._poller])

    async def _poll(self) -> None:
        while True:
            await self._clock.sleep(POLL_INTERVAL)
            self._fire_due()

    def _fire_due(self) -> None:
        now = self._clock.time()
        for key in [key for key, deadline in self._deadlines.items() if deadline <= now]:
            del self._deadlines[key]
            try:
                self._on_retry(key)
            except Exception as exc:
                self._log.error("on_retry raised for key %r: %r", key, exc)
