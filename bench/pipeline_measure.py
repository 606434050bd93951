"""The measured passes of ``bench/pipeline.py``: start, the mixed drain and the latency samples
under one clock, and traced memory in a pass of its own.

Go counterpart: none (benchmark measurement).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass

from bench.pipeline_contender import Feed, Now, PipelineFactory, Probe
from bench.pipeline_workload import DRAIN_MARKER_PARENT, Workload, parent_of
from bench.report import percentile

CLOCKS: dict[str, Now] = {"cpu": time.thread_time, "wall": time.perf_counter}


@dataclass
class Memory:
    peak_bytes_per_pod: float
    retained_bytes_per_pod: float


class RunningPipeline:
    """A pipeline on its own feed and probe: the timed phases start it, ``async with`` stops it."""

    def __init__(
        self, factory: PipelineFactory, workload: Workload, *, streamed: bool, now: Now
    ) -> None:
        self.workload = workload
        self.now = now
        self.feed = Feed(workload.world, streamed=streamed, now=now)
        self.probe = Probe(now=now)
        self.pipeline = factory(self.feed.watch, self.probe.reconcile)
        self.probe.read = self.pipeline.get_by_parent

    async def __aenter__(self) -> RunningPipeline:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.pipeline.stop()

    async def start(self) -> float:
        reached = self.probe.expect_all(self.workload.parents)
        began = self.now()
        await self.pipeline.start()
        await reached
        return self.now() - began

    async def drain_mixed(self) -> tuple[float, int]:
        """Events per second until the last one is reconciled, and the reconciles it took."""
        reached = self.probe.expect(DRAIN_MARKER_PARENT)
        reconciles = self.probe.reconciles
        began = self.now()
        self.feed.emit(self.workload.mixed)
        await reached
        elapsed = self.now() - began
        return self.workload.mixed_events / elapsed, self.probe.reconciles - reconciles

    async def latencies(self) -> list[float]:
        samples: list[float] = []
        for event in self.workload.latency:
            reached = self.probe.expect(parent_of(event.obj))
            self.feed.emit((event,))
            started = await reached
            samples.append(started - self.feed.emitted_at)
        return samples


async def measure_pass(
    factory: PipelineFactory, workload: Workload, *, streamed: bool, phase_timeout: float, now: Now
) -> dict[str, float | None]:
    """One pipeline: start, then the mixed events, then (burst only) the latency samples."""
    mode = "streamed" if streamed else "burst"
    measured: dict[str, float | None] = {}
    async with RunningPipeline(factory, workload, streamed=streamed, now=now) as running:
        try:
            async with asyncio.timeout(phase_timeout):
                measured["start_s"] = await running.start()
            async with asyncio.timeout(phase_timeout):
                rate, reconciles = await running.drain_mixed()
            measured[f"{mode}_events_per_s"] = rate
            measured[f"{mode}_reconciles"] = reconciles
            if not streamed and workload.latency:
                async with asyncio.timeout(phase_timeout):
                    samples = await running.latencies()
                measured["latency_median_s"] = statistics.median(samples)
                measured["latency_p99_s"] = percentile(samples, 0.99)
        except TimeoutError:
            print(f"{mode}: timed out after {phase_timeout:.0f}s: {measured}", file=sys.stderr)
    return measured


async def measure_memory(factory: PipelineFactory, workload: Workload) -> Memory:
    """Traced bytes the pipeline adds per pod: at the peak of start, and retained after it."""
    async with RunningPipeline(factory, workload, streamed=False, now=time.perf_counter) as running:
        gc.collect()
        baseline, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        await running.start()
        _, peak = tracemalloc.get_traced_memory()
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    pods = len(workload.world)
    return Memory((peak - baseline) / pods, (retained - baseline) / pods)


def run_memory(factory: PipelineFactory, workload: Workload) -> Memory:
    tracemalloc.start()
    try:
        return asyncio.run(measure_memory(factory, workload))
    finally:
        tracemalloc.stop()
