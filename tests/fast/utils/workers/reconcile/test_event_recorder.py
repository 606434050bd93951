"""Fast layer: ``events/`` (client-go's core/v1 recorder) on a fake sink and a ``FakeClock``:
the spam filter, aggregation, the sink's retries and the queue bound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from miles.utils.workers.reconcile.client import Patch
from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.events import (
    AGGREGATE_PREFIX,
    MAX_QUEUED_EVENTS,
    MAX_TRIES_PER_EVENT,
    ClientEventSink,
    Correlated,
    EventCorrelator,
    EventRecorder,
)
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.resource import EVENTS, Resource

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
}
START = 1_780_000_000.0


@dataclass
class _Sink:
    """The apiserver's events, by name; each call recorded as (verb, name, count)."""

    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, int]] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)
    version: int = 0

    def _fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    async def create(self, event: dict[str, Any]) -> dict[str, Any]:
        name = event["metadata"]["name"]
        self.calls.append(("create", name, event["count"]))
        self._fail()
        assert "resourceVersion" not in event["metadata"]
        return self._store(dict(event))

    async def patch(self, event: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
        name = event["metadata"]["name"]
        self.calls.append(("patch", name, patch["count"]))
        self._fail()
        if name not in self.events:
            raise KubernetesApiError(404, "NotFound", f'events "{name}" not found')
        assert set(patch) == {"count", "lastTimestamp", "message"}
        return self._store({**self.events[name], **patch})

    def _store(self, event: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        event["metadata"] = {**event["metadata"], "resourceVersion": str(self.version)}
        self.events[event["metadata"]["name"]] = event
        return event


def _recorder(sink: _Sink, clock: FakeClock, draw: float = 0.5) -> EventRecorder:
    return EventRecorder(
        sink=sink,
        component="pool-controller",
        host="node-1",
        clock=clock,
        wall=lambda: START + clock.time(),
        draw=lambda: draw,
    )


async def test_a_storm_of_identical_events_writes_25_then_one_per_300_seconds() -> None:
    clock, sink = FakeClock(), _Sink()
    async with _recorder(sink, clock) as recorder:
        for _ in range(500):
            recorder.record(POD, "Warning", "BackOff", "restarting failed container")
            await settle()
        assert [verb for verb, _, _ in sink.calls] == ["create"] + ["patch"] * 24
        (event,) = sink.events.values()
        assert event["count"] == 25
        await clock.advance(299.0)
        recorder.record(POD, "Warning", "BackOff", "restarting failed container")
        await settle()
        assert len(sink.calls) == 25
        await clock.advance(1.0)
        recorder.record(POD, "Warning", "BackOff", "restarting failed container")
        await settle()
    assert len(sink.calls) == 26
    assert sink.calls[-1] == ("patch", event["metadata"]["name"], 502)
    assert (recorder.written, recorder.skipped) == (26, 476)


async def test_the_spam_budget_is_per_object_and_type() -> None:
    clock, sink = FakeClock(), _Sink()
    other = {**POD, "metadata": {**POD["metadata"], "name": "q", "uid": "u2"}}
    async with _recorder(sink, clock) as recorder:
        for i in range(30):
            for obj, kind in ((POD, "Normal"), (POD, "Warning"), (other, "Normal")):
                recorder.record(obj, kind, "Step", f"step {i}" if kind == "Normal" else "same")
            await settle()
    assert recorder.written == 3 * 25


async def _twelve_similar_events(*, apart: float) -> tuple[_Sink, EventRecorder]:
    """Twelve events alike but for their message, ``apart`` seconds from one to the next."""
    clock, sink = FakeClock(), _Sink()
    async with _recorder(sink, clock) as recorder:
        for i in range(12):
            recorder.record(POD, "Normal", "Scaled", f"scaled to {i}")
            await settle()
            await clock.advance(apart)
    return sink, recorder


async def test_ten_similar_events_within_600_seconds_become_one_combined_event() -> None:
    sink, _ = await _twelve_similar_events(apart=59.0)
    # nine plain events, the tenth combined; the 11th and 12th patch the combined one
    assert [verb for verb, _, _ in sink.calls] == ["create"] * 10 + ["patch"] * 2
    combined = [e for e in sink.events.values() if e["message"].startswith(AGGREGATE_PREFIX)]
    assert len(combined) == 1
    assert combined[0]["message"] == AGGREGATE_PREFIX + "scaled to 11"
    assert combined[0]["count"] == 3
    assert combined[0]["metadata"]["name"].startswith("p.")


async def test_a_gap_over_600_seconds_starts_the_similar_count_again() -> None:
    sink, recorder = await _twelve_similar_events(apart=601.0)
    assert recorder.written == 12
    assert not any(e["message"].startswith(AGGREGATE_PREFIX) for e in sink.events.values())


async def test_the_sink_tries_12_times_10_seconds_apart_the_first_sleep_jittered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, sink = FakeClock(), _Sink(failures=[ConnectionResetError("cut")] * 20)
    async with _recorder(sink, clock, draw=0.25) as recorder:
        recorder.record(POD, "Normal", "Created", "created")
        await settle()
        assert len(sink.calls) == 1
        await clock.advance(2.4)
        assert len(sink.calls) == 1
        await clock.advance(0.1)
        assert len(sink.calls) == 2
        for tries in range(3, MAX_TRIES_PER_EVENT + 1):
            await clock.advance(9.9)
            assert len(sink.calls) == tries - 1
            await clock.advance(0.1)
            assert len(sink.calls) == tries
        await clock.advance(100.0)
    assert len(sink.calls) == MAX_TRIES_PER_EVENT
    assert recorder.given_up == 1
    assert any("after 12 tries" in r.getMessage() for r in caplog.records)


async def test_a_transport_failure_is_retried_and_a_server_answer_is_not() -> None:
    clock, sink = FakeClock(), _Sink(failures=[ConnectionResetError("cut")])
    async with _recorder(sink, clock, draw=0.0) as recorder:
        recorder.record(POD, "Normal", "Created", "first")
        await clock.advance(0.0)
        assert recorder.written == 1
        sink.failures.append(KubernetesApiError(422, "Invalid", "bad"))
        recorder.record(POD, "Normal", "Created", "second")
        await settle()
    assert [verb for verb, _, _ in sink.calls] == ["create", "create", "create"]
    assert (recorder.written, recorder.given_up) == (1, 1)


async def test_a_patch_of_an_event_the_server_lost_becomes_a_create() -> None:
    clock, sink = FakeClock(), _Sink()
    async with _recorder(sink, clock) as recorder:
        recorder.record(POD, "Normal", "Pulled", "pulled")
        await settle()
        sink.events.clear()
        recorder.record(POD, "Normal", "Pulled", "pulled")
        await settle()
    assert [verb for verb, _, count in sink.calls] == ["create", "patch", "create"]
    (event,) = sink.events.values()
    assert event["count"] == 2


async def test_the_queue_holds_1000_and_a_burst_of_drops_is_one_line_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, sink = FakeClock(), _Sink()
    with caplog.at_level(logging.WARNING):
        async with _recorder(sink, clock) as recorder:
            for i in range(MAX_QUEUED_EVENTS + 37):  # the task has not run yet
                recorder.record(POD, "Normal", "Step", f"step {i}")
            assert recorder.queued == MAX_QUEUED_EVENTS
            assert not any("dropped" in r.getMessage() for r in caplog.records)
            await settle()
            recorder.record(POD, "Normal", "Step", "after the burst")
    drop_lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert drop_lines == [
        "event recorder pool-controller dropped 37 events: its queue of 1000 was full"
    ]
    assert recorder.dropped == 37


async def test_recording_never_blocks_even_while_the_sink_hangs() -> None:
    clock, sink = FakeClock(), _Sink()
    hang = asyncio.Event()

    async def hanging_create(event: dict[str, Any]) -> dict[str, Any]:
        await hang.wait()
        return event

    sink.create = hanging_create  # type: ignore[method-assign]
    async with _recorder(sink, clock) as recorder:
        for i in range(5000):
            recorder.record(POD, "Normal", "Step", f"step {i}")
        assert recorder.queued == MAX_QUEUED_EVENTS
        hang.set()
    assert recorder.dropped > 0


@pytest.mark.parametrize(
    ("obj", "event_type"),
    [(POD, "Error"), ({"kind": "Pod", "metadata": {}}, "Normal")],
)
async def test_bad_input_is_one_line_and_no_event(
    obj: dict[str, Any], event_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock, sink = FakeClock(), _Sink()
    async with _recorder(sink, clock) as recorder:
        recorder.record(obj, event_type, "Oops", "message")
    assert sink.calls == []
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


async def test_the_event_is_a_core_v1_event_named_after_its_object() -> None:
    clock, sink = FakeClock(), _Sink()
    async with _recorder(sink, clock) as recorder:
        recorder.record(POD, "Normal", "Created", "created pod p")
    (event,) = sink.events.values()
    assert event["metadata"]["name"] == f"p.{int(START * 1e9):x}"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ns",
        "uid": "u1",
    }
    assert event["source"] == {"component": "pool-controller", "host": "node-1"}
    assert (event["reportingComponent"], event["reportingInstance"]) == (
        "pool-controller",
        "node-1",
    )
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-05-28T20:26:40Z"


async def test_an_event_the_recorder_cannot_handle_costs_that_event_and_one_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, sink = FakeClock(), _Sink()
    correlate = EventCorrelator.correlate

    def correlate_all_but_the_first(self: EventCorrelator, event: dict[str, Any]) -> Correlated:
        if event["reason"] == "First":
            raise KeyError("involvedObject")
        return correlate(self, event)

    monkeypatch.setattr(EventCorrelator, "correlate", correlate_all_but_the_first)
    async with _recorder(sink, clock) as recorder:
        recorder.record(POD, "Normal", "First", "first")
        recorder.record(POD, "Normal", "Second", "second")
    assert (recorder.written, recorder.given_up) == (1, 1)
    assert len([r for r in caplog.records if "not written" in r.getMessage()]) == 1


async def test_closing_ends_a_retry_sleep_and_gives_the_event_up() -> None:
    clock, sink = FakeClock(), _Sink(failures=[ConnectionResetError("cut")] * 5)
    async with _recorder(sink, clock) as recorder:
        recorder.record(POD, "Normal", "Created", "created")
        await settle()
        assert clock.sleepers == 1
    assert (len(sink.calls), recorder.given_up, recorder.written) == (1, 1, 0)


@dataclass
class _Writes:
    """A write client that records what the sink asks of it."""

    calls: list[tuple[str, object, str | None]] = field(default_factory=list)

    async def create(
        self, resource: Resource, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> Any:
        self.calls.append(("create", obj, namespace))
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": "7"}}

    async def patch(
        self, resource: Resource, name: str, patch: Patch, *, namespace: str | None = None
    ) -> Any:
        assert resource == EVENTS
        self.calls.append(("patch", (name, patch.content_type, patch.wire()), namespace))
        return {"metadata": {"name": name, "namespace": namespace}, "count": 2}


async def test_the_client_sink_creates_events_and_patches_them_by_strategic_merge() -> None:
    writes, clock = _Writes(), FakeClock()
    recorder = EventRecorder(
        sink=ClientEventSink(writes), component="c", host="h", clock=clock, wall=lambda: START
    )
    async with recorder:
        recorder.record(POD, "Normal", "Pulled", "pulled")
        await settle()
        recorder.record(POD, "Normal", "Pulled", "pulled")
    (verb, created, namespace), (patch_verb, patched, _) = writes.calls
    assert (verb, namespace, patch_verb) == ("create", "ns", "patch")
    assert isinstance(created, dict)
    name = created["metadata"]["name"]
    assert patched == (
        name,
        "application/strategic-merge-patch+json",
        {"count": 2, "lastTimestamp": "2026-05-28T20:26:40Z", "message": "pulled"},
    )
