"""What a ``ReconcileLoop`` reports to its metrics as it runs. Go: client-go's workqueue
``MetricsProvider`` (``util/workqueue/metrics.go``).

The loop calls a ``LoopMetrics`` and never hands it anything of its own; the Prometheus provider
(``metrics.ReconcileMetrics``, the ``metrics`` extra) is one implementation, and this module imports
neither it nor the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from miles.utils.workers.reconcile.clock import Clock
from miles.utils.workers.reconcile.status import SourceStatus

ReconcileResult = Literal["success", "error", "timeout", "stopped"]
"""How one reconcile ended (Go: CR's ``controller_runtime_reconcile_total`` ``result``):
``timeout`` is an error too, one that ran past ``reconcile_timeout`` and was cancelled;
``stopped``, the loop stopped during it (``stop()``, or it raised ``KeyboardInterrupt`` or
``SystemExit``): counted nowhere, but no longer in flight. Strings, not an ``enum.Enum``: an enum
member's class attribute costs a microsecond to read on Python 3.11, once per reconcile."""


class LoopMetrics(Protocol):
    """One loop's reports, in the order they happen. Every method is called on the loop's event
    loop, on its hot path: it must be cheap and must not raise (Go's metric interfaces return no
    error either)."""

    def added(self, count: int) -> None:
        """``count`` keys entered the queue (Go: ``queueMetrics.add``: adds and depth)."""

    def started(self, at: float) -> None:
        """The worker took the oldest queued key; its reconcile starts at ``at`` on the loop's
        clock (Go: ``queueMetrics.get``: depth and the time it waited)."""

    def finished(self, result: ReconcileResult) -> None:
        """The reconcile started last has ended (Go: ``queueMetrics.done`` and CR's
        ``ReconcileTotal``, ``ReconcileErrors``, ``ReconcileTime``)."""

    def retried(self) -> None:
        """A failed key was scheduled for a retry (Go: ``queueMetrics.retry``)."""


@runtime_checkable
class MetricsProvider(Protocol):
    """Makes the ``LoopMetrics`` of each loop given it, once, as the loop is constructed."""

    def loop_metrics(
        self, name: str, *, clock: Clock, source_status: Callable[[], SourceStatus]
    ) -> LoopMetrics | None:
        """The reports of the loop ``name``; ``None`` to measure nothing, and then the loop makes
        no call at all (Go: ``newQueueMetrics`` returns ``noMetrics`` for the no-op provider).
        ``source_status`` is the loop's public ``source_status``, for series read at scrape."""


class NoMetrics:
    """The default provider: nothing is measured. Go: ``noopMetricsProvider``."""

    def loop_metrics(
        self, name: str, *, clock: Clock, source_status: Callable[[], SourceStatus]
    ) -> LoopMetrics | None:
        return None
