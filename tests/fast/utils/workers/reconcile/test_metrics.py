"""Fast layer: ``metrics_provider.py`` and ``metrics.py``: what a loop reports, and
controller-runtime's series made of it, read at scrape time."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from miles.utils.workers.reconcile.clock import Clock, FakeClock, settle
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.metrics import (
    RECONCILE_TIME_BUCKETS,
    Buckets,
    LoopSeries,
    ReconcileMetrics,
)
from miles.utils.workers.reconcile.metrics_provider import (
    MetricsProvider,
    NoMetrics,
    ReconcileResult,
)
from miles.utils.workers.reconcile.source_event import ParentKey
from miles.utils.workers.reconcile.status import SourcePhase, SourceStatus
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    Switch,
    fake_loop,
    replace,
    upsert,
)

NAME = "pool-a"
QUEUE = {"name": NAME, "controller": NAME}
LOOP = {"controller": NAME}


def _loop(source: Any, reconcile: Any, clock: FakeClock, **kwargs: Any) -> ReconcileLoop:
    return fake_loop(source, reconcile, clock, name=NAME, **kwargs)


def _value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


def _histogram(
    registry: CollectorRegistry, name: str, labels: dict[str, str], *bounds: str
) -> tuple[object, ...]:
    """A histogram's count, sum and cumulative bucket counts at ``bounds``."""
    buckets = [_value(registry, f"{name}_bucket", {**labels, "le": le}) for le in bounds]
    return (
        _value(registry, f"{name}_count", labels),
        _value(registry, f"{name}_sum", labels),
        buckets,
    )


async def test_queue_series_depth_adds_retries_and_durations() -> None:
    source, clock, registry = FakeSource(), FakeClock(), CollectorRegistry()
    gate = asyncio.Event()
    recorder = Recorder()
    recorder.failing["cell-1"] = ValueError("down")

    async def reconcile(parent: ParentKey) -> None:
        await gate.wait()
        await clock.sleep(0.5)
        await recorder(parent)

    loop = _loop(source, reconcile, clock, metrics=registry)
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1"), Pod("c", "cell-2")))
    async with loop:
        await clock.advance(2.0)
        assert _value(registry, "workqueue_depth", {**QUEUE, "priority": ""}) == 2
        assert _value(registry, "workqueue_adds_total", QUEUE) == 3
        assert _value(registry, "workqueue_unfinished_work_seconds", QUEUE) == 2.0
        assert _value(registry, "workqueue_longest_running_processor_seconds", QUEUE) == 2.0
        assert _value(registry, "controller_runtime_active_workers", LOOP) == 1
        assert _value(registry, "controller_runtime_max_concurrent_reconciles", LOOP) == 1
        gate.set()
        await clock.advance(0.5)
        await clock.advance(0.5)
        await clock.advance(0.5)
        assert _value(registry, "workqueue_depth", {**QUEUE, "priority": ""}) == 0
        assert _value(registry, "workqueue_unfinished_work_seconds", QUEUE) == 0
        assert _value(registry, "controller_runtime_active_workers", LOOP) == 0
        assert _value(registry, "workqueue_retries_total", QUEUE) == 1
        waited = _histogram(registry, "workqueue_queue_duration_seconds", QUEUE, "1.0", "10.0")
        assert waited == (3, pytest.approx(0 + 2.5 + 3.0), [1, 3])
        worked = "workqueue_work_duration_seconds"
        assert _value(registry, f"{worked}_sum", QUEUE) == pytest.approx(2.5 + 0.5 + 0.5)
        assert _value(registry, f"{worked}_bucket", {**QUEUE, "le": "+Inf"}) == 3


async def test_reconcile_series_by_result_errors_timeouts_and_time() -> None:
    source, clock, registry = FakeSource(), FakeClock(), CollectorRegistry()

    async def reconcile(parent: ParentKey) -> None:
        if parent == "cell-1":
            raise ValueError("down")
        if parent == "cell-2":
            await clock.sleep(100.0)
        await clock.sleep(0.2)

    loop = _loop(
        source,
        reconcile,
        clock,
        metrics=registry,
        reconcile_timeout=3.0,
        failure_base_delay=100.0,
        failure_max_delay=100.0,
    )
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1"), Pod("c", "cell-2")))
    async with loop:
        await clock.advance(0.2)
        await clock.advance(3.0)
        assert (
            _value(registry, "controller_runtime_reconcile_total", {**LOOP, "result": "success"})
            == 1
        )
        assert (
            _value(registry, "controller_runtime_reconcile_total", {**LOOP, "result": "error"}) == 2
        )
        assert _value(registry, "controller_runtime_reconcile_errors_total", LOOP) == 2
        assert _value(registry, "controller_runtime_reconcile_timeouts_total", LOOP) == 1
        timed = _histogram(
            registry, "controller_runtime_reconcile_time_seconds", LOOP, "0.25", "3.0"
        )
        assert timed == (3, pytest.approx(0.2 + 0 + 3.0), [2, 3])
    assert RECONCILE_TIME_BUCKETS[0] == 0.005
    assert RECONCILE_TIME_BUCKETS[-1] == 60.0
    assert len(RECONCILE_TIME_BUCKETS) == 40


class _RecordingProvider:
    """A ``MetricsProvider`` that is its own ``LoopMetrics`` and writes every report down."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.reports: list[tuple[str, object]] = []
        self.source_status: Callable[[], SourceStatus] | None = None

    def loop_metrics(
        self, name: str, *, clock: Clock, source_status: Callable[[], SourceStatus]
    ) -> _RecordingProvider:
        self.asked.append(name)
        self.source_status = source_status
        return self

    def added(self, count: int) -> None:
        self.reports.append(("added", count))

    def started(self, at: float) -> None:
        self.reports.append(("started", at))

    def finished(self, result: ReconcileResult) -> None:
        self.reports.append(("finished", result))

    def retried(self) -> None:
        self.reports.append(("retried", None))


async def test_the_loop_reports_adds_starts_results_and_retries_to_its_provider() -> None:
    source, clock, provider = FakeSource(), FakeClock(), _RecordingProvider()

    async def reconcile(parent: ParentKey) -> None:
        if parent == "cell-1":
            raise ValueError("down")
        if parent in ("cell-2", "cell-3"):
            await clock.sleep(100.0)

    loop = _loop(
        source,
        reconcile,
        clock,
        metrics=provider,
        reconcile_timeout=3.0,
        failure_base_delay=1000.0,
        failure_max_delay=1000.0,
    )
    assert isinstance(provider, MetricsProvider)
    assert provider.asked == [NAME]
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1"), Pod("c", "cell-2")))
    async with loop:
        await clock.advance(3.0)
        assert provider.source_status is not None
        assert provider.source_status().lists == 1
        source.push(upsert(Pod("d", "cell-3")), upsert(Pod("e", "cell-3")))
        await settle()
    assert provider.reports == [
        ("added", 3),
        ("started", 0.0),
        ("finished", "success"),
        ("started", 0.0),
        ("retried", None),
        ("finished", "error"),
        ("started", 0.0),
        ("retried", None),
        ("finished", "timeout"),
        ("added", 1),
        ("started", 3.0),
        ("finished", "stopped"),
    ], "a key already queued is not added again; stop() ends the reconcile in flight"


async def test_a_failure_while_the_loop_stops_is_reported_without_a_retry() -> None:
    source, clock, provider = FakeSource(), FakeClock(), _RecordingProvider()

    async def reconcile(parent: ParentKey) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    source.push(replace(Pod("a", "cell-0")))
    async with _loop(source, reconcile, clock, metrics=provider):
        await settle()
    assert provider.reports == [("added", 1), ("started", 0.0), ("finished", "error")]


async def test_a_loop_stopped_during_a_reconcile_leaves_nothing_in_flight() -> None:
    source, clock, registry = FakeSource(), FakeClock(), CollectorRegistry()

    async def reconcile(parent: ParentKey) -> None:
        await clock.sleep(100.0)

    source.push(replace(Pod("a", "cell-0")))
    async with _loop(source, reconcile, clock, metrics=registry):
        await clock.advance(2.0)
        assert _value(registry, "controller_runtime_active_workers", LOOP) == 1
    await clock.advance(5.0)
    assert _value(registry, "controller_runtime_active_workers", LOOP) == 0
    assert _value(registry, "workqueue_unfinished_work_seconds", QUEUE) == 0
    assert _value(registry, "workqueue_queue_duration_seconds_count", QUEUE) == 1
    assert _value(registry, "workqueue_work_duration_seconds_count", QUEUE) == 0
    assert _value(registry, "controller_runtime_reconcile_total", {**LOOP, "result": "error"}) == 0


async def test_a_parent_put_back_by_the_leadership_gate_is_not_counted_twice() -> None:
    source, clock, registry, switch = FakeSource(), FakeClock(), CollectorRegistry(), Switch(True)
    loop = _loop(source, Recorder(), clock, metrics=registry, leadership=switch)
    source.push(replace())
    async with loop:
        await settle()
        switch.leading = False
        source.push(upsert(Pod("a", "cell-0")))
        await clock.advance(2.0)
        assert _value(registry, "workqueue_depth", {**QUEUE, "priority": ""}) == 1
        assert _value(registry, "workqueue_adds_total", QUEUE) == 1
        switch.set(True)
        await settle()
        assert _value(registry, "workqueue_depth", {**QUEUE, "priority": ""}) == 0
        assert _value(registry, "workqueue_adds_total", QUEUE) == 1
        assert _value(registry, "workqueue_queue_duration_seconds_sum", QUEUE) == 2.0


def test_the_default_provider_measures_nothing() -> None:
    clock = FakeClock()
    assert NoMetrics().loop_metrics(NAME, clock=clock, source_status=SourceStatus) is None
    assert isinstance(NoMetrics(), MetricsProvider)
    assert isinstance(ReconcileMetrics(CollectorRegistry()), MetricsProvider)


class _Reflector:
    name = "ns/app=engine"

    def __init__(self, source: FakeSource) -> None:
        self._source = source
        self.report = SourceStatus(
            phase=SourcePhase.WATCHING,
            cursor="4711",
            lists=3,
            watches=5,
            events=42,
            relists={"expired": 2},
        )

    def watch(self) -> Any:
        return self._source()

    def source_status(self) -> SourceStatus:
        return self.report


async def test_reflector_series_come_from_the_sources_status_at_scrape_time() -> None:
    source, clock, registry = FakeSource(), FakeClock(), CollectorRegistry()
    reflector = _Reflector(source)
    ReconcileLoop(source=reflector.watch, reconcile=Recorder(), clock=clock, metrics=registry)
    labels = {"name": "ns/app=engine"}
    assert _value(registry, "reflector_lists_total", labels) == 3
    assert _value(registry, "reflector_watches_total", labels) == 5
    assert _value(registry, "reflector_events_total", labels) == 42
    assert _value(registry, "reflector_relists_total", {**labels, "reason": "expired"}) == 2
    assert _value(registry, "reflector_last_resource_version", labels) == 4711
    reflector.report = SourceStatus(lists=4, cursor=None)
    assert _value(registry, "reflector_lists_total", labels) == 4
    assert _value(registry, "reflector_last_resource_version", labels) is None


async def test_the_drivers_own_view_feeds_the_reflector_series_of_a_plain_source() -> None:
    source, clock, registry = FakeSource(), FakeClock(), CollectorRegistry()
    source.push(replace(Pod("a", "cell-0")), upsert(Pod("a", "cell-0", 1)))
    async with _loop(source, Recorder(), clock, metrics=registry):
        await settle()
        assert _value(registry, "reflector_lists_total", {"name": NAME}) == 1
        assert _value(registry, "reflector_events_total", {"name": NAME}) == 1, (
            "watch events, as a reflector counts them: the upsert, not the listing"
        )


async def test_a_registry_that_refuses_the_names_is_one_error_at_construction() -> None:
    registry = CollectorRegistry()
    Counter("workqueue_adds", "taken already", registry=registry)
    before = asyncio.all_tasks()
    with pytest.raises(ValueError, match="refused the reconcile loop's series"):
        _loop(FakeSource(), Recorder(), FakeClock(), metrics=registry)
    assert asyncio.all_tasks() == before
    shared = CollectorRegistry()
    _loop(FakeSource(), Recorder(), FakeClock(), metrics=shared)
    with pytest.raises(ValueError, match="share one ReconcileMetrics"):
        _loop(FakeSource(), Recorder(), FakeClock(), metrics=shared)


async def test_loops_sharing_a_registry_share_one_reconcile_metrics_by_name() -> None:
    registry = CollectorRegistry()
    metrics = ReconcileMetrics(registry)
    clock = FakeClock()
    for name in ("engines", "trainers"):
        ReconcileLoop(
            source=FakeSource(), reconcile=Recorder(), clock=clock, name=name, metrics=metrics
        )
    with pytest.raises(ValueError, match="'engines' already reports"):
        ReconcileLoop(source=FakeSource(), reconcile=Recorder(), name="engines", metrics=metrics)
    text = generate_latest(registry).decode()
    assert 'workqueue_depth{controller="engines",name="engines",priority=""} 0.0' in text
    assert 'workqueue_depth{controller="trainers",name="trainers",priority=""} 0.0' in text


async def test_a_failing_metrics_backend_never_breaks_reconciles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock, registry = FakeSource(), FakeClock(), CollectorRegistry()
    recorder = Recorder()
    loop = _loop(source, recorder, clock, metrics=registry)
    series = loop._metrics
    assert isinstance(series, LoopSeries)

    series.work_duration = None  # type: ignore[assignment]
    source.push(replace(Pod("a", "cell-0"), Pod("b", "cell-1")))
    async with loop:
        await settle()
        assert recorder.calls == ["cell-0", "cell-1"]
        assert caplog.text.count("metrics stopped observing reconciles") == 1

        def broken_status() -> SourceStatus:
            raise RuntimeError("status broke")

        loop._driver.source_status = broken_status  # type: ignore[method-assign]
        loop._reporter = None
        with caplog.at_level(logging.ERROR):
            text = generate_latest(registry).decode()
        assert "workqueue_depth{" not in text, "that loop's series are skipped"
        assert "metrics scrape skipped this loop" in caplog.text
        source.push(upsert(Pod("a", "cell-0", 1)))
        await settle()
        assert recorder.calls[-1] == "cell-0"


def test_the_runtime_imports_and_runs_without_prometheus_client() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["prometheus_client"] = None
        from miles.utils.workers.reconcile.loop import ReconcileLoop
        from miles.utils.workers.reconcile.source_event import ReplaceEvent

        async def source():
            yield ReplaceEvent({"a": 1})
            await asyncio.Event().wait()

        async def main():
            seen = []
            async def reconcile(parent):
                seen.append(parent)
            async with ReconcileLoop(source=source, reconcile=reconcile) as loop:
                for _ in range(1000):
                    if seen:
                        break
                    await asyncio.sleep(0)
                assert seen == ["a"], seen
                assert loop.status().reconciles == 1
            assert "miles.utils.workers.reconcile.metrics" not in sys.modules

        asyncio.run(main())
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_buckets_fold_in_batches_and_a_snapshot_counts_what_is_pending() -> None:
    buckets = Buckets((1.0, 2.0))
    for value in [0.5] * 1000 + [1.5] * 30:
        buckets.observe(value)
    assert len(buckets.pending) == 1030 - Buckets.FOLD_EVERY, "folded once, at 1024"
    cumulative, total = buckets.snapshot()
    assert cumulative == [("1.0", 1000.0), ("2.0", 1030.0), ("+Inf", 1030.0)]
    assert total == pytest.approx(500 + 45)
    assert buckets.snapshot() == (cumulative, total), "a snapshot changes nothing"
    buckets.observe(9.0)
    assert buckets.snapshot()[0][-1] == ("+Inf", 1031.0)
