"""The write client: create, get, replace, patch, apply and delete one object of any kind, with
client-go's retries. Go: controller-runtime ``pkg/client`` + client-go ``rest`` and ``util/retry``.
"""

from miles.utils.workers.reconcile.client.client import (
    FIELD_MANAGER_MAX_LENGTH,
    Client,
    Preconditions,
    PropagationPolicy,
    status_error,
)
from miles.utils.workers.reconcile.client.conflict_retry import (
    DEFAULT_BACKOFF,
    DEFAULT_RETRY,
    RetryBackoff,
    on_error,
    retry_on_conflict,
)
from miles.utils.workers.reconcile.client.patches import (
    JsonPatch,
    MergePatch,
    Patch,
    StrategicMergePatch,
)
from miles.utils.workers.reconcile.k8s_transport import RawResponse, Request, Transport

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_RETRY",
    "FIELD_MANAGER_MAX_LENGTH",
    "Client",
    "JsonPatch",
    "MergePatch",
    "Patch",
    "Preconditions",
    "PropagationPolicy",
    "RawResponse",
    "Request",
    "RetryBackoff",
    "StrategicMergePatch",
    "Transport",
    "on_error",
    "retry_on_conflict",
    "status_error",
]
