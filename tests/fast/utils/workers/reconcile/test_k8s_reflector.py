"""Fast layer: ``KubernetesReflector`` row by row, on a scripted pod API and a fake clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    FakePodApi,
    PageCall,
    ProbeCall,
    Step,
    pod,
)
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_api import (
    FrameDecodeError,
    KubernetesApiError,
    PodListPage,
    PodWatchEvent,
)
from miles.utils.workers.reconcile.k8s_reflector import LIST_PAGE_SIZE, KubernetesReflector
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

RETRY = 2.0


def added(name: str, rv: str) -> PodWatchEvent:
    return PodWatchEvent("ADDED", pod(name, resource_version=rv), rv)


def modified(name: str, rv: str) -> PodWatchEvent:
    return PodWatchEvent("MODIFIED", pod(name, resource_version=rv), rv)


def deleted(name: str, rv: str) -> PodWatchEvent:
    return PodWatchEvent("DELETED", pod(name, resource_version=rv), rv)


def bookmark(rv: str) -> PodWatchEvent:
    return PodWatchEvent("BOOKMARK", None, rv)


def error(code: int) -> PodWatchEvent:
    return PodWatchEvent("ERROR", None, None, rejects_cursor=code in (410, 504))


def page(rv: str, *names: str, more: str | None = None) -> PodListPage:
    """A LIST page; ``more`` is its continue token."""
    return PodListPage(tuple(pod(n, resource_version=rv) for n in names), rv, more)


def hold(clock: FakeClock, seconds: float) -> Step:
    """A watch step that keeps the stream open for ``seconds`` of fake time."""
    return lambda: clock.sleep(seconds)


class Consumer:
    def __init__(self, events: AsyncIterator[SourceEvent]) -> None:
        self.events: list[SourceEvent] = []
        self._source = events
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        async for event in self._source:
            self.events.append(event)


@asynccontextmanager
async def running(api: FakePodApi, clock: FakeClock) -> AsyncIterator[Consumer]:
    reflector = KubernetesReflector(
        kube_client=api,
        namespace="ns",
        label_selector="app=miles",
        watch_timeout_seconds=120,
        retry_delay=RETRY,
        clock=clock,
    )
    consumer = Consumer(reflector.watch())
    await clock.advance(0)
    try:
        yield consumer
    finally:
        consumer.task.cancel()
        await asyncio.gather(consumer.task, return_exceptions=True)
    assert not consumer.task.done() or consumer.task.cancelled(), "watch() ended on its own"


async def test_first_list_is_one_replace_event_keyed_by_pod_name() -> None:
    api = FakePodApi(lists=[page("10", "a", "b")])
    clock = FakeClock()
    async with running(api, clock) as run:
        assert len(run.events) == 1
        replace = run.events[0]
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a", "b"]
        assert replace.objects["a"].metadata.resource_version == "10"
        assert api.list_calls == [("ns", "app=miles")]


async def test_watch_starts_at_list_cursor_and_always_sends_timeout() -> None:
    """Row: WATCH from the list's resourceVersion, with ``timeout_seconds`` always sent."""
    api = FakePodApi(lists=[page("10")], watches=[[]])
    async with running(api, FakeClock()):
        call = api.watch_calls[0]
        assert (call.namespace, call.label_selector) == ("ns", "app=miles")
        assert (call.resource_version, call.timeout_seconds) == ("10", 120)


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


async def test_clean_close_rewatches_from_cursor_without_relisting() -> None:
    """Row: a clean close re-watches at the cursor (1:1 with client-go, not 'Dropped')."""
    api = FakePodApi(lists=[page("10")], watches=[[added("a", "11")], [modified("a", "12")]])
    async with running(api, FakeClock()) as run:
        assert [c.resource_version for c in api.watch_calls] == ["10", "11", "12"]
        assert len(api.list_calls) == 1
        assert sum(isinstance(e, ReplaceEvent) for e in run.events) == 1


async def test_bookmark_advances_cursor_and_emits_nothing() -> None:
    api = FakePodApi(lists=[page("10")], watches=[[bookmark("50")]])
    async with running(api, FakeClock()) as run:
        assert [type(e) for e in run.events] == [ReplaceEvent]
        assert [c.resource_version for c in api.watch_calls] == ["10", "50"]


async def test_very_short_empty_watch_waits_retry_delay() -> None:
    """Guard (Go ``VeryShortWatchError``): closed in under 1 s with no event is a failure."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[], []])
    async with running(api, clock):
        assert len(api.watch_calls) == 1
        await clock.advance(RETRY - 0.1)
        assert len(api.watch_calls) == 1
        await clock.advance(0.1)
        assert [c.resource_version for c in api.watch_calls] == ["10", "10"]
        assert len(api.list_calls) == 1


async def test_very_short_empty_watch_is_not_probed() -> None:
    """The very-short guard's retry comes first: a probe is only for a watch that lasted."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[], []])
    async with running(api, clock):
        await clock.advance(RETRY)
        assert len(api.watch_calls) == 2
        assert api.probe_calls == []


async def test_empty_watch_probes_its_cursor_with_a_one_item_list() -> None:
    """Row ``isTooLargeResourceVersionError``: a watch that lasted and closed cleanly with no frame
    is followed by one LIST of at most one pod not older than the cursor, before any re-watch."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[hold(clock, 1.0)]])
    async with running(api, clock):
        await clock.advance(1.0)
        assert api.probe_calls == [ProbeCall("ns", "app=miles", "10", 1)]
        assert len(api.watch_calls) == 1
        assert len(api.list_calls) == 1


async def test_probe_success_rewatches_from_the_same_cursor_at_once_and_feeds_nothing() -> None:
    """An accepted cursor is re-watched with no delay and no relist; the probe's page is a check,
    not a listing, so the pod it returned never reaches the stream."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a")],
        watches=[[hold(clock, 1.0)], [added("b", "11")]],
        probes=[page("30", "c")],
    )
    async with running(api, clock) as run:
        await clock.advance(1.0)
        assert [c.resource_version for c in api.watch_calls] == ["10", "10", "11"]
        assert len(api.list_calls) == 1
        assert [getattr(e, "key", None) for e in run.events] == [None, "b"]
        assert len(api.probe_calls) == 1


@pytest.mark.parametrize(("code", "reason"), [(504, "Timeout"), (410, "Expired")])
async def test_probe_rejecting_the_cursor_relists_with_one_log_line(
    code: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolled-back server answers the probe with 504 (cause ResourceVersionTooLarge): one
    warning names the cursor and the reason, and a consistent relist follows after
    ``retry_delay``; the watch then opens from the relist's cursor."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("900", "a"), page("20", "a", "b")],
        watches=[[hold(clock, 1.0)]],
        probes=[KubernetesApiError(code, reason, "Too large resource version")],
    )
    with caplog.at_level(logging.WARNING):
        async with running(api, clock) as run:
            await clock.advance(1.0)
            assert len(api.list_calls) == 1
            await clock.advance(RETRY)
            assert len(api.list_calls) == 2
            last = run.events[-1]
            assert isinstance(last, ReplaceEvent)
            assert sorted(last.objects) == ["a", "b"]
            assert [c.resource_version for c in api.watch_calls] == ["900", "20"]
    (line,) = [r.getMessage() for r in caplog.records if "relisting" in r.getMessage()]
    assert "resourceVersion=900" in line
    assert f"HTTP {code} {reason}" in line


@pytest.mark.parametrize(
    "failure", [KubernetesApiError(500, "InternalError"), ConnectionResetError("reset")]
)
async def test_probe_failure_retries_the_watch_from_the_cursor(failure: Exception) -> None:
    """A probe that fails for any other reason says nothing about the cursor: the watch is
    retried from it after ``retry_delay``, with no relist."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[hold(clock, 1.0)]], probes=[failure])
    async with running(api, clock):
        await clock.advance(1.0)
        assert len(api.probe_calls) == 1
        await clock.advance(RETRY - 0.1)
        assert len(api.watch_calls) == 1
        await clock.advance(0.1)
        assert [c.resource_version for c in api.watch_calls] == ["10", "10"]
        assert len(api.list_calls) == 1


@pytest.mark.parametrize("first", [bookmark("50"), added("a", "50")])
async def test_watch_with_any_frame_triggers_no_probe(first: PodWatchEvent) -> None:
    """A bookmark or an event proves the server is past the cursor: re-watch, no probe."""
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[first, hold(clock, 1.0)]])
    async with running(api, clock):
        await clock.advance(1.0)
        assert [c.resource_version for c in api.watch_calls] == ["10", "50"]
        assert api.probe_calls == []


@pytest.mark.parametrize("code", [410, 504])
async def test_error_frame_rejecting_cursor_relists(code: int) -> None:
    """Row: an in-band ERROR 410/504 relists (consistent LIST) after ``retry_delay``."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a"), page("90", "b")], watches=[[added("c", "11"), error(code)]]
    )
    async with running(api, clock) as run:
        assert len(api.list_calls) == 1
        await clock.advance(RETRY)
        assert len(api.list_calls) == 2
        last = run.events[-1]
        assert isinstance(last, ReplaceEvent)
        assert list(last.objects) == ["b"]
        assert [c.resource_version for c in api.watch_calls] == ["10", "90"]


@pytest.mark.parametrize("code", [410, 504])
async def test_http_status_rejecting_cursor_relists(code: int) -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10"), page("90")], watches=[KubernetesApiError(code, "Expired")])
    async with running(api, clock):
        await clock.advance(RETRY)
        assert len(api.list_calls) == 2
        assert [c.resource_version for c in api.watch_calls] == ["10", "90"]


@pytest.mark.parametrize(
    "failure",
    [
        KubernetesApiError(500, "InternalError"),
        KubernetesApiError(429, "TooManyRequests"),
        ConnectionResetError("reset"),
        TimeoutError(),
    ],
)
async def test_other_watch_failures_retry_from_same_cursor(failure: Exception) -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[added("a", "11"), failure]])
    async with running(api, clock):
        assert len(api.watch_calls) == 1
        await clock.advance(RETRY)
        assert [c.resource_version for c in api.watch_calls] == ["10", "11"]
        assert len(api.list_calls) == 1


async def test_error_frame_not_rejecting_cursor_retries_from_it() -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[page("10")], watches=[[added("a", "11"), error(500)]])
    async with running(api, clock):
        await clock.advance(RETRY)
        assert [c.resource_version for c in api.watch_calls] == ["10", "11"]
        assert len(api.list_calls) == 1


async def test_failed_list_is_retried_and_the_stream_still_opens_with_replace() -> None:
    clock = FakeClock()
    api = FakePodApi(lists=[TimeoutError(), KubernetesApiError(500, "x"), page("10", "a")])
    async with running(api, clock) as run:
        assert run.events == []
        await clock.advance(RETRY)
        await clock.advance(RETRY)
        assert len(api.list_calls) == 3
        assert isinstance(run.events[0], ReplaceEvent)


async def test_invalid_pod_frame_is_logged_skipped_and_the_cursor_moves_past_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row: a readable pod frame that does not validate is skipped, never replayed."""
    bad = FrameDecodeError(
        "status.phase: bad", name="a", resource_version="12", event_type="MODIFIED"
    )
    api = FakePodApi(
        lists=[page("10", "a")], watches=[[added("b", "11"), bad], [modified("b", "13")]]
    )
    with caplog.at_level(logging.ERROR):
        async with running(api, FakeClock()) as run:
            assert [c.resource_version for c in api.watch_calls] == ["10", "12", "13"]
            assert len(api.list_calls) == 1
            assert [getattr(e, "key", None) for e in run.events] == [None, "b", "b"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "pod=a" in line
    assert "resourceVersion=12" in line
    assert "status.phase: bad" in line


async def test_unreadable_frame_relists_after_retry_delay(caplog: pytest.LogCaptureFixture) -> None:
    """Row: like Go's StreamWatcher decode error, an unreadable frame ends the watch and relists."""
    clock = FakeClock()
    bad = FrameDecodeError("unreadable watch frame: Invalid JSON")
    api = FakePodApi(lists=[page("10", "a"), page("20", "a")], watches=[[bad]])
    with caplog.at_level(logging.ERROR):
        async with running(api, clock) as run:
            assert len(api.list_calls) == 1
            await clock.advance(RETRY)
            assert len(api.list_calls) == 2
            assert [type(e) for e in run.events] == [ReplaceEvent, ReplaceEvent]
            assert [c.resource_version for c in api.watch_calls] == ["10", "20"]
    assert any("Invalid JSON" in r.getMessage() for r in caplog.records)


async def test_invalid_deleted_frame_relists_so_the_pod_cannot_linger() -> None:
    """Row: skipping a deletion would leave a ghost; the relist's LIST no longer has the pod."""
    clock = FakeClock()
    bad = FrameDecodeError("bad", name="a", resource_version="12", event_type="DELETED")
    api = FakePodApi(lists=[page("10", "a", "b"), page("20", "b")], watches=[[bad]])
    async with running(api, clock) as run:
        await clock.advance(RETRY)
        last = run.events[-1]
        assert isinstance(last, ReplaceEvent)
        assert list(last.objects) == ["b"]
        assert [c.resource_version for c in api.watch_calls] == ["10", "20"]


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


async def test_paged_list_joins_every_page_into_one_replace_event() -> None:
    """Row ``ListPager``: the consistent LIST asks for ``LIST_PAGE_SIZE`` pods a page and follows
    continue tokens; the pages make one ``ReplaceEvent`` and the watch opens at their cursor."""
    api = FakePodApi(
        lists=[page("10", "a", "b", more="t1"), page("10", "c", more="t2"), page("10", "d")],
        watches=[[]],
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
        assert api.probe_calls == []
        assert api.watch_calls[0].resource_version == "10"


async def test_expired_continue_token_restarts_the_paged_list_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 410 on a continuation page: the pods read so far are dropped and the LIST restarts from a
    consistent first page with no delay; one warning says so."""
    api = FakePodApi(
        lists=[
            page("10", "a", more="t1"),
            KubernetesApiError(410, "Expired", "continue token expired"),
            page("20", "a", more="t3"),
            page("20", "b"),
        ],
    )
    with caplog.at_level(logging.WARNING):
        async with running(api, FakeClock()) as run:
            (replace,) = run.events
            assert isinstance(replace, ReplaceEvent)
            assert {k: o.metadata.resource_version for k, o in replace.objects.items()} == {
                "a": "20",
                "b": "20",
            }
            assert api.page_calls == [
                PageCall(LIST_PAGE_SIZE, None),
                PageCall(LIST_PAGE_SIZE, "t1"),
                PageCall(LIST_PAGE_SIZE, None),
                PageCall(LIST_PAGE_SIZE, "t3"),
            ]
            assert len(api.list_calls) == 2
            assert api.watch_calls[0].resource_version == "20"
    (line,) = [r.getMessage() for r in caplog.records if "continue token expired" in r.getMessage()]
    assert "after 1 pods" in line


async def test_other_failure_on_a_continuation_retries_the_whole_list_after_retry_delay() -> None:
    """Any other failure mid-LIST fails the LIST: it restarts from a first page ``retry_delay``
    later, never from the token."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a", more="t1"), KubernetesApiError(500, "x"), page("11", "a", "b")]
    )
    async with running(api, clock) as run:
        assert run.events == []
        await clock.advance(RETRY)
        (replace,) = run.events
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a", "b"]
        assert [c.continue_token for c in api.page_calls] == [None, "t1", None]


async def test_cursor_probe_stays_unpaged() -> None:
    """The probe is one LIST of ``limit=1`` from the cursor: a continue token in its answer is
    not followed, and its page never becomes a ``ReplaceEvent``."""
    clock = FakeClock()
    api = FakePodApi(
        lists=[page("10", "a")],
        watches=[[hold(clock, 1.0)]],
        probes=[page("30", "c", more="t9")],
    )
    async with running(api, clock) as run:
        await clock.advance(1.0)
        assert api.probe_calls == [ProbeCall("ns", "app=miles", "10", 1)]
        assert api.page_calls == [PageCall(LIST_PAGE_SIZE, None)]
        assert [type(e) for e in run.events] == [ReplaceEvent]
        assert [c.resource_version for c in api.watch_calls] == ["10", "10"]
