"""Which failed requests the write client sends again, and after how long. Go: client-go
``rest/with_retry.go`` (``IsNextRetry``, ``checkWait``) and ``rest/request.go`` (``maxRetries``).

The policy is client-go's, recorded in docs/reconcile-loop.md: a 429 or 5xx answer is retried only
when it carries ``Retry-After`` in whole seconds, after that long, at most ``MAX_RETRIES`` times; a
5xx without it is the caller's to retry (a 500 or 504 to a POST may follow a write the apiserver
made). A connection that broke (reset, cut mid-answer) is retried for GET only, after
``CONNECTION_RETRY_AFTER`` (client-go fakes a 500 with ``Retry-After: 1``): a write whose
connection broke may have been made, so it is never sent again blindly; the caller reads the
outcome (an AlreadyExists on its next create by name is that outcome). A refused connection or a
client deadline is not retried here either: the reconcile's own backoff does.
"""

from __future__ import annotations

from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConnectionError,
)

MAX_RETRIES = 10
"""Go: ``rest.NewRequest``'s ``maxRetries``."""
CONNECTION_RETRY_AFTER = 1.0
"""Go: ``retryAfterResponse()``'s ``Retry-After: 1``."""


def retry_delay(method: str, failure: Exception, retries: int) -> float | None:
    """Seconds to wait before sending the request again after ``failure`` (its ``retries``-th
    retry would come next), or ``None`` when it must not be sent again."""
    if retries >= MAX_RETRIES:
        return None
    if isinstance(failure, KubernetesApiError):
        throttled = failure.code == 429 or failure.code >= 500
        wait = failure.retry_after
        # Go reads Retry-After with strconv.Atoi: "1.5" or an HTTP-date is no retry.
        return wait if throttled and wait is not None and wait.is_integer() else None
    if isinstance(failure, KubernetesConnectionError):
        broken = failure.kind is ConnectionFailure.BROKEN
        return CONNECTION_RETRY_AFTER if broken and method == "GET" else None
    return None
