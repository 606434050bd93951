"""LIST (or stream the list), then WATCH from its cursor, as a stream of source events.
Go: ``cache.Reflector``.

Each ``watch()`` call runs one state machine (kube-rs ``watcher::State``'s shape). The state is a
sum type: one frozen class per phase, carrying only what that phase needs. An action performs the
phase's one request (or sleep) and ends in an outcome; ``_transition(state, outcome, ...)``, pure,
alone decides the next state and its effects (the line to log, the relist to count, the error to
report), the backoff's delay and ``Retry-After`` count included, from the clock's time and a
random draw it is handed. The driver performs the actions and applies the effects. The phases, and
the ``status.SourcePhase`` each reports:

- ``_Listing`` (LISTING, or RELISTING with its ``relist_reason``): one consistent LIST
  (resourceVersion unset), paged when the API is a ``PagedPodApi`` (``k8s_pager``), as one
  ``ReplaceEvent``.
- ``_StreamListing`` (the same): a streaming list when asked for and the API is a
  ``StreamingListPodApi``: the initial ADDED events are buffered until the
  ``k8s.io/initial-events-end`` bookmark, then sent as one ``ReplaceEvent``, and the same stream
  goes on as the WATCH (client-go's ``watchList``).
- ``_Probing`` (WATCHING): a LIST of at most one pod not older than the cursor, with a
  ``PagedPodApi`` only.
- ``_Watching`` (WATCHING): follow a watch from the cursor, or the streaming list it was handed;
  pod frames become events, bookmarks move the cursor. A frame that cannot be read (bytes that
  are not a frame, a pod without a name, a pod frame without a pod, from any API) ends the watch
  and relists after one backoff step, as Go's ``StreamWatcher`` turns an undecodable event into a
  ``watch.Error``.
- ``_BackingOff`` (BACKING_OFF): wait its ``delay``, then go on to the state it holds. The delay
  is one step of ``backoff.Backoff``'s schedule (``retry_delay`` doubling to 30 s, jitter 1.0,
  starting over every 2 minutes); a failure that carries ``Retry-After`` waits just that, up to
  ``RETRY_AFTER_RETRIES`` times in a row (the count starts over at any progress made at once), as
  client-go's REST client retries it.

Invariants:

1. Every stream opens with a ``ReplaceEvent`` of a consistent listing, and every later
   ``ReplaceEvent`` is another one.
2. Every failure passes through ``BACKOFF`` before the next request, so no server fault drives
   more than one LIST (or any request) per backoff step. Only progress moves on at once: a
   listing, an accepted probe, a watch that delivered a frame or lasted a second before it
   closed or its connection broke; and a streaming list that failed other than throttled or
   refused falls back to its one LIST at once, as client-go's does.
3. A cursor the server rejects (410, 504, a Status reason Expired or Gone:
   ``exception_rejects_cursor``) is never used again: the next listing replaces it. A failed
   watch relists unless the failure keeps the cursor: 429 or connection refused
   (``exception_keeps_cursor``, Go's ``isWatchErrorRetriable``) retry the watch, and a connection
   that broke or went silent mid-watch re-watches from the cursor, as Go's ``StreamWatcher`` reads
   a probable EOF as a close.
4. With a probe, every re-watch is preceded by a probe of its cursor, so a server whose history
   was rolled back (etcd restored from a snapshot) rejects the cursor with 504 before new writes
   can carry the watch past it; a plain watch from a cursor beyond the server's head is accepted
   and stays silent, or picks up at the wrong revision once writes arrive. A probe the server
   never answers (refused, reset) relists: a server that was gone restarts, and once new writes
   pass the cursor no resourceVersion can tell a restored history from ours.
5. Nothing a frame contains ends the stream; only the consumer closing it does.
6. Only ``_transition`` chooses a next state or a delay, and it reads nothing but its arguments;
   an action only reports what happened, and the driver only does what a step says.
7. With ``consistency_check_period`` (opt-in), each watch asks the server to close it by the time
   the period since the last listing has passed, and that close relists at once (relist reason
   ``consistency check``) as a ``ReplaceEvent`` marked ``check``, which the store compares by uid
   and resourceVersion and applies only where it differs: what a history that went back loses
   once writes pass the cursor is bounded by the period. Nothing is added per WATCH event.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from miles.utils.workers.reconcile.arguments import positive_finite, positive_whole
from miles.utils.workers.reconcile.backoff import DEFAULT_INITIAL, BackoffSchedule, backoff_schedule
from miles.utils.workers.reconcile.clock import Clock, RealClock
from miles.utils.workers.reconcile.k8s_errors import (
    TOO_MANY_REQUESTS,
    FrameDecodeError,
    KubernetesConnectionError,
    exception_is_refused,
    exception_keeps_cursor,
    exception_rejects_cursor,
    exception_retry_after,
)
from miles.utils.workers.reconcile.k8s_interfaces import (
    KubernetesPodApi,
    PagedPodApi,
    ResourceApi,
    StreamingListPodApi,
)
from miles.utils.workers.reconcile.k8s_pager import LIST_PAGE_SIZE, list_in_pages
from miles.utils.workers.reconcile.k8s_values import ListOptions, PodWatchEvent, WatchEvent
from miles.utils.workers.reconcile.log import NamedLogger, default_loop_name, one_line
from miles.utils.workers.reconcile.resource import PODS, Resource
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)
from miles.utils.workers.reconcile.status import SourcePhase, SourceStatus

__all__ = [
    "BOOKMARK_INTERVAL_SECONDS",
    "CONSISTENCY_CHECK",
    "DEFAULT_RETRY_DELAY",
    "LIST_PAGE_SIZE",
    "PROBE_LIMIT",
    "RETRY_AFTER_RETRIES",
    "SUSPECT_AFTER_SECONDS",
    "VERY_SHORT_WATCH_SECONDS",
    "KubernetesReflector",
]

logger = logging.getLogger(__name__)

VERY_SHORT_WATCH_SECONDS = 1.0
"""Go's ``VeryShortWatchError``: a watch this short that saw no frame is a failure, not a close."""
PROBE_LIMIT = 1
"""Items a cursor probe asks for: it checks the cursor, the page itself is dropped."""
DEFAULT_RETRY_DELAY = DEFAULT_INITIAL
"""The first backoff step, client-go's 800 ms (``defaultBackoffInit``)."""
RETRY_AFTER_RETRIES = 10
"""Failures in a row whose ``Retry-After`` is waited instead of a backoff step: client-go's REST
client retries such a response itself, ``maxRetries`` (10) times, before its caller sees it."""
BOOKMARK_INTERVAL_SECONDS = 60.0
"""How often a watch-cache apiserver sends a bookmark on an idle watch
(``defaultBookmarkFrequency``, apiserver ``storage/cacher``)."""
SUSPECT_AFTER_SECONDS = 2 * BOOKMARK_INTERVAL_SECONDS
"""A watch that has delivered no frame for this long, nor been re-opened, is reported suspect."""
NOT_SERVED_RETRY_SECONDS = 10.0
"""How often a listing the server refused as not served (404: a CRD not installed, a typo in the
group) or forbidden (403: RBAC) is tried again: controller-runtime's ``Kind`` source polls
``GetInformer`` every 10 s (``pkg/internal/source/kind.go``), so a CRD installed meanwhile is
picked up within that."""
_NOT_SERVED = {
    404: "not served: {} (a CRD not installed yet, or a typo in the group)",
    403: "forbidden: {} (RBAC: no Role or ClusterRole lets this user list it)",
}
TOO_LARGE = "cursor too large"
_SERVER_REVISION = re.compile(r"current: (\d+)")
CONSISTENCY_CHECK = "consistency check"
"""The relist reason of the opt-in periodic consistency LIST (``consistency_check_period``)."""


@dataclass(frozen=True, slots=True)
class _Listing:
    """LIST; ``relist_reason`` says why, for any listing after the first."""

    relist_reason: str | None = None


@dataclass(frozen=True, slots=True)
class _StreamListing:
    """A streaming list; ``relist_reason`` as ``_Listing``'s."""

    relist_reason: str | None = None


@dataclass(frozen=True, slots=True)
class _Probing:
    cursor: str


@dataclass(frozen=True, slots=True)
class _Watching:
    """``stream``: the streaming list this watch goes on following, else a watch is opened from
    ``cursor``. ``restart``: a re-watch, not the watch right after a listing."""

    cursor: str
    stream: AsyncIterator[PodWatchEvent] | None = None
    restart: bool = False


_Active = _Listing | _StreamListing | _Probing | _Watching


@dataclass(frozen=True, slots=True)
class _BackingOff:
    then: _Active
    delay: float


_State = _Active | _BackingOff


def _source_phase(state: _State) -> SourcePhase:
    """The one phase enum: what ``source_status()`` reports for a state."""
    if isinstance(state, _BackingOff):
        return SourcePhase.BACKING_OFF
    if isinstance(state, _Listing | _StreamListing):
        return SourcePhase.LISTING if state.relist_reason is None else SourcePhase.RELISTING
    return SourcePhase.WATCHING


@dataclass(frozen=True, slots=True)
class _Listed:
    cursor: str
    stream: AsyncIterator[PodWatchEvent] | None = None


@dataclass(frozen=True, slots=True)
class _Closed:
    """A watch (or a streaming list) that ended without an error; ``check_due`` when the opt-in
    consistency check's period has passed since the last listing."""

    cursor: str
    frames: int
    lasted: float
    check_due: bool = False


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException
    cursor: str = ""
    frames: int = 0
    lasted: float = 0.0


@dataclass(frozen=True, slots=True)
class _Accepted:
    """A probe the server accepted."""

    cursor: str


@dataclass(frozen=True, slots=True)
class _Waited:
    """A backoff waited out."""


_Outcome = _Listed | _Closed | _Failed | _Accepted | _Waited


class WatchErrorFrame(Exception):
    """An in-band ERROR frame, as the failure it ends the watch with."""

    def __init__(self, frame: PodWatchEvent) -> None:
        super().__init__(frame.reason or f"code {frame.code}")
        self.frame = frame


class _Verdict(enum.Enum):
    CURSOR_DEAD = "the cursor is dead"
    KEEPS_CURSOR = "throttled or refused"
    INTERRUPTED = "the connection broke"
    FAILED = "failed"


def _verdict(err: BaseException) -> _Verdict:
    if isinstance(err, WatchErrorFrame):
        if err.frame.rejects_cursor:
            return _Verdict.CURSOR_DEAD
        return _Verdict.KEEPS_CURSOR if err.frame.code == TOO_MANY_REQUESTS else _Verdict.FAILED
    if exception_rejects_cursor(err):
        return _Verdict.CURSOR_DEAD
    if exception_keeps_cursor(err):
        return _Verdict.KEEPS_CURSOR
    if isinstance(err, ConnectionError | TimeoutError):
        return _Verdict.INTERRUPTED
    return _Verdict.FAILED


def _unanswered(err: BaseException) -> bool:
    """A request the server never answered: the connection was refused, reset or broke (a read
    deadline aside, which a slow server can also reach)."""
    if isinstance(err, KubernetesConnectionError) and err.idle:
        return False
    return isinstance(err, ConnectionError) or exception_is_refused(err)


def _relist_reason(err: BaseException) -> str:
    code = err.frame.code if isinstance(err, WatchErrorFrame) else getattr(err, "code", None)
    if _verdict(err) is _Verdict.CURSOR_DEAD:
        return TOO_LARGE if code == 504 else "cursor expired"
    if isinstance(err, FrameDecodeError):
        return "frame unreadable"
    return "watch failed"


@dataclass(frozen=True, slots=True)
class _Caps:
    streams: bool
    probes: bool
    noun: str = "pod"
    resource: str = 'pods (group "", version v1)'

    def listing(self, relist_reason: str | None = None) -> _Listing | _StreamListing:
        return _StreamListing(relist_reason) if self.streams else _Listing(relist_reason)


@dataclass(frozen=True, slots=True)
class _Pacing:
    """How long the next backoff waits: the backoff's schedule, and the failures in a row whose
    ``Retry-After`` was waited instead of a step."""

    schedule: BackoffSchedule
    retries_after: int = 0

    def wait(self, retry_after: float, now: float, draw: float) -> tuple[float, _Pacing]:
        """A server's ``Retry-After`` alone, ``RETRY_AFTER_RETRIES`` times in a row (at least the
        first step, so a zero cannot spin); then, and for every other failure, a backoff step of
        at least that long."""
        if retry_after > 0 and self.retries_after < RETRY_AFTER_RETRIES:
            waited = replace(self, retries_after=self.retries_after + 1)
            return max(retry_after, self.schedule.initial), waited
        delay, schedule = self.schedule.step(now, draw)
        return max(delay, retry_after), _Pacing(schedule)


@dataclass(frozen=True, slots=True)
class _Decision:
    """Where an outcome leads: ``then``, after a backoff (``retry_after``, the least wait a server
    asked for) or at once; what happened, for anything but routine progress, at ``level``;
    ``relist`` when it starts one."""

    then: _Active
    backoff: bool = False
    retry_after: float = 0.0
    what: str | None = None
    level: int = logging.WARNING
    relist: str | None = None
    fixed_delay: float | None = None


@dataclass(frozen=True, slots=True)
class _Step:
    """A transition: the next state, the pacing after it, and its effects for the driver: the
    line to log (``what`` and the next move, at ``level``), the relist to count, the error to
    report."""

    state: _State
    pacing: _Pacing
    what: str | None = None
    level: int = logging.WARNING
    relist: str | None = None
    error: str | None = None


def _transition(
    state: _State, outcome: _Outcome, caps: _Caps, pacing: _Pacing, *, now: float, draw: float
) -> _Step:
    """The reflector's one transition function; see the module docstring for its invariants.
    ``now`` is the clock's time and ``draw`` a random ``[0, 1)`` for the backoff's jitter."""
    if isinstance(state, _BackingOff):
        return _Step(state.then, pacing)
    assert not isinstance(outcome, _Waited), f"{state} cannot wait"
    decision = _decide(state, outcome, caps)
    error = one_line(outcome.error, 500) if isinstance(outcome, _Failed) else None
    if decision.fixed_delay is not None and decision.what is not None:
        error = decision.what[:500]  # a refusal's line names the resource the error does not
    effects = (decision.what, decision.level, decision.relist, error)
    if not decision.backoff:
        return _Step(decision.then, replace(pacing, retries_after=0), *effects)
    if decision.fixed_delay is not None:
        return _Step(_BackingOff(decision.then, decision.fixed_delay), pacing, *effects)
    delay, paced = pacing.wait(decision.retry_after, now, draw)
    return _Step(_BackingOff(decision.then, delay), paced, *effects)


def _decide(
    state: _Active, outcome: _Listed | _Closed | _Failed | _Accepted, caps: _Caps
) -> _Decision:
    if isinstance(outcome, _Failed):
        return _after_failure(state, outcome, caps)
    if isinstance(outcome, _Listed):
        return _Decision(_Watching(outcome.cursor, outcome.stream))
    if isinstance(outcome, _Accepted):
        return _Decision(_Watching(outcome.cursor, restart=True))
    if isinstance(state, _StreamListing):
        return _Decision(
            _Listing(state.relist_reason),
            what=f"streaming list closed after {outcome.frames} frames without the "
            "initial-events-end bookmark; falling back to a LIST",
        )
    if outcome.check_due:
        return _Decision(
            caps.listing(CONSISTENCY_CHECK),
            what=f"consistency check: relisting {caps.resource} at resourceVersion unset "
            f"(cursor {outcome.cursor})",
            level=logging.INFO,
            relist=CONSISTENCY_CHECK,
        )
    rewatch = _rewatch(outcome.cursor, caps)
    if outcome.frames == 0 and outcome.lasted < VERY_SHORT_WATCH_SECONDS:
        what = (
            f"very short {caps.noun} watch: closed after {outcome.lasted:.3f}s with no frame, "
            f"resourceVersion={outcome.cursor}"
        )
        return _backoff(rewatch, what, None)
    return _Decision(rewatch)


def _after_failure(state: _Active, outcome: _Failed, caps: _Caps) -> _Decision:
    err = outcome.error
    if isinstance(state, _Listing | _StreamListing) and (refusal := _not_served(err, caps)):
        return _Decision(
            state, True, what=refusal, level=logging.ERROR, fixed_delay=NOT_SERVED_RETRY_SECONDS
        )
    if isinstance(state, _Listing):
        what = f"{caps.noun} LIST failed: {one_line(err)}"
        return _backoff(caps.listing(state.relist_reason), what, err)
    if isinstance(state, _StreamListing):
        what = f"streaming list failed: {one_line(err)}"
        if _verdict(err) is _Verdict.KEEPS_CURSOR:
            return _backoff(state, what, err)
        return _Decision(_Listing(state.relist_reason), what=f"{what}; falling back to a LIST")
    if isinstance(state, _Probing):
        return _after_failed_probe(state, err, caps)
    return _after_failed_watch(state, outcome, caps)


def _not_served(err: BaseException, caps: _Caps) -> str | None:
    """The line for a listing refused as not served (404) or forbidden (403), else ``None``."""
    code = err.frame.code if isinstance(err, WatchErrorFrame) else getattr(err, "code", None)
    if code not in _NOT_SERVED:
        return None
    return f"list {caps.resource}: " + _NOT_SERVED[code].format(one_line(err))


def _after_failed_probe(state: _Probing, err: BaseException, caps: _Caps) -> _Decision:
    verdict = _verdict(err)
    what = f"cursor probe at resourceVersion={state.cursor} failed: {one_line(err)}"
    if _unanswered(err):
        reason = "server was unreachable"
        return _backoff(caps.listing(reason), what, err, relist=reason)
    if verdict in (_Verdict.KEEPS_CURSOR, _Verdict.INTERRUPTED):
        return _backoff(state, what, err)
    reason = _relist_reason(err) if verdict is _Verdict.CURSOR_DEAD else "probe failed"
    if reason == TOO_LARGE:
        what = _ahead_of_the_server(state.cursor, err, "cursor probe")
    return _backoff(caps.listing(reason), what, err, relist=reason)


def _after_failed_watch(state: _Watching, outcome: _Failed, caps: _Caps) -> _Decision:
    err = outcome.error
    verdict = _verdict(err)
    what = f"{caps.noun} watch from resourceVersion={state.cursor} failed: {one_line(err)}"
    rewatch = _rewatch(outcome.cursor, caps)
    if verdict is _Verdict.KEEPS_CURSOR:
        return _backoff(rewatch, what, err)
    if verdict is _Verdict.INTERRUPTED:
        if outcome.frames == 0 and outcome.lasted < VERY_SHORT_WATCH_SECONDS:
            return _backoff(rewatch, what, err)
        idle = isinstance(err, KubernetesConnectionError) and err.idle
        return _Decision(rewatch, what=what, level=logging.INFO if idle else logging.WARNING)
    reason = _relist_reason(err)
    if reason == TOO_LARGE:
        what = _ahead_of_the_server(outcome.cursor, err, f"{caps.noun} watch")
    if isinstance(err, FrameDecodeError):
        what = (
            f"{caps.noun} watch frame unreadable after resourceVersion={outcome.cursor}: "
            f"type={err.event_type or '?'} resourceVersion={err.resource_version or '?'} "
            f"{caps.noun}={err.name or '?'}: {err.reason}"
        )
    return _backoff(caps.listing(reason), what, err, relist=reason)


def _ahead_of_the_server(cursor: str, err: BaseException, what: str) -> str:
    """The one line for a cursor the server says is ahead of its revision: the apiserver answers
    504 "Timeout: Too large resource version: C, current: R" (cause ResourceVersionTooLarge,
    v1.36.3 measured), as after etcd was restored from an older snapshot under it."""
    current = _SERVER_REVISION.search(str(err))
    revision = current.group(1) if current else "unknown"
    return (
        f"{what}: cursor resourceVersion={cursor} is ahead of the server's revision {revision} "
        f"(its history went back: etcd restored from an older snapshot?): {one_line(err)}"
    )


def _rewatch(cursor: str, caps: _Caps) -> _Probing | _Watching:
    return _Probing(cursor) if caps.probes else _Watching(cursor, restart=True)


def _backoff(
    then: _Active, what: str, err: BaseException | None, *, relist: str | None = None
) -> _Decision:
    retry_after = (exception_retry_after(err) if err is not None else None) or 0.0
    level = logging.ERROR if isinstance(err, FrameDecodeError) else logging.WARNING
    return _Decision(then, True, retry_after, what, level, relist)


@dataclass
class _Progress:
    """What ``source_status()`` reports, kept up to date by the driver and the actions: a
    ``SourceStatus`` replaced as each request starts or ends, and beside it what changes with
    every frame (a ``replace`` per frame costs about 6 µs, most of a WATCH event's budget)."""

    status: SourceStatus = field(default_factory=SourceStatus)
    cursor: str | None = None
    last_event_at: float | None = None
    last_bookmark_at: float | None = None
    watch_opened_at: float | None = None
    events: int = 0

    def update(self, **changes: Any) -> None:
        self.status = replace(self.status, **changes)


class KubernetesReflector:
    """A ``SourceWatchFn`` over a ``KubernetesPodApi`` (``kube_client``), whose keys are pod
    names, or over any resource's ``ResourceApi`` (``api``, e.g.
    ``k8s_api.KubernetesAsyncioResourceApi``), whose objects are its model's.

    Keys are the object's name within one namespace or for a cluster-scoped resource, and
    ``namespace/name`` across every namespace (``namespace`` ``""`` or ``None`` with ``api``), as
    client-go's ``MetaNamespaceKeyFunc``. ``field_selector`` goes with ``api`` only.

    ``retry_delay`` is the first backoff step; ``streaming_list`` lists by a streaming list when
    the API can (``StreamingListPodApi``, any ``ResourceApi``), else by LIST. ``name`` (default
    ``namespace/selector``) prefixes every log line. ``source_status()`` is the
    ``status.StatusReporter`` capability. ``consistency_check_period`` (seconds, off by default)
    relists that often as a consistency check (invariant 7): it bounds what etcd restored from an
    older snapshot under a running apiserver can leave wrong, at the cost of one LIST per period.
    """

    def __init__(
        self,
        *,
        kube_client: KubernetesPodApi | None = None,
        namespace: str | None = None,
        label_selector: str = "",
        watch_timeout_seconds: int = 300,
        retry_delay: float = DEFAULT_RETRY_DELAY,
        clock: Clock | None = None,
        name: str | None = None,
        streaming_list: bool = False,
        api: ResourceApi | None = None,
        field_selector: str = "",
        consistency_check_period: float | None = None,
    ) -> None:
        if (kube_client is None) == (api is None):
            raise TypeError("KubernetesReflector takes one of kube_client= (pods) or api=")
        if kube_client is not None and (not namespace or field_selector):
            raise TypeError("a pod API's reflector takes one namespace and no field_selector")
        namespace = namespace or ""
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._keyed_by_namespace = api is not None and not namespace
        resource: Resource = PODS if api is None else getattr(api, "resource", PODS)
        if api is not None and namespace and not resource.namespaced:
            raise TypeError(f"{resource.group_resource} is cluster-scoped: no namespace")
        self._noun = "pod" if api is None else resource.kind
        self._watch_timeout_seconds = positive_whole("watch_timeout_seconds", watch_timeout_seconds)
        self._clock: Clock = clock or RealClock()
        self.name = name or default_loop_name(namespace, label_selector)
        self._log = NamedLogger(logger, self.name)
        self._bind(kube_client, api)
        if streaming_list and self._open_stream_list is None:
            self._log.warning(
                "streaming list asked for, but %s cannot stream a list: listing by LIST",
                type(kube_client).__name__,
            )
        streams = streaming_list and self._open_stream_list is not None
        self._caps = _Caps(
            streams=streams,
            probes=self._paged is not None,
            noun=self._noun,
            resource=_resource_name(resource),
        )
        self._pacing = _Pacing(
            backoff_schedule(initial=positive_finite("retry_delay", retry_delay))
        )
        self._progress = _Progress()
        self._check_period = (
            None
            if consistency_check_period is None
            else positive_finite("consistency_check_period", consistency_check_period)
        )
        self._check_at = float("inf")

    def _bind(self, kube_client: KubernetesPodApi | None, api: ResourceApi | None) -> None:
        """The requests this reflector makes, bound once: a pod API's methods or a resource's."""
        ns, labels, fields = self._namespace, self._label_selector, self._field_selector
        self._open_stream_list: Callable[[int], AsyncIterator[Any]] | None
        if api is not None:
            self._paged: PagedPodApi | ResourceApi | None = api
            self._list_page: Callable[[ListOptions], Awaitable[Any]] = api.list_page
            self._list_all: Callable[[], Awaitable[Any]] = partial(
                api.list_page, ListOptions(ns, labels, field_selector=fields)
            )
            self._open_stream: Callable[[str, int], AsyncIterator[Any]] = lambda rv, t: api.stream(
                namespace=ns,
                label_selector=labels,
                field_selector=fields,
                resource_version=rv,
                timeout_seconds=t,
            )
            self._open_stream_list = lambda t: api.stream_list(
                namespace=ns, label_selector=labels, field_selector=fields, timeout_seconds=t
            )
            return
        assert kube_client is not None
        paged = kube_client if isinstance(kube_client, PagedPodApi) else None
        self._paged = paged
        if paged is not None:
            self._list_page = paged.list_pod_page
        self._list_all = partial(kube_client.list_pods, namespace=ns, label_selector=labels)
        self._open_stream = lambda rv, t: kube_client.stream_pods(
            namespace=ns, label_selector=labels, resource_version=rv, timeout_seconds=t
        )
        streaming = kube_client if isinstance(kube_client, StreamingListPodApi) else None
        self._open_stream_list = (
            None
            if streaming is None
            else lambda t: streaming.stream_pod_list(
                namespace=ns, label_selector=labels, timeout_seconds=t
            )
        )

    def _key(self, obj: Any) -> str:
        """client-go's ``MetaNamespaceKeyFunc`` across namespaces: ``namespace/name``, or the name
        alone for an object without a namespace (a cluster-scoped one); within one namespace, the
        name."""
        meta = obj.metadata
        if self._keyed_by_namespace and meta.namespace:
            return f"{meta.namespace}/{meta.name}"
        name: str = meta.name
        return name

    async def watch(self) -> AsyncIterator[SourceEvent]:
        schedule = self._pacing.schedule
        if schedule.last_reset is None:
            # Go's DelayWithReset counts its reset interval from the reflector's construction.
            self._pacing = replace(self._pacing, schedule=schedule.reset(self._clock.time()))
        state: _State = self._caps.listing()
        self._log.debug("start -> %s", _next_move(state))
        try:
            while True:
                self._enter(state)
                outcome: _Outcome | None = None
                async with aclosing(self._act(state)) as steps:
                    async for step in steps:
                        if isinstance(step, _Outcome):
                            outcome = step
                        else:
                            yield step
                assert outcome is not None, f"{state} ended without an outcome"
                state = self._follow_transition(state, outcome)
        finally:
            if isinstance(state, _Watching) and state.stream is not None:
                await _close(state.stream)
            self._log.debug("%s -> stopped", _name(state))
            self._set_phase(SourcePhase.STOPPED)

    def source_status(self) -> SourceStatus:
        p = self._progress
        status, now = p.status, self._clock.time()
        times = (p.last_event_at, p.last_bookmark_at, p.watch_opened_at)
        heard = max((t for t in times if t is not None), default=None)
        watching = status.phase is SourcePhase.WATCHING
        return replace(
            status,
            cursor=p.cursor,
            backoff_until=status.backoff_until if status.phase is SourcePhase.BACKING_OFF else None,
            last_event_at=p.last_event_at,
            last_bookmark_at=p.last_bookmark_at,
            events=p.events,
            suspect=watching and heard is not None and now - heard > SUSPECT_AFTER_SECONDS,
        )

    def _follow_transition(self, state: _State, outcome: _Outcome) -> _State:
        step = _transition(
            state, outcome, self._caps, self._pacing, now=self._clock.time(), draw=random.random()
        )
        self._pacing = step.pacing
        if isinstance(outcome, _Listed) and self._check_period is not None:
            self._check_at = self._clock.time() + self._check_period
        p = self._progress
        if step.error is not None:
            p.update(last_error=step.error, last_error_at=self._clock.time())
        if step.relist is not None:
            relists = p.status.relists
            p.update(relists={**relists, step.relist: relists.get(step.relist, 0) + 1})
        if step.what is not None:
            self._log.log(step.level, "%s; %s", step.what, _next_move(step.state))
        self._log.debug("%s -> %s", _name(state), _next_move(step.state))
        return step.state

    def _enter(self, state: _State) -> None:
        p = self._progress
        self._set_phase(_source_phase(state))
        if isinstance(state, _BackingOff):
            then = state.then
            p.update(
                backoff_until=self._clock.time() + state.delay,
                relist_reason=(
                    then.relist_reason if isinstance(then, _Listing | _StreamListing) else None
                ),
            )
        elif isinstance(state, _Listing | _StreamListing):
            p.update(relist_reason=state.relist_reason)
        else:
            p.update(relist_reason=None)
            p.cursor = state.cursor

    def _set_phase(self, phase: SourcePhase) -> None:
        p = self._progress
        if p.status.phase is not phase:
            p.update(phase=phase, phase_since=self._clock.time())

    def _act(self, state: _State) -> AsyncGenerator[SourceEvent | _Outcome, None]:
        if isinstance(state, _Listing):
            return self._list(check=state.relist_reason == CONSISTENCY_CHECK)
        if isinstance(state, _StreamListing):
            return self._stream_list(check=state.relist_reason == CONSISTENCY_CHECK)
        if isinstance(state, _Probing):
            return self._probe(state.cursor)
        if isinstance(state, _Watching):
            return self._watch(state)
        return self._wait(state.delay)

    async def _list(self, *, check: bool) -> AsyncGenerator[SourceEvent | _Outcome, None]:
        self._progress.update(lists=self._progress.status.lists + 1)
        try:
            if self._paged is not None:
                options = ListOptions(
                    self._namespace, self._label_selector, field_selector=self._field_selector
                )
                page = await list_in_pages(self._paged, options, log=self._log)
            else:
                page = await self._list_all()
        except Exception as err:
            yield _Failed(err)
            return
        if self._keyed_by_namespace:
            yield ReplaceEvent({self._key(obj): obj for obj in page.objects}, check)
        else:
            yield ReplaceEvent({obj.metadata.name: obj for obj in page.objects}, check)
        yield _Listed(page.resource_version)

    async def _stream_list(self, *, check: bool) -> AsyncGenerator[SourceEvent | _Outcome, None]:
        assert self._open_stream_list is not None
        self._progress.update(lists=self._progress.status.lists + 1)
        started = self._clock.time()
        stream = self._open_stream_list(self._watch_timeout_seconds)
        key = self._key
        pods: dict[str, Any] = {}
        cursor, frames, handed_over = "", 0, False
        try:
            async for frame in stream:
                frames += 1
                if frame.type == "ERROR":
                    yield _Failed(WatchErrorFrame(frame), cursor, frames)
                    return
                pod = frame.object
                if pod is None and frame.type != "BOOKMARK":
                    yield _Failed(_without_a_pod(frame, self._noun), cursor, frames)
                    return
                cursor = frame.resource_version or cursor
                if pod is None:
                    if frame.initial_events_end:
                        yield ReplaceEvent(pods, check)
                        handed_over = True
                        yield _Listed(cursor, stream)
                        return
                elif frame.type == "DELETED":
                    pods.pop(key(pod), None)
                else:
                    pods[key(pod)] = pod
        except Exception as err:
            yield _Failed(err, cursor, frames, self._clock.time() - started)
            return
        finally:
            if not handed_over:
                await _close(stream)
        yield _Closed(cursor, frames, self._clock.time() - started)

    async def _probe(self, cursor: str) -> AsyncGenerator[SourceEvent | _Outcome, None]:
        assert self._paged is not None
        try:
            await self._list_page(
                ListOptions(
                    self._namespace,
                    self._label_selector,
                    limit=PROBE_LIMIT,
                    resource_version=cursor,
                    field_selector=self._field_selector,
                )
            )
        except Exception as err:
            yield _Failed(err, cursor)
            return
        yield _Accepted(cursor)

    async def _watch(self, state: _Watching) -> AsyncGenerator[SourceEvent | _Outcome, None]:
        p = self._progress
        clock = self._clock
        started = clock.time()
        stream = state.stream
        p.update(
            watches=p.status.watches + 1,
            watch_restarts=p.status.watch_restarts + state.restart,
        )
        if stream is None:
            stream = self._open_stream(state.cursor, self._watch_timeout(started))
        p.watch_opened_at = started
        cursor, frames = state.cursor, 0
        by_namespace = self._keyed_by_namespace
        outcome: _Outcome
        try:
            async for frame in stream:
                frames += 1
                if frame.type == "ERROR":
                    outcome = _Failed(WatchErrorFrame(frame), cursor, frames)
                    break
                pod = frame.object
                if pod is None and frame.type != "BOOKMARK":
                    outcome = _Failed(_without_a_pod(frame, self._noun), cursor, frames)
                    break
                if frame.resource_version:
                    cursor = p.cursor = frame.resource_version
                if pod is None:
                    p.last_bookmark_at = clock.time()
                    continue
                p.events += 1
                p.last_event_at = clock.time()
                key = self._key(pod) if by_namespace else pod.metadata.name
                if frame.type == "DELETED":
                    yield DeleteEvent(key, pod)
                else:
                    yield UpsertEvent(key, pod)
            else:
                ended = clock.time()
                outcome = _Closed(cursor, frames, ended - started, ended >= self._check_at)
        except Exception as err:
            outcome = _Failed(err, cursor, frames, clock.time() - started)
        finally:
            await _close(stream)
        yield outcome

    def _watch_timeout(self, now: float) -> int:
        """The watch's ``timeoutSeconds``: ``watch_timeout_seconds``, cut short so that the watch
        closes when the consistency check falls due (whole seconds, at least one)."""
        if self._check_at == float("inf"):
            return self._watch_timeout_seconds
        due = max(1, math.ceil(self._check_at - now))
        return min(self._watch_timeout_seconds, due)

    async def _wait(self, delay: float) -> AsyncGenerator[SourceEvent | _Outcome, None]:
        await self._clock.sleep(delay)
        yield _Waited()


def _without_a_pod(frame: PodWatchEvent | WatchEvent[Any], noun: str) -> FrameDecodeError:
    """A frame that is neither a bookmark nor an error and carries no object, as a user's
    ``KubernetesPodApi`` may yield one: unreadable, like the bytes of one."""
    return FrameDecodeError(
        f"{str(frame.type)[:40]} frame without a {noun}",
        resource_version=frame.resource_version,
        event_type=str(frame.type)[:40],
    )


def _resource_name(resource: Resource) -> str:
    return f'{resource.plural} (group "{resource.group}", version {resource.version})'


def _next_move(state: _State) -> str:
    if isinstance(state, _BackingOff):
        return f"{_next_move(state.then)} in {state.delay:.2f}s"
    if isinstance(state, _Listing | _StreamListing):
        how = "streaming list" if isinstance(state, _StreamListing) else "LIST"
        if state.relist_reason is None:
            return f"listing by {how}"
        return f"relisting by {how} ({state.relist_reason})"
    if isinstance(state, _Probing):
        return f"probing resourceVersion={state.cursor} before re-watching"
    return f"watching from resourceVersion={state.cursor}"


def _name(state: _State) -> str:
    """A state's phase as the DEBUG line of each transition names it."""
    return {
        _Listing: "list",
        _StreamListing: "stream list",
        _Probing: "probe",
        _Watching: "watch",
        _BackingOff: "backoff",
    }[type(state)]


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
