"""Per-key exponential backoff, latest deadline wins. Go: workqueue rate limiter + delaying queue"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from miles.utils.workers.reconcile.clock import Clock

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

POLL_INTERVAL = 1.0
_MAX_EXPONENT = 64


class RetryScheduler(Generic[K]):
    """Hands each failed key back to ``on_retry`` after ``base * 2**(failures-1)``, capped at max.

    A new failure overwrites the key's deadline instead of adding a second one, so the delay always
    matches the latest failure. One poller, started here and cancelled by :meth:`shutdown`, sweeps
    the deadlines every ``POLL_INTERVAL``; a retry therefore fires at most one interval late.
    """

    def __init__(
        self,
        *,
        on_retry: Callable[[K], None],
        failure_base_delay: float,
        failure_max_delay: float,
        clock: Clock,
    ) -> None:
        self._on_retry = on_retry
        self._base_delay = failure_base_delay
        self._max_delay = failure_max_delay
        self._clock = clock
        self._failures: dict[K, int] = {}
        self._deadlines: dict[K, float] = {}
        self._poller = asyncio.get_running_loop().create_task(
            self._poll(), name="reconcile-retry-poller"
        )

    def note_failure(self, key: K) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        self._deadlines[key] = self._clock.time() + self._delay_after(failures)

    def note_success(self, key: K) -> None:
        if self._failures:
            self._failures.pop(key, None)
            self._deadlines.pop(key, None)

    def _delay_after(self, failures: int) -> float:
        exponent = min(failures - 1, _MAX_EXPONENT)
        return float(min(self._base_delay * 2**exponent, self._max_delay))

    async def shutdown(self) -> None:
        self._poller.cancel()
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
                logger.error("on_retry raised for key %r: %r", key, exc)
