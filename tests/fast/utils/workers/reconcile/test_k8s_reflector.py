"""Fast layer: ``KubernetesReflector`` row by row, on a scripted pod API and a fake clock.

Backoff steps carry jitter 1.0, so step ``n`` (from 1) waits in ``[R·2^(n-1), R·2^n)`` for
``R = retry_delay``: a test advances to just before the lower bound (nothing happened yet) and then
to the upper bound (it has happened).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    ContractPodApi,
    FakePodApi,
    PageCall,
    ProbeCall,
    Step,
    StreamingFakePodApi,
    frame,
    pod,
    realistic_pod,
)
from miles.utils.workers.reconcile.backoff import Backoff
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import (
    FrameDecodeError,
    KubernetesApiError,
    KubernetesConnectionError,
)
from miles.utils.workers.reconcile.k8s_reflector import (
    LIST_PAGE_SIZE,
    RETRY_AFTER_RETRIES,
    SUSPECT_AFTER_SECONDS,
    KubernetesReflector,
)
from miles.utils.workers.reconcile.k8s_values import PodListPage, PodWatchEvent
from miles.utils.workers.reconcile.k8s_wire import decode_watch_line
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)
from miles.utils.workers.reconcile.status import SourcePhase, StatusReporter

RETRY = 2.0
EPS = 0.01


def added(name: str, rv: str) -> PodWatchEvent:
    return PodWatchEvent("ADDED", pod(name, resource_version=rv), rv)


def modified(name: str, rv: str) -> PodWatchEvent:
    return PodWatchEvent("MODIFIED", pod(name, resource_version=rv), rv)


def deleted(name: str, rv: str) -> PodWatchEvent:
    return PodWatchEvent("DELETED", pod(name, resource_version=rv), rv)


def bookmark(rv: str, *, initial_events_end: bool = False) -> PodWatchEvent:
    return PodWatchEvent("BOOKMARK", None, rv, initial_events_end=initial_events_end)


def error(code: int) -> PodWatchEvent:
    return PodWatchEvent("ERROR", None, None, rejects_cursor=code in (410, 504), code=code)


def page(rv: str, *names: str, more: str | None = None) -> PodListPage:
    """A LIST page; ``more`` is its continue token."""
    return PodListPage(tuple(pod(n, resource_version=rv) for n in names), rv, more)


def hold(clock: FakeClock, seconds: float) -> Step:
    """A watch step that keeps the stream open for ``seconds`` of fake time."""
    return lambda: clock.sleep(seconds)


async def step_waited(clock: FakeClock, n: int = 1) -> None:
    """Advances through the whole of backoff step ``n``, having checked nothing before it."""
    await clock.advance(RETRY * 2 ** (n - 1) * 2)


class Consumer:
    def __init__(self, events: AsyncIterator[SourceEvent]) -> None:
        self.events: list[SourceEvent] = []
        self._source = events
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        async for event in self._source:
            self.events.append(event)

    def replaces(self) -> list[ReplaceEvent]:
        return [e for e in self.events if isinstance(e, ReplaceEvent)]


def reflector_over(api: Any, clock: FakeClock, **kwargs: Any) -> KubernetesReflector:
    return KubernetesReflector(
        kube_client=api,
        namespace="ns",
        label_selector="app=miles",
        watch_timeout_seconds=120,
        retry_delay=RETRY,
        clock=clock,
        **kwargs,
    )


@asynccontextmanager
async def running(api: Any, clock: FakeClock, **kwargs: Any) -> AsyncIterator[Consumer]:
    consumer = Consumer(reflector_over(api, clock, **kwargs).watch())
    await clock.advance(0)
    try:
        yield consumer
    finally:
        consumer.task.cancel()
        await asyncio.gather(consumer.task, return_exceptions=True)
    assert not consumer.task.done() or consumer.task.cancelled(), "watch() ended on its own"


def cursors(api: ContractPodApi) -> list[str]:
    return [c.resource_version for c in api.watch_calls]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- listing and watching -------------------------------------------------------------------


async def test_first_list_is_one_replace_event_keyed_by_pod_name() -> None:
    api = FakePodApi(lists=[page("10", "a", "b")])
    async with running(api, FakeClock()) as run:
        (replace,) = run.events
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a", "b"]
        assert replace.objects["a"].metadata.resource_version == "10"
        assert api.list_calls == [("ns", "app=miles")]


async def test_watch_starts_at_list_cursor_and_always_sends_timeout() -> None:
    api = FakePodApi(lists=[page("10")], watches=[])
    async with running(api, FakeClock()):
        (call,) = api.watch_calls
        assert (call.namespace, call.label_selector) == ("ns", "app=miles")
        assert (call.resource_version, call.timeout_seconds) == ("10", 120)
        assert api.probe_calls == [], "a fresh LIST's cursor is not probed"


async def test_pod_frames_become_upserts_and_deleted_carries_the_last_object() -> None:
    api = FakePodApi(
        lists=[page("10")], watches=[[added("a", "11"), modified("a", "12"), deleted("a", "13")]]
    )
    async with running(api, FakeClock()) as run:
        add, mod, dele = run.events[1:4]
        assert isinstance(add, UpsertEvent)
        assert (add.key, add.obj.metadata.resource_version) == ("a", "11")
        assert isinstance(mod, UpsertEvent)
        assert mod.obj.metadata.resource_version == "12"
        assert isinstance(dele, DeleteEvent)
        assert (dele.key, dele.last_obj.metadata.resource_version) == ("a", "13")


async def test_clean_close_probes_then_rewatches_from_the_cursor_without_relisting() -> None:
    """Rows: a clean close re-watches at the cursor (1:1 with client-go), and every re-watch is
    preceded by a probe of that cursor (invariant 4), even when the watch delivered frames."""
    api = FakePodApi(lists=[page("10")], watches=[[added("a", "11")], [modified("a", "12")]])
    async with running(api, FakeClock()) as run:
        assert cursors(api) == ["10", "11", "12"]
        assert [p.resource_version for p in api.probe_calls] == ["11", "12"]
        assert all(p.limit == 1 for p in api.probe_calls)
        assert len(api.list_calls) == 1
        assert len(run.replaces()) == 1


async def test_the_opt_in_consistency_check_closes_the_watch_when_due_and_relists_at_once() -> None:
    """Beyond client-go (record row "consistency check"): with ``consistency_check_period`` each
    watch asks the server to close it by the time the check falls due; that close relists at once
    (no probe), and the LIST's ``ReplaceEvent`` drops the ghost the watch never heard deleted and
    carries the pod it never heard created, as after etcd was restored under the apiserver."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a", "ghost"), page("40", "a", "missed")],
        watches=[[added("b", "11"), hold(clock, 10.0)], [hold(clock, 20.0)]],
    )
    reflector = reflector_over(api, clock, consistency_check_period=30.0)
    run = Consumer(reflector.watch())
    try:
        await clock.advance(10.0)
        assert [(c.resource_version, c.timeout_seconds) for c in api.watch_calls] == [
            ("10", 30),
            ("11", 20),
        ]
        assert len(api.list_calls) == 1
        await clock.advance(20.0)
        assert len(api.list_calls) == 2
        assert [p.resource_version for p in api.probe_calls] == ["11"], "no probe before a check"
        assert sorted(run.replaces()[-1].objects) == ["a", "missed"]
        last = api.watch_calls[-1]
        assert (last.resource_version, last.timeout_seconds) == ("40", 30)
        assert reflector.source_status().relists == {"consistency check": 1}
    finally:
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)


async def test_without_the_consistency_check_a_watch_keeps_its_timeout_and_never_relists() -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10", "a")], watches=[[hold(clock, 120.0)]])
    async with running(api, clock):
        await clock.advance(120.0)
        assert [c.timeout_seconds for c in api.watch_calls] == [120, 120]
        assert len(api.list_calls) == 1


async def test_bookmark_advances_cursor_and_emits_nothing() -> None:
    api = FakePodApi(lists=[page("10")], watches=[[bookmark("50")]])
    async with running(api, FakeClock()) as run:
        assert [type(e) for e in run.events] == [ReplaceEvent]
        assert cursors(api) == ["10", "50"]


async def test_very_short_empty_watch_waits_one_backoff_step() -> None:
    """Guard (Go ``VeryShortWatchError``): closed in under 1 s with no frame is a failure."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[], []])
    async with running(api, clock):
        assert len(api.watch_calls) == 1
        await clock.advance(RETRY - EPS)
        assert len(api.watch_calls) == 1
        assert api.probe_calls == []
        await step_waited(clock)
        assert cursors(api) == ["10", "10"]
        assert len(api.list_calls) == 1


async def test_empty_watch_that_lasted_is_probed_and_rewatched_at_once() -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[hold(clock, 1.0)]])
    async with running(api, clock):
        await clock.advance(1.0)
        assert api.probe_calls == [ProbeCall("ns", "app=miles", "10", 1)]
        assert cursors(api) == ["10", "10"]


async def test_probe_success_feeds_nothing() -> None:
    """The probe's page is a check, not a listing: the pod it returned never reaches the stream."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a")],
        watches=[[hold(clock, 1.0)], [added("b", "11")]],
        probes=[page("30", "c", more="t9")],
    )
    async with running(api, clock) as run:
        await clock.advance(1.0)
        assert cursors(api)[:3] == ["10", "10", "11"]
        assert [getattr(e, "key", None) for e in run.events] == [None, "b"]
        assert api.page_calls == [PageCall(LIST_PAGE_SIZE, None)], "the probe is not paged"


@pytest.mark.parametrize(("code", "reason"), [(504, "Timeout"), (410, "Expired")])
async def test_probe_rejecting_the_cursor_relists_with_one_log_line(
    code: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolled-back server answers the probe with 504 (cause ResourceVersionTooLarge): one
    warning names the cursor, the reason and what comes next, and a consistent relist follows
    one backoff step later; the watch then opens from the relist's cursor."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("900", "a"), page("20", "a", "b")],
        watches=[[added("a", "901")]],
        probes=[KubernetesApiError(code, reason, "Too large resource version")],
    )
    with caplog.at_level(logging.WARNING):
        async with running(api, clock) as run:
            assert len(api.list_calls) == 1
            await clock.advance(RETRY - EPS)
            assert len(api.list_calls) == 1
            await step_waited(clock)
            assert len(api.list_calls) == 2
            assert sorted(run.replaces()[-1].objects) == ["a", "b"]
            assert cursors(api) == ["900", "20"]
    (line,) = warnings(caplog)
    assert "resourceVersion=901" in line
    assert f"HTTP {code} {reason}" in line
    assert "relisting by LIST" in line


async def test_probe_failing_otherwise_relists_after_a_backoff_step() -> None:
    """A probe answered 500 says the server cannot vouch for the cursor: relist, as client-go
    relists after a non-retriable watch error."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10"), page("30", "z")],
        watches=[[hold(clock, 1.0)]],
        probes=[KubernetesApiError(500, "InternalError")],
    )
    async with running(api, clock) as run:
        await clock.advance(1.0)
        assert len(api.probe_calls) == 1
        await step_waited(clock)
        assert len(api.list_calls) == 2
        assert list(run.replaces()[-1].objects) == ["z"]


@pytest.mark.parametrize(
    "failure",
    [
        KubernetesApiError(429, "TooManyRequests"),
        TimeoutError(),
        KubernetesConnectionError("idle", idle=True),
    ],
    ids=["HTTP 429", "TimeoutError", "idle"],
)
async def test_probe_throttled_or_slow_probes_again_after_a_backoff_step(
    failure: Exception,
) -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[hold(clock, 1.0)]], probes=[failure])
    async with running(api, clock):
        await clock.advance(1.0)
        assert len(api.probe_calls) == 1
        await step_waited(clock)
        assert [p.resource_version for p in api.probe_calls] == ["10", "10"]
        assert cursors(api) == ["10", "10"]
        assert len(api.list_calls) == 1


@pytest.mark.parametrize(
    "failure",
    [
        KubernetesConnectionError("refused", refused=True),
        KubernetesConnectionError("pod LIST failed: Connection reset by peer"),
        ConnectionRefusedError(111, "refused"),
        ConnectionResetError(104, "reset"),
    ],
    ids=["refused", "reset", "ConnectionRefusedError", "ConnectionResetError"],
)
async def test_probe_never_answered_relists_after_a_backoff_step(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """A server gone long enough to leave the probe unanswered restarts: its etcd may have been
    restored and written past the cursor, so the cursor is not trusted again. Through
    a proxy or a load balancer a stopped apiserver looks like a reset, not a refusal."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a"), page("12", "b")], watches=[[hold(clock, 1.0)]], probes=[failure]
    )
    async with running(api, clock) as run:
        await clock.advance(1.0)
        assert len(api.probe_calls) == 1
        assert len(api.list_calls) == 1
        await step_waited(clock)
        assert len(api.list_calls) == 2
        assert list(run.replaces()[-1].objects) == ["b"]
        assert cursors(api) == ["10", "12"]
    assert "relisting by LIST (server was unreachable)" in caplog.text


async def test_retry_after_is_waited_alone_ten_times_in_a_row_then_with_a_backoff_step() -> None:
    """client-go's REST client waits a response's Retry-After and retries, ``maxRetries`` (10)
    times, before the reflector sees the error and backs off."""
    clock = FakeClock()
    throttled = KubernetesApiError(429, "TooManyRequests", retry_after=1.0)
    api = FakePodApi(lists=[*[throttled] * (RETRY_AFTER_RETRIES + 1), page("10")])
    reflector = reflector_over(api, clock)
    consumer = Consumer(reflector.watch())
    try:
        await clock.advance(0)
        for n in range(1, RETRY_AFTER_RETRIES + 1):
            # Retry-After 1 s, raised to retry_delay: retry n comes at n·RETRY exactly.
            await clock.advance(n * RETRY - EPS - clock.time())
            assert len(api.list_calls) == n
            await clock.advance(2 * EPS)
            assert len(api.list_calls) == n + 1
        status = reflector.source_status()
        assert status.backoff_until is not None
        assert status.phase_since is not None
        assert status.backoff_until - status.phase_since >= RETRY
    finally:
        consumer.task.cancel()
        await asyncio.gather(consumer.task, return_exceptions=True)


# --- failures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        KubernetesApiError(410, "Expired"),
        KubernetesApiError(504, "Timeout"),
        KubernetesApiError(500, "Expired"),
        type("ApiException", (Exception,), {"status": 410})(),
    ],
    ids=["410", "504", "reason Expired", "ApiException(status=410)"],
)
async def test_http_failure_rejecting_cursor_relists(failure: Exception) -> None:
    """Row ``exception_rejects_cursor``: one rule for every shape of a dead cursor."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10"), page("90")], watches=[failure])
    async with running(api, clock) as run:
        await step_waited(clock)
        assert len(api.list_calls) == 2
        assert cursors(api) == ["10", "90"]
        assert api.probe_calls == []
        assert len(run.replaces()) == 2


@pytest.mark.parametrize(
    "failure",
    [
        error(410),
        error(504),
        KubernetesApiError(500, "InternalError"),
        KubernetesApiError(403, "Forbidden"),
        error(500),
    ],
    ids=["ERROR 410", "ERROR 504", "HTTP 500", "HTTP 403", "ERROR 500"],
)
async def test_a_failing_watch_relists_after_a_backoff_step(failure: Any) -> None:
    """As Go's ``ListAndWatch``: a watch that fails for a reason that does not keep the
    cursor (an ERROR frame rejecting it among them) relists one backoff step later, so while
    LIST works the store is never staler than one step; here a pod deleted during the failure is
    gone from the relist."""
    clock = FakeClock()
    script: Any = failure if isinstance(failure, Exception) else [added("c", "11"), failure]
    api = FakePodApi(lists=[page("10", "a", "b"), page("20", "b")], watches=[script])
    async with running(api, clock) as run:
        await clock.advance(RETRY - EPS)
        assert len(api.list_calls) == 1
        await step_waited(clock)
        assert len(api.list_calls) == 2
        assert list(run.replaces()[-1].objects) == ["b"]
        assert cursors(api) == ["10", "20"]


async def _every_watch_failing(failure: Exception, ticks: int, *, tick: float) -> FakePodApi:
    """The calls a reflector made while every WATCH failed with ``failure`` and LIST worked, over
    ``ticks`` advances of the fake clock by ``tick``."""
    clock = FakeClock()
    api = FakePodApi(lists=[page(str(i)) for i in range(1, 100)], watches=[failure] * 100)
    async with running(api, clock):
        for _ in range(ticks):
            await clock.advance(tick)
    return api


async def test_a_watch_answered_500_for_a_minute_relists_once_per_backoff_step() -> None:
    """The ``test_faults.py`` fault, stretched: every WATCH answered 500 while LIST works. Each
    failure costs one LIST one backoff step later, the steps double (jitter aside) up to the cap,
    and no LIST comes without its step."""
    api = await _every_watch_failing(KubernetesApiError(500, "InternalError"), 600, tick=0.1)
    lists = len(api.list_calls)
    # steps of at least 2, 4, 8, 16, 30, 30 s ... fit into 60 s at most 5 times after the first
    assert 3 <= lists <= 6
    assert len(api.watch_calls) == lists


async def _steps_taken_within(seconds: float, rand: float) -> int:
    """How many steps of the reflector's backoff end within ``seconds`` at jitter ``rand``."""
    clock = FakeClock()
    backoff = Backoff(clock=clock, initial=RETRY, rand=lambda: rand)
    steps = 0
    while (delay := backoff.next_delay()) <= seconds - clock.time():
        await clock.advance(delay)
        steps += 1
    return steps


async def test_the_backoff_starts_over_two_minutes_after_the_reflector_started() -> None:
    """Go's ``DelayWithReset`` starts its 2-minute interval when the reflector is made, not at
    its first step: a watch quiet for 100 s ends in 410 (step 1), the next one 20 s later, past
    2 minutes since the start, so its step is the first again, ``[RETRY, 2·RETRY)``, where an
    interval counted from the first step would make it the second, ``[2·RETRY, 4·RETRY)``."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10"), page("11"), page("12")],
        watches=[[hold(clock, 100.0), error(410)], [hold(clock, 20.0), error(410)]],
    )
    async with running(api, clock):
        await clock.advance(100.0)
        while len(api.list_calls) < 2:
            await clock.advance(EPS)
        failed_at = clock.time() + 20.0
        await clock.advance(failed_at + RETRY - EPS - clock.time())
        assert len(api.list_calls) == 2
        await clock.advance(RETRY + EPS)
        assert len(api.list_calls) == 3


async def test_a_server_rejecting_every_cursor_is_listed_once_per_backoff_step() -> None:
    """Every WATCH answered 410. Over 10 minutes of fake time the LIST count is that
    of Go's backoff (steps doubling to 30 s, starting over every 2 minutes): between the steps
    at their longest (jitter 1.0 doubles each) and at their shortest, not one per
    ``retry_delay``."""
    api = await _every_watch_failing(KubernetesApiError(410, "Expired"), 600, tick=1.0)
    fewest, most = await _steps_taken_within(600, 0.999), await _steps_taken_within(600, 0.0)
    assert most < 600 / RETRY / 5
    # Mixed jitter moves the 2-minute resets between steps, so allow a step either way.
    assert fewest <= len(api.list_calls) <= 2 + most


@pytest.mark.parametrize(
    "failure",
    [
        KubernetesApiError(429, "TooManyRequests"),
        KubernetesConnectionError("connection refused", refused=True),
        ConnectionRefusedError(111, "refused"),
        error(429),
    ],
    ids=["HTTP 429", "refused", "ConnectionRefusedError", "ERROR 429"],
)
async def test_throttled_or_refused_watch_keeps_the_cursor(failure: Any) -> None:
    """Go ``isWatchErrorRetriable``: 429 and connection refused back off and re-watch the same
    cursor (after its probe), with no relist."""
    clock = FakeClock()
    script: Any = failure if isinstance(failure, Exception) else [added("a", "11"), failure]
    api = FakePodApi(lists=[page("10")], watches=[script])
    async with running(api, clock):
        await clock.advance(RETRY - EPS)
        assert len(api.watch_calls) == 1
        await step_waited(clock)
        expected = "10" if isinstance(failure, Exception) else "11"
        assert cursors(api) == ["10", expected]
        assert [p.resource_version for p in api.probe_calls] == [expected]
        assert len(api.list_calls) == 1


async def test_retry_after_of_a_429_is_honoured() -> None:
    clock = FakeClock()
    throttled = KubernetesApiError(429, "TooManyRequests", retry_after=10.0)
    api = FakePodApi(lists=[page("10")], watches=[throttled])
    async with running(api, clock):
        await clock.advance(10.0 - EPS)
        assert len(api.watch_calls) == 1
        await clock.advance(EPS)
        assert len(api.watch_calls) == 2


@pytest.mark.parametrize(
    "failure",
    [
        KubernetesConnectionError("pod watch cut short"),
        KubernetesConnectionError("nothing read for 90s", idle=True),
        ConnectionResetError("reset"),
        TimeoutError(),
    ],
    ids=["cut", "idle", "reset", "timeout"],
)
async def test_a_connection_broken_mid_watch_probes_and_rewatches_at_once(failure: Any) -> None:
    """Go's ``StreamWatcher`` reads a probable EOF as a close: after frames, a broken or silent
    connection re-watches from the cursor at once (after its probe), with no relist."""
    api = FakePodApi(lists=[page("10")], watches=[[added("a", "11"), failure]])
    async with running(api, FakeClock()):
        assert cursors(api) == ["10", "11"]
        assert [p.resource_version for p in api.probe_calls] == ["11"]
        assert len(api.list_calls) == 1


async def test_a_connection_broken_before_any_frame_waits_a_backoff_step() -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[KubernetesConnectionError("reset")])
    async with running(api, clock):
        await clock.advance(RETRY - EPS)
        assert len(api.watch_calls) == 1
        await step_waited(clock)
        assert cursors(api) == ["10", "10"]


async def test_failed_list_is_retried_with_a_growing_backoff() -> None:
    """Backoff rows: each failed LIST waits one step, and step n lies in [R·2^(n-1), R·2^n)."""
    clock = FakeClock()
    failures = [TimeoutError(), KubernetesApiError(500, "x"), KubernetesApiError(500, "y")]
    api = FakePodApi(lists=[*failures, page("10")])
    reflector = reflector_over(api, clock)
    consumer = Consumer(reflector.watch())
    delays = []
    try:
        await clock.advance(0)
        for n in range(1, len(failures) + 1):
            status = reflector.source_status()
            assert status.phase is SourcePhase.BACKING_OFF
            assert status.backoff_until is not None
            assert status.phase_since is not None
            delay = status.backoff_until - status.phase_since
            delays.append(delay)
            # backoff_until - since can round a ulp past either end of the step's range.
            assert RETRY * 2 ** (n - 1) - 1e-9 <= delay < RETRY * 2**n + 1e-9
            await clock.advance(status.backoff_until - clock.time() - EPS)
            assert len(api.list_calls) == n
            # Two EPS, not one: (t + delay - EPS) + EPS can round below t + delay.
            await clock.advance(2 * EPS)
            assert len(api.list_calls) == n + 1
        assert isinstance(consumer.events[0], ReplaceEvent)
    finally:
        consumer.task.cancel()
        await asyncio.gather(consumer.task, return_exceptions=True)
    assert len(delays) == 3


# --- frames ---------------------------------------------------------------------------------


async def test_a_pod_frame_that_does_not_validate_ends_the_watch_and_relists_after_one_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A readable pod frame whose pod cannot be keyed used to be skipped, the store
    keeping a stale copy until something else relisted. Now it ends the watch and relists one
    backoff step later, with one line naming the frame's type, resourceVersion and the reason."""
    bad = FrameDecodeError(
        "metadata.name: Field required", name=None, resource_version="12", event_type="MODIFIED"
    )
    clock = FakeClock()
    api = FakePodApi(lists=[page("10", "a"), page("20", "a")], watches=[[added("b", "11"), bad]])
    with caplog.at_level(logging.ERROR):
        async with running(api, clock) as run:
            await clock.advance(RETRY - EPS)
            assert len(api.list_calls) == 1
            await step_waited(clock)
            assert len(api.list_calls) == 2
            assert cursors(api) == ["10", "20"]
            assert api.probe_calls == []
            assert [type(e).__name__ for e in run.events] == [
                "ReplaceEvent",
                "UpsertEvent",
                "ReplaceEvent",
            ]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(
        "[ns/app=miles] pod watch frame unreadable after resourceVersion=11: type=MODIFIED "
        "resourceVersion=12 pod=?: metadata.name: Field required; relisting by LIST "
        "(frame unreadable) in "
    )


@pytest.mark.parametrize("event_type", ["ADDED", "MODIFIED", "DELETED", "SOMETHING"])
@pytest.mark.parametrize("api_class", [ContractPodApi, FakePodApi])
async def test_a_frame_without_a_pod_from_any_api_ends_the_watch_and_relists(
    event_type: str, api_class: type[ContractPodApi], caplog: pytest.LogCaptureFixture
) -> None:
    """A ``PodWatchEvent`` of a pod type whose ``pod`` is ``None``, as a user's
    ``KubernetesPodApi`` may yield it, used to read as a bookmark: the cursor moved to it and the
    pod stayed missing until the next relist. Go's decoder makes it a ``watch.Error``."""
    clock = FakeClock()
    podless = PodWatchEvent(event_type, None, "12")
    api = api_class(lists=[page("10", "a"), page("20", "a", "b")], watches=[[podless]])
    with caplog.at_level(logging.ERROR):
        async with running(api, clock) as run:
            await step_waited(clock)
            assert [list(r.objects) for r in run.replaces()] == [["a"], ["a", "b"]]
            assert [c.resource_version for c in api.watch_calls] == ["10", "20"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"type={event_type} resourceVersion=12 pod=?: {event_type} frame without a pod" in line
    assert "relisting by LIST (frame unreadable)" in line


def _odd_field_values() -> dict[str, Any]:
    odd = realistic_pod("a", "cell-1", resource_version="12")
    odd["status"]["conditions"][0]["lastTransitionTime"] = "0000-01-01T00:00:00Z"
    odd["status"]["phase"] = "Exploded"
    odd["status"]["containerStatuses"][0]["restartCount"] = "many"
    return odd


def _unkeyable(edit: str) -> bytes:
    broken = realistic_pod("a", "cell-1", resource_version="12")
    if edit == "no name":
        del broken["metadata"]["name"]
    else:
        broken["metadata"]["labels"]["miles.io/cell"] = 7
    return frame("MODIFIED", broken)


async def test_a_frame_with_odd_field_values_is_still_a_pod_and_moves_it_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lenient side of the line: a year-0 time, an unknown phase and a count that
    is not a number read as absent (or as they are) and the frame is applied; no relist."""
    clock = FakeClock()
    event = decode_watch_line(frame("MODIFIED", _odd_field_values()))
    api = FakePodApi(lists=[page("10", "a")], watches=[[event]])
    with caplog.at_level(logging.WARNING):
        async with running(api, clock) as run:
            await step_waited(clock, 3)
            (upsert,) = [e for e in run.events if isinstance(e, UpsertEvent)]
            assert upsert.obj.metadata.labels["miles.io/cell"] == "cell-1"
            assert upsert.obj.status.phase == "Exploded"
            assert len(api.list_calls) == 1
    assert warnings(caplog) == []


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (_unkeyable("no name"), "type=MODIFIED resourceVersion=12 pod=?"),
        (_unkeyable("a label that is not a string"), "type=MODIFIED resourceVersion=12 pod=a"),
        (
            frame("MODIFIED", realistic_pod("a", "cell-1", resource_version="12"))[:700],
            "type=MODIFIED resourceVersion=12 pod=a",
        ),
        (b"\x00\x17garbage that is not a frame", "type=? resourceVersion=? pod=?"),
    ],
    ids=["no name", "bad label", "cut JSON", "not a frame"],
)
async def test_a_frame_that_cannot_be_read_or_keyed_relists_within_one_backoff_step(
    line: bytes, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The other side of the line: the decoder's ``FrameDecodeError`` ends the watch
    (as the API's stream raises it), and the relist one backoff step later brings the pod's
    current state: ``a`` under ``cell-1``."""
    with pytest.raises(FrameDecodeError) as decoded:
        decode_watch_line(line)
    clock = FakeClock()
    now = PodListPage((pod("a", "cell-1", "20"),), "20")
    api = FakePodApi(lists=[page("10", "a"), now], watches=[[decoded.value]])
    with caplog.at_level(logging.ERROR):
        async with running(api, clock) as run:
            await step_waited(clock)
            assert len(api.list_calls) == 2
            assert run.replaces()[-1].objects["a"].metadata.labels["miles.io/cell"] == "cell-1"
    (logged,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"pod watch frame unreadable after resourceVersion=10: {named}: " in logged
    assert decoded.value.reason in logged
    assert "relisting by LIST (frame unreadable) in " in logged


async def test_a_streaming_list_frame_without_a_pod_falls_back_to_a_list() -> None:
    """A frame without a pod in a streaming list: the frame fails it, and it falls back to its
    LIST at once, as any failed streaming list does."""
    clock = FakeClock()
    api = StreamingFakePodApi(
        lists=[page("20", "a")],
        stream_lists=[[added("a", "11"), PodWatchEvent("ADDED", None, "12")]],
    )
    async with running(api, clock, streaming_list=True) as run:
        await clock.advance(0)
        assert api.stream_list_calls == 1
        assert len(api.list_calls) == 1
        assert [list(r.objects) for r in run.replaces()] == [["a"]]


@pytest.mark.parametrize(
    "line",
    [b"<html>", b'{"type":"ADDED"}', b'{"type":"SOMETHING","object":{}}'],
    ids=["not json", "no object", "unknown type"],
)
async def test_unreadable_frame_relists_after_a_backoff_step(
    line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Row (design, and Go's StreamWatcher decode error): an unreadable frame ends the watch and
    relists; a pod frame without an object is one, since it names no resourceVersion to skip to."""
    with pytest.raises(FrameDecodeError) as decoded:
        decode_watch_line(line)
    assert decoded.value.resource_version is None
    clock = FakeClock()
    api = FakePodApi(lists=[page("10", "a"), page("20", "a")], watches=[[decoded.value]])
    with caplog.at_level(logging.ERROR):
        async with running(api, clock) as run:
            await step_waited(clock)
            assert len(api.list_calls) == 2
            assert len(run.replaces()) == 2
            assert cursors(api) == ["10", "20"]
    (logged,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert decoded.value.reason in logged
    assert "relisting by LIST (frame unreadable)" in logged


async def test_error_frame_whose_reason_alone_says_expired_relists() -> None:
    frame = decode_watch_line(b'{"type":"ERROR","object":{"kind":"Status","reason":"Expired"}}')
    assert (frame.code, frame.rejects_cursor) == (None, True)
    clock = FakeClock()
    api = FakePodApi(lists=[page("10"), page("20")], watches=[[frame]])
    async with running(api, clock):
        await step_waited(clock)
        assert cursors(api) == ["10", "20"]


async def test_invalid_deleted_frame_relists_so_the_pod_cannot_linger() -> None:
    clock = FakeClock()
    bad = FrameDecodeError("bad", name="a", resource_version="12", event_type="DELETED")
    api = FakePodApi(lists=[page("10", "a", "b"), page("20", "b")], watches=[[bad]])
    async with running(api, clock) as run:
        await step_waited(clock)
        assert list(run.replaces()[-1].objects) == ["b"]
        assert cursors(api) == ["10", "20"]


# --- streams --------------------------------------------------------------------------------


async def test_each_watch_call_opens_its_own_stream_starting_with_replace() -> None:
    api = FakePodApi(lists=[page("10", "a"), page("20", "b")])
    reflector = KubernetesReflector(kube_client=api, namespace="ns", label_selector="")
    first, second = reflector.watch(), reflector.watch()
    one, two = await anext(first), await anext(second)
    assert isinstance(one, ReplaceEvent)
    assert isinstance(two, ReplaceEvent)
    assert (list(one.objects), list(two.objects)) == (["a"], ["b"])
    await first.aclose()  # type: ignore[attr-defined]
    await second.aclose()  # type: ignore[attr-defined]


async def test_closing_the_stream_closes_the_open_watch() -> None:
    closed = asyncio.Event()
    api = FakePodApi(lists=[page("10")])

    async def open_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            closed.set()

    api.watches = [[added("a", "11"), open_forever]]
    reflector = KubernetesReflector(kube_client=api, namespace="ns", label_selector="")
    events = reflector.watch()
    assert isinstance(await anext(events), ReplaceEvent)
    assert isinstance(await anext(events), UpsertEvent)
    pending = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0)
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    await events.aclose()  # type: ignore[attr-defined]
    assert closed.is_set()
    assert reflector.source_status().phase is SourcePhase.STOPPED


# --- pagination -----------------------------------------------------------------------------


async def test_paged_list_joins_every_page_into_one_replace_event() -> None:
    api = FakePodApi(
        lists=[page("10", "a", "b", more="t1"), page("10", "c", more="t2"), page("10", "d")],
    )
    async with running(api, FakeClock()) as run:
        (replace,) = run.events
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a", "b", "c", "d"]
        assert api.page_calls == [
            PageCall(LIST_PAGE_SIZE, None),
            PageCall(LIST_PAGE_SIZE, "t1"),
            PageCall(LIST_PAGE_SIZE, "t2"),
        ]
        assert api.list_calls == [("ns", "app=miles")]
        assert api.watch_calls[0].resource_version == "10"


async def test_expired_continue_token_restarts_once_then_falls_back_to_one_full_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Pager rows: a 410 on a continuation restarts the paged LIST from page one; a second in a
    row falls back to one unpaged LIST (Go ``FullListIfExpired``); one warning each; no delay."""
    expired = KubernetesApiError(410, "Expired", "continue token expired")
    api = FakePodApi(
        lists=[
            page("10", "a", more="t1"),
            expired,
            page("20", "a", more="t3"),
            expired,
            page("30", "a", "b"),
        ],
    )
    with caplog.at_level(logging.WARNING):
        async with running(api, FakeClock()) as run:
            (replace,) = run.events
            assert isinstance(replace, ReplaceEvent)
            assert {k: o.metadata.resource_version for k, o in replace.objects.items()} == {
                "a": "30",
                "b": "30",
            }
            assert api.page_calls == [
                PageCall(LIST_PAGE_SIZE, None),
                PageCall(LIST_PAGE_SIZE, "t1"),
                PageCall(LIST_PAGE_SIZE, None),
                PageCall(LIST_PAGE_SIZE, "t3"),
                PageCall(None, None),
            ]
            assert api.watch_calls[0].resource_version == "30"
    first, second = warnings(caplog)
    assert "after 1 pods" in first
    assert "relisting from the first page" in first
    assert "falling back to one unpaged LIST" in second


async def test_other_failure_on_a_continuation_retries_the_whole_list_after_a_step() -> None:
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a", more="t1"), KubernetesApiError(500, "x"), page("11", "a", "b")]
    )
    async with running(api, clock) as run:
        assert run.events == []
        await step_waited(clock)
        (replace,) = run.events
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a", "b"]
        assert [c.continue_token for c in api.page_calls] == [None, "t1", None]


# --- the contract's protocol ----------------------------------------------------------------


async def test_a_contract_minimal_api_gets_a_complete_reflector() -> None:
    """An API with only ``list_pods(*, namespace, label_selector)`` and
    ``stream_pods`` (a call with any other argument would raise ``TypeError``) is listed unpaged,
    watched from the cursor, re-watched after a clean close (no probe: it cannot), relisted on a
    410, and the relist's ``ReplaceEvent`` lacks the pod deleted meanwhile (deletion synthesis is
    the store's, on that event)."""
    clock = FakeClock()
    api = ContractPodApi(
        lists=[page("10", "a", "b"), page("30", "b")],
        watches=[[added("c", "11")], [bookmark("20"), error(410)]],
    )
    async with running(api, clock) as run:
        assert cursors(api) == ["10", "11"]
        await step_waited(clock)
        assert api.list_calls == [("ns", "app=miles")] * 2
        assert cursors(api) == ["10", "11", "30"]
        first, last = run.replaces()
        assert sorted(first.objects) == ["a", "b"]
        assert list(last.objects) == ["b"]


# --- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "1", None, True])
def test_retry_delay_must_be_finite_and_positive(value: Any) -> None:
    with pytest.raises(ValueError, match=f"retry_delay .*{value!r}"):
        KubernetesReflector(
            kube_client=ContractPodApi(), namespace="ns", label_selector="", retry_delay=value
        )


@pytest.mark.parametrize("value", [0, -5, 0.5, 1.5, math.inf, "300", True])
def test_watch_timeout_seconds_must_be_a_whole_positive_number(value: Any) -> None:
    with pytest.raises(ValueError, match="watch_timeout_seconds"):
        KubernetesReflector(
            kube_client=ContractPodApi(),
            namespace="ns",
            label_selector="",
            watch_timeout_seconds=value,
        )


# --- the streaming list ---------------------------------------------------------------------


async def test_streaming_list_buffers_until_the_end_bookmark_and_goes_on_watching() -> None:
    """The initial ADDED events (one deleted again before the end) become one
    ``ReplaceEvent`` at the ``k8s.io/initial-events-end`` bookmark; the same stream goes on as
    the watch, from the bookmark's cursor, with no LIST and no second request."""
    api = StreamingFakePodApi(
        stream_lists=[
            [
                added("a", "5"),
                added("b", "6"),
                added("gone", "7"),
                deleted("gone", "8"),
                bookmark("9", initial_events_end=True),
                modified("a", "10"),
            ]
        ],
    )
    async with running(api, FakeClock(), streaming_list=True) as run:
        replace, update = run.events[:2]
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a", "b"]
        assert isinstance(update, UpsertEvent)
        assert update.obj.metadata.resource_version == "10"
        assert api.list_calls == []
        assert api.stream_list_calls == 1
        assert [p.resource_version for p in api.probe_calls] == ["10"]
        assert cursors(api) == ["10"]


@pytest.mark.parametrize(
    "script",
    [
        KubernetesApiError(422, "Invalid", "sendInitialEvents is forbidden"),
        KubernetesApiError(500, "InternalError"),
        [added("a", "5")],
        ConnectionResetError("reset"),
        [added("a", "5"), KubernetesConnectionError("pod watch cut short")],
        KubernetesConnectionError("nothing read for 17s", idle=True),
        KubernetesApiError(410, "Expired"),
        error(410),
    ],
    ids=[
        "HTTP 422",
        "HTTP 500",
        "closed before the end bookmark",
        "reset",
        "broken mid-stream",
        "idle",
        "HTTP 410",
        "ERROR 410",
    ],
)
async def test_streaming_list_falls_back_to_a_list(
    script: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Go ``ListAndWatch``: a watch-list that fails for a reason other than throttling or a
    refused connection (``isWatchErrorRetriable``) falls back to a LIST at once ("making
    progress is better than deadlocking"), a broken or silent connection and a rejected cursor
    included; so does one that closed without the end bookmark."""
    api = StreamingFakePodApi(stream_lists=[script], lists=[page("10", "x")])
    with caplog.at_level(logging.WARNING):
        async with running(api, FakeClock(), streaming_list=True) as run:
            (replace,) = run.events
            assert isinstance(replace, ReplaceEvent)
            assert list(replace.objects) == ["x"]
            assert len(api.list_calls) == 1
            assert cursors(api) == ["10"]
    (line,) = warnings(caplog)
    assert "falling back to a LIST" in line


async def test_throttled_streaming_list_is_retried_after_a_backoff_step() -> None:
    clock = FakeClock()
    api = StreamingFakePodApi(
        stream_lists=[
            KubernetesApiError(429, "TooManyRequests"),
            [added("a", "5"), bookmark("6", initial_events_end=True)],
        ]
    )
    async with running(api, clock, streaming_list=True) as run:
        assert api.stream_list_calls == 1
        await step_waited(clock)
        assert api.stream_list_calls == 2
        assert api.list_calls == []
        assert list(run.replaces()[0].objects) == ["a"]


async def test_streams_that_break_and_lists_that_fail_cost_a_backoff_step_each_pair() -> None:
    """Bounded: a broken stream's LIST comes at once, but a failed LIST waits a step before the
    next stream, so a server that breaks both gets at most two requests per backoff step."""
    clock = FakeClock()
    broken = [ConnectionResetError("reset")] * 4
    api = StreamingFakePodApi(stream_lists=list(broken), lists=list(broken))
    async with running(api, clock, streaming_list=True):
        assert (api.stream_list_calls, len(api.list_calls)) == (1, 1)
        await clock.advance(RETRY - EPS)
        assert (api.stream_list_calls, len(api.list_calls)) == (1, 1)
        await step_waited(clock)
        assert (api.stream_list_calls, len(api.list_calls)) == (2, 2)


async def test_relist_after_a_dead_cursor_streams_the_list_again() -> None:
    clock = FakeClock()
    api = StreamingFakePodApi(
        stream_lists=[
            [added("a", "5"), bookmark("6", initial_events_end=True), error(410)],
            [added("b", "7"), bookmark("8", initial_events_end=True)],
        ]
    )
    async with running(api, clock, streaming_list=True) as run:
        await step_waited(clock)
        assert api.stream_list_calls == 2
        assert [list(r.objects) for r in run.replaces()] == [["a"], ["b"]]


async def test_streaming_list_asked_of_an_api_that_cannot_lists_instead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakePodApi(lists=[page("10", "a")])
    with caplog.at_level(logging.WARNING):
        async with running(api, FakeClock(), streaming_list=True) as run:
            assert len(run.replaces()) == 1
    (line,) = warnings(caplog)
    assert "cannot stream a list" in line


# --- status and logs ------------------------------------------------------------------------


async def test_source_status_follows_the_phases_and_counts() -> None:
    """Phase, cursor, times, counters, relists by reason, last error."""
    clock = FakeClock(start=100.0)
    api = FakePodApi(
        lists=[page("10", "a"), page("40", "a")],
        watches=[[added("a", "11"), bookmark("12"), hold(clock, 5.0), error(410)]],
    )
    reflector = reflector_over(api, clock)
    assert isinstance(reflector, StatusReporter)
    assert reflector.source_status().phase is SourcePhase.STARTING
    consumer = Consumer(reflector.watch())
    try:
        await clock.advance(0)
        status = reflector.source_status()
        assert (status.phase, status.cursor, status.events) == (SourcePhase.WATCHING, "12", 1)
        assert (status.last_event_at, status.last_bookmark_at) == (100.0, 100.0)
        assert (status.lists, status.watches, status.watch_restarts) == (1, 1, 0)
        assert not status.suspect
        await clock.advance(5.0)
        status = reflector.source_status()
        assert status.phase is SourcePhase.BACKING_OFF
        assert status.backoff_until is not None
        assert 105.0 + RETRY <= status.backoff_until < 105.0 + 2 * RETRY
        assert status.relist_reason == "cursor expired"
        assert status.relists == {"cursor expired": 1}
        assert status.last_error is not None
        assert "410" in status.last_error
        assert status.last_error_at == 105.0
        await step_waited(clock)
        status = reflector.source_status()
        assert (status.phase, status.cursor, status.lists, status.watches) == (
            SourcePhase.WATCHING,
            "40",
            2,
            2,
        )
        assert status.watch_restarts == 0, "a watch after a relist is not a restart"
    finally:
        consumer.task.cancel()
        await asyncio.gather(consumer.task, return_exceptions=True)
    assert reflector.source_status().phase is SourcePhase.STOPPED


async def test_a_silent_watch_is_reported_suspect_after_twice_the_bookmark_interval() -> None:
    clock = FakeClock()
    api = ContractPodApi(lists=[page("10")], watches=[[bookmark("11"), hold(clock, 1000.0)]])
    reflector = reflector_over(api, clock)
    consumer = Consumer(reflector.watch())
    try:
        await clock.advance(SUSPECT_AFTER_SECONDS - EPS)
        assert not reflector.source_status().suspect
        await clock.advance(2 * EPS)
        assert reflector.source_status().suspect
    finally:
        consumer.task.cancel()
        await asyncio.gather(consumer.task, return_exceptions=True)


async def test_restarts_are_counted_for_rewatches_from_the_cursor() -> None:
    api = FakePodApi(lists=[page("10")], watches=[[added("a", "11")], [added("b", "12")]])
    reflector = reflector_over(api, FakeClock())
    consumer = Consumer(reflector.watch())
    await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    status = reflector.source_status()
    consumer.task.cancel()
    await asyncio.gather(consumer.task, return_exceptions=True)
    assert (status.watches, status.watch_restarts, status.events) == (3, 2, 2)


async def test_log_lines_name_the_reflector_and_each_failure_is_logged_once_per_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every line carries the reflector's name (default ``namespace/selector``);
    transitions are DEBUG; a watch failing for a minute gives one warning per failure, and each
    failure is one backoff step."""
    clock = FakeClock()
    fail = KubernetesApiError(500, "InternalError")
    api = FakePodApi(lists=[page(str(i)) for i in range(1, 50)], watches=[fail] * 50)
    with caplog.at_level(logging.DEBUG, logger="miles.utils.workers.reconcile"):
        async with running(api, clock):
            for _ in range(600):
                await clock.advance(0.1)
    ours = [r for r in caplog.records if r.name.startswith("miles.utils.workers.reconcile")]
    assert ours
    assert all(r.getMessage().startswith("[ns/app=miles] ") for r in ours)
    assert all(getattr(r, "reconcile_loop", None) == "ns/app=miles" for r in ours)
    failures = [r for r in ours if r.levelno >= logging.WARNING]
    assert len(failures) == len(api.watch_calls)
    assert all("HTTP 500 InternalError" in r.getMessage() for r in failures)
    assert any(r.levelno == logging.DEBUG and "->" in r.getMessage() for r in ours)


def test_name_defaults_to_namespace_and_selector_and_can_be_given() -> None:
    api = ContractPodApi()
    assert KubernetesReflector(kube_client=api, namespace="ns", label_selector="a=b").name == (
        "ns/a=b"
    )
    named = KubernetesReflector(kube_client=api, namespace="ns", label_selector="", name="cells")
    assert named.name == "cells"
