"""What a reconcile returns or raises to steer when its parent runs again. Go: controller-runtime's
``pkg/reconcile`` ``Result`` and ``TerminalError``.

A reconcile returns ``None`` (done: the parent runs again when its objects change or at resync,
the original contract) or a ``Result``; it raises to fail (retried with backoff) or raises
``TerminalError`` to fail for good (not retried). A raise cannot also return a result, so an error
always wins over a requeue: what controller-runtime does, with a warning, when a reconciler
returns both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Result:
    """Run this parent again ``requeue_after`` seconds from now (on the loop's clock), and forget
    its failures: controller-runtime's ``Result{RequeueAfter}``, which ``Forget``s the key and
    ``AddAfter``s it; kube-rs's ``Action::requeue``. ``None`` or 0 asks for nothing, as
    controller-runtime reads ``RequeueAfter: 0``. A parent queued again before the delay runs
    then too; an earlier requeue already waiting is kept (``AddAfter``'s earliest wins)."""

    requeue_after: float | None = None

    def __post_init__(self) -> None:
        after = self.requeue_after
        if after is None:
            return
        if isinstance(after, bool) or not isinstance(after, int | float):
            raise ValueError(f"requeue_after must be None or seconds >= 0, got {after!r}")
        if not math.isfinite(after) or after < 0:
            raise ValueError(f"requeue_after must be None or seconds >= 0, got {after!r}")


class TerminalError(Exception):
    """A failure retrying cannot mend: the loop logs it (one ERROR line naming the parent), counts
    it (``LoopStatus.terminal_failures``, ``controller_runtime_terminal_reconcile_errors_total``,
    and as a failure) and does not retry it; the parent runs again when its objects change or at
    resync. Raise it ``from`` the cause. Go: controller-runtime's ``reconcile.TerminalError(err)``;
    kopf's ``PermanentError``."""
