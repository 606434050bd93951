"""Fast layer: no configuration spins. For every period and delay of ``ReconcileLoop``
and ``KubernetesReflector``, the smallest positive values included, a minute of fake time holds a
bounded number of reconciles, requests, reopens and timer wakeups; a clock that counts its sleeps
fails the loop instead of letting a spin hang the test."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import FakePodApi
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, Recorder, parent_of, replace

TINY = [5e-324, 1e-9, 0.3]
MINUTE = 60.0
PARENTS = ("cell-0", "cell-1", "cell-2")


class CountingClock(FakeClock):
    """A fake clock that counts the sleeps it is asked for and refuses more than ``budget``."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.sleeps = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps > self.budget:
            raise AssertionError(f"{self.sleeps} sleeps: something spins")
        await super().sleep(seconds)


class _HangingThenFailing(Recorder):
    """Fails ``cell-0`` at once and hangs ``cell-1`` on the clock, so retries and the
    reconcile timeout both run."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(failing={"cell-0": RuntimeError("boom")})
        self.clock = clock

    async def __call__(self, parent: Any) -> None:
        await super().__call__(parent)
        if parent == "cell-1":
            await self.clock.sleep(10 * MINUTE)


LOOP_ARGUMENTS = [
    "resync_period",
    "failure_base_delay",
    "failure_max_delay",
    "source_retry_delay",
    "slow_reconcile_after",
    "reconcile_timeout",
]


@pytest.mark.parametrize("value", TINY)
@pytest.mark.parametrize("argument", LOOP_ARGUMENTS)
async def test_no_positive_loop_period_or_delay_spins(argument: str, value: float) -> None:
    """Three parents, one failing every reconcile and one hanging until ``reconcile_timeout``,
    a source that ends every stream it opens: per minute at most one resync a second, one retry
    a second per failing parent (the poller's period), about 40 reopens and ten watchdog wakeups
    a second."""
    clock = CountingClock(budget=5_000)
    source = FakeSource()
    source.push(replace(*(Pod(f"p{i}", parent) for i, parent in enumerate(PARENTS))))
    reconcile = _HangingThenFailing(clock)
    kwargs: dict[str, Any] = {argument: value, "reconcile_timeout": 5.0}
    if argument == "failure_max_delay":
        kwargs["failure_base_delay"] = value
    if argument == "reconcile_timeout":
        kwargs["reconcile_timeout"] = value
    loop = ReconcileLoop(
        source=source, reconcile=reconcile, key_map=parent_of, clock=clock, **kwargs
    )
    async with loop:
        source.end()
        for _ in range(int(MINUTE)):
            await clock.advance(1.0)
        status = loop.status()
    resyncs, retries = MINUTE * len(PARENTS), 2 * MINUTE
    assert len(reconcile.calls) <= resyncs + retries + len(PARENTS), reconcile.calls[-5:]
    assert source.opened <= 40, f"{source.opened} streams opened in a minute"
    assert clock.sleeps <= 12 * MINUTE + 200
    assert status.error is None


@pytest.mark.parametrize("value", TINY)
async def test_a_resync_period_below_a_second_is_raised_to_one_second_with_one_warning(
    value: float, caplog: pytest.LogCaptureFixture
) -> None:
    """client-go's ``minimumResyncPeriod``: 1e-9 once made 86,000 reconciles in 1.5 s."""
    clock, source, recorder = FakeClock(), FakeSource(), Recorder()
    source.push(replace(Pod("p", "cell-0")))
    with caplog.at_level(logging.WARNING):
        loop = ReconcileLoop(
            source=source, reconcile=recorder, key_map=parent_of, clock=clock, resync_period=value
        )
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        f"[reconcile] resync_period={value!r} is below the minimum of 1.0s; resyncing every 1.0s"
    )
    async with loop:
        await clock.advance(10.0)
    assert len(recorder.calls) == 1 + 10


@pytest.mark.parametrize("value", TINY)
async def test_no_positive_reflector_retry_delay_spins(value: float) -> None:
    """A server that fails every LIST: the steps climb from ``retry_delay`` (at least 1 ms) to
    30 s and start over every 2 minutes, so ten minutes hold at most 5 climbs of 15 doublings
    and 4 capped steps, one LIST each; the smallest watch timeout changes nothing."""
    clock = CountingClock(budget=1_000)
    failing = KubernetesApiError(500, "InternalError")
    api = FakePodApi(lists=[failing] * 1_000)
    reflector = KubernetesReflector(
        kube_client=api,
        namespace="ns",
        label_selector="",
        retry_delay=value,
        watch_timeout_seconds=1,
        clock=clock,
    )
    loop = ReconcileLoop(
        source=reflector.watch, reconcile=Recorder(), clock=clock, cache_sync_timeout=None
    )
    starting = asyncio.create_task(loop.start())
    for _ in range(600):
        await clock.advance(1.0)
    assert len(api.list_calls) <= 5 * (15 + 4) + 1
    assert not starting.done()
    starting.cancel()
    await asyncio.wait([starting])
    assert math.isfinite(clock.time())
