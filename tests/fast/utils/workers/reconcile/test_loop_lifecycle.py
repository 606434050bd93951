"""Fast layer: ``loop.py``'s lifecycle as one state: the transition table, the phases a loop
passes through, and misuse raising ``ReconcileLoopUsageError`` (still the ``RuntimeError`` and
``AssertionError`` the original raised; record row "Lifecycle")."""

from __future__ import annotations

import asyncio

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.loop import (
    LoopPhase,
    ReconcileLoop,
    ReconcileLoopError,
    ReconcileLoopUsageError,
    _Event,
    _Lifecycle,
    _transition,
)
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, Recorder, parent_of, replace

P = LoopPhase
BOOM = RuntimeError("boom")

TABLE = [
    (P.NEW, _Event.START, P.STARTING),
    (P.STARTING, _Event.SYNCED, P.RUNNING),
    (P.DRAINING, _Event.SYNCED, P.DRAINING),
    (P.STOPPING, _Event.STOPPED, P.STOPPED),
    *[(live, _Event.DRAIN, P.DRAINING) for live in (P.RUNNING, P.STARTING, P.DRAINING)],
    *[(stoppable, _Event.STOP, P.STOPPING) for stoppable in (P.NEW, P.RUNNING, P.DRAINING, P.DIED)],
    *[(ended, _Event.DRAIN, ended) for ended in (P.STOPPED, P.DIED)],
]


@pytest.mark.parametrize(("phase", "event", "then"), TABLE)
def test_the_transition_table(phase: LoopPhase, event: _Event, then: LoopPhase) -> None:
    assert _transition(_Lifecycle(phase), event).phase is then


@pytest.mark.parametrize("phase", [P.STARTING, P.RUNNING, P.DRAINING])
def test_a_running_loop_dies_with_its_error_and_keeps_it_to_the_end(phase: LoopPhase) -> None:
    died = _transition(_Lifecycle(phase), _Event.DIE, error=BOOM, cancelled_owner=True)
    assert (died.phase, died.error, died.cancelled_owner) == (P.DIED, BOOM, True)
    stopped = _transition(_transition(died, _Event.STOP), _Event.STOPPED)
    assert (stopped.phase, stopped.error) == (P.STOPPED, BOOM)


@pytest.mark.parametrize("phase", [p for p in LoopPhase if p is not P.NEW])
def test_start_is_accepted_from_new_only(phase: LoopPhase) -> None:
    with pytest.raises(ReconcileLoopUsageError, match="once per ReconcileLoop"):
        _transition(_Lifecycle(phase), _Event.START)


def _loop(source: FakeSource, reconcile: object = None) -> ReconcileLoop:
    return ReconcileLoop(
        source=source,
        reconcile=reconcile or Recorder(),  # type: ignore[arg-type]
        key_map=parent_of,
        clock=FakeClock(),
    )


async def test_a_loop_passes_through_its_phases() -> None:
    source = FakeSource()
    source.push(replace(Pod("a", "cell-0")))
    loop = _loop(source)
    seen = [loop.phase]
    await loop.start()
    seen.append(loop.phase)
    await loop.drain()
    seen.append(loop.phase)
    await loop.stop()
    seen.append(loop.phase)
    assert seen == [P.NEW, P.RUNNING, P.DRAINING, P.STOPPED]
    assert loop.status().stopped


async def test_a_death_is_a_phase_and_stop_still_tears_down() -> None:
    source = FakeSource()
    source.push(replace(Pod("a", "cell-0")))
    loop = _loop(source)
    await loop.start()
    assert loop._worker is not None
    loop._worker.cancel()
    await settle()
    assert loop.phase is P.DIED
    assert loop.status().stopped
    with pytest.raises(ReconcileLoopError):
        await loop.stop()
    assert loop.phase.value == "stopped"


@pytest.mark.parametrize("caught", [RuntimeError, AssertionError, ReconcileLoopUsageError])
async def test_start_twice_and_start_after_stop_are_usage_errors(
    caught: type[Exception],
) -> None:
    source = FakeSource()
    source.push(replace(Pod("a", "cell-0")))
    loop = _loop(source)
    async with loop:
        with pytest.raises(caught, match="once per ReconcileLoop, before stop"):
            await loop.start()
    with pytest.raises(caught, match="once per ReconcileLoop, before stop"):
        await loop.start()


@pytest.mark.parametrize("caught", [AssertionError, RuntimeError, ReconcileLoopUsageError])
async def test_stop_inside_reconcile_is_a_usage_error_the_original_callers_still_catch(
    caught: type[Exception],
) -> None:
    source = FakeSource()
    raised: list[BaseException] = []

    async def reconcile(parent: ParentKey) -> None:
        try:
            await loop.stop()
        except caught as exc:
            raised.append(exc)

    loop = _loop(source, reconcile)
    source.push(replace(Pod("a", "cell-0")))
    async with loop:
        await settle()
        assert loop.phase is P.RUNNING, "the refused stop() left the loop running"
    [exc] = raised
    assert isinstance(exc, ReconcileLoopUsageError)
    assert "asyncio.create_task(loop.stop())" in str(exc)


def test_another_event_loop_is_a_usage_error() -> None:
    async def construct() -> ReconcileLoop:
        source = FakeSource()
        source.push(replace(Pod("a", "cell-0")))
        return _loop(source)

    first = asyncio.new_event_loop()
    try:
        loop = first.run_until_complete(construct())
        with pytest.raises(ReconcileLoopUsageError, match="another event loop"):
            asyncio.run(loop.start())
        first.run_until_complete(loop.stop())
    finally:
        first.close()


def test_every_keyword_is_documented_with_its_default() -> None:
    import inspect

    doc = ReconcileLoop.__doc__ or ""
    for name, parameter in inspect.signature(ReconcileLoop.__init__).parameters.items():
        if name == "self":
            continue
        assert f"``{name}``" in doc, name
        if parameter.default is not inspect.Parameter.empty:
            line = doc[doc.index(f"``{name}``") :].split("\n    - ")[0]
            assert "(" in line, f"{name}: no default stated"
