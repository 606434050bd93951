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

ReconcileResult = Literal["success", "error", "timeout", "stopped", "terminal"]
"""How one reconcile ended (Go: CR's ``controller_runtime_reconcile_total`` ``result``):
``timeout`` is an error too, one that ran past ``reconcile_timeout`` and was cancelled;
``terminal`` too, one that raised ``result.TerminalError`` and is not retried (CR counts it in
``controller_runtime_terminal_reconcile_errors_total`` besides the errors);
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

    def finished(self, result: ReconcileResult, started_at: float | None = None) -> None:
        """A reconcile has ended (Go: ``queueMetrics.done`` and CR's ``ReconcileTotal``,
        ``ReconcileErrors``, ``ReconcileTime``): with one worker the one started last, and then
        ``started_at`` is not passed; with several, the one started at ``started_at``, passed by
        keyword (so a provider written for one worker keeps working with the default)."""

    def retried(self) -> None:
        """A failed key was scheduled for a retry (Go: ``queueMetrics.retry``)."""


@runtime_checkable
class MetricsProvider(Protocol):
    """Makes the ``LoopMetrics`` of each loop given it, once, as the loop is constructed."""

    def loop_metrics(
        self,
        name: str,
        *,
        clock: Clock,
        source_status: Callable[[], SourceStatus],
        max_concurrent_reconciles: int = 1,
    ) -> LoopMetrics | None:
        """The reports of the loop ``name``; ``None`` to measure nothing, and then the loop makes
        no call at all (Go: ``newQueueMetrics`` returns ``noMetrics`` for the no-op provider).
        ``source_status`` is the loop's public ``source_status``, for series read at scrape.
        A loop with several workers also passes ``max_concurrent_reconciles=N`` (by keyword,
        only then, so a provider written for one worker keeps working with the default)."""


class NoMetrics:
    """The default provider: nothing is measured, whatever the loop passes. Go:
    ``noopMetricsProvider``."""

    def loop_metrics(self, name: str, **_: object) -> LoopMetrics | None:
        return None
