"""Events about objects, as ``kubectl describe`` shows them: client-go's core/v1 recorder with its
spam filter, aggregation and retrying sink. Go: client-go ``tools/record``."""

from miles.utils.workers.reconcile.events.correlator import (
    AGGREGATE_PREFIX,
    Correlated,
    EventCorrelator,
)
from miles.utils.workers.reconcile.events.recorder import (
    MAX_QUEUED_EVENTS,
    MAX_TRIES_PER_EVENT,
    EventRecorder,
    EventSink,
    ObjectReference,
)
from miles.utils.workers.reconcile.events.sink import ClientEventSink

__all__ = [
    "AGGREGATE_PREFIX",
    "MAX_QUEUED_EVENTS",
    "MAX_TRIES_PER_EVENT",
    "ClientEventSink",
    "Correlated",
    "EventCorrelator",
    "EventRecorder",
    "EventSink",
    "ObjectReference",
]
