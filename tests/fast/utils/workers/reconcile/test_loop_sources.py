"""Fast layer: a loop over several sources (``watches.Watch``), each with its own key map and
cache; the one-source shape it extends keeps working."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from miles.utils.workers.reconcile.clock import FakeClock, settle
from miles.utils.workers.reconcile.loop import ReconcileLoop, ReconcileLoopError
from miles.utils.workers.reconcile.source_event import ParentKey, ReplaceEvent, UpsertEvent
from miles.utils.workers.reconcile.watches import Watch
from tests.fast.utils.workers.reconcile.fakes import (
    FakeSource,
    Pod,
    Recorder,
    fake_loop,
    parent_of,
    replace,
    run_until,
    upsert,
)


@dataclass(frozen=True)
class Pool:
    name: str


def _pools(*pools: Pool) -> ReplaceEvent:
    return ReplaceEvent(objects={pool.name: pool for pool in pools})


def _raising_for_bad(pod: Pod) -> ParentKey | None:
    if pod.parent == "bad":
        raise ValueError("no parent for you")
    return pod.parent


def _loop(
    pools: FakeSource, pods: FakeSource, reconcile: Recorder, clock: FakeClock, **kwargs: Any
) -> ReconcileLoop:
    return ReconcileLoop(
        sources=[
            Watch(source=pools, name="pools"),
            Watch(source=pods, key_map=kwargs.pop("pod_key_map", parent_of), name="pods"),
        ],
        reconcile=reconcile,
        clock=clock,
        **kwargs,
    )


async def test_start_returns_once_every_source_synced_and_each_wakes_parents() -> None:
    clock, reconcile, pools, pods = FakeClock(), Recorder(), FakeSource(), FakeSource()
    loop = _loop(pools, pods, reconcile, clock)
    pools.push(_pools(Pool("pool-a")))
    start = asyncio.ensure_future(loop.start())
    await settle()
    assert not start.done(), "the pods source has not synced yet"
    assert not loop.status().synced
    pods.push(replace(Pod("a-0", "pool-a"), Pod("b-0", "pool-b")))
    await start
    try:
        await run_until(lambda: set(reconcile.calls) == {"pool-a", "pool-b"})
        reconcile.calls.clear()
        pods.push(upsert(Pod("a-1", "pool-a")))
        await run_until(lambda: reconcile.calls == ["pool-a"])
        assert [p.name for p in loop.cache("pods").get_by_parent("pool-a")] == ["a-0", "a-1"]
        assert loop.get_by_parent("pool-a") == [Pool("pool-a")], "the first source's cache"
        assert loop.cache().get("pool-a") == Pool("pool-a")
        assert loop.parent_keys() == {"pool-a"}
    finally:
        await loop.stop()


async def test_status_shows_each_source_and_the_first_as_source() -> None:
    clock, reconcile, pools, pods = FakeClock(), Recorder(), FakeSource(), FakeSource()
    loop = _loop(pools, pods, reconcile, clock)
    pools.push(_pools(Pool("pool-a")))
    pods.push(replace(Pod("a-0", "pool-a"), Pod("a-1", "pool-a")))
    async with loop:
        pods.push(upsert(Pod("a-2", "pool-a")))
        await run_until(lambda: loop.status().sources[1].watch_events_applied == 1)
        status = loop.status()
    assert status.synced
    assert [s.name for s in status.sources] == ["pools", "pods"]
    assert [s.objects_stored for s in status.sources] == [1, 3]
    assert [s.synced for s in status.sources] == [True, True]
    assert status.objects_stored == 1, "the first source's"
    assert status.watch_events_applied == 0, "the first source's"
    assert status.source == status.sources[0].source


async def test_a_key_map_raising_for_one_source_never_stalls_the_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, reconcile, pools, pods = FakeClock(), Recorder(), FakeSource(), FakeSource()
    loop = _loop(pools, pods, reconcile, clock, pod_key_map=_raising_for_bad)
    pools.push(_pools(Pool("pool-a")))
    pods.push(replace(Pod("x", "bad")))
    with caplog.at_level(logging.ERROR):
        async with loop:
            await run_until(lambda: reconcile.calls == ["pool-a"])
            pods.push(upsert(Pod("y", "bad")), upsert(Pod("a-0", "pool-a")))
            pools.push(UpsertEvent(key="pool-b", obj=Pool("pool-b")))
            await run_until(lambda: set(reconcile.calls) == {"pool-a", "pool-b"})
            await run_until(lambda: len(loop.cache("pods")) == 1)
            assert loop.status().sources[1].objects_stored == 1
    lines = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert len(lines) == 2
    assert all("no parent for you" in line for line in lines)
    assert all(r.name.endswith("object_store") for r in caplog.records if "not stored" in r.msg)


async def test_resync_queues_the_parents_of_every_source() -> None:
    clock, reconcile, pools, pods = FakeClock(), Recorder(), FakeSource(), FakeSource()
    loop = _loop(pools, pods, reconcile, clock, resync_period=10.0)
    pools.push(_pools(Pool("pool-a")))
    pods.push(replace(Pod("b-0", "pool-b")))
    async with loop:
        await run_until(lambda: len(reconcile.calls) == 2)
        reconcile.calls.clear()
        await clock.advance(10.0)
        await run_until(lambda: len(reconcile.calls) == 2)
        assert sorted(reconcile.calls) == ["pool-a", "pool-b"]


async def test_a_source_that_fails_reopens_alone() -> None:
    clock, reconcile, pools, pods = FakeClock(), Recorder(), FakeSource(), FakeSource()
    loop = _loop(pools, pods, reconcile, clock, source_retry_delay=1.0)
    pools.push(_pools(Pool("pool-a")))
    pods.push(replace())
    async with loop:
        pods.fail(ConnectionError("cut"))
        await settle()
        pools.push(UpsertEvent(key="pool-b", obj=Pool("pool-b")))
        await run_until(lambda: "pool-b" in reconcile.calls)
        assert (pools.opened, pods.opened) == (1, 1)
        pods.push(replace(Pod("c-0", "pool-c")))
        await clock.advance(2.0)
        await run_until(lambda: "pool-c" in reconcile.calls)
        assert (pools.opened, pods.opened) == (1, 2)
        assert "cut" in (loop.status().sources[1].source.last_error or "")


async def test_the_one_source_shape_is_unchanged_and_reports_one_source() -> None:
    clock, reconcile, source = FakeClock(), Recorder(), FakeSource()
    loop = fake_loop(source, reconcile, clock)
    source.push(replace(Pod("a-0", "pool-a")))
    async with loop:
        status = loop.status()
        assert [s.objects_stored for s in status.sources] == [1]
        assert status.sources[0].source == status.source
        assert loop.cache() is loop.cache(status.sources[0].name)
        assert loop.cache().get_by_parent("pool-a") == loop.get_by_parent("pool-a")
        with pytest.raises(KeyError, match="no watch named 'pods'"):
            loop.cache("pods")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, TypeError, "source= or sources="),
        ({"source": FakeSource(), "sources": [Watch(source=FakeSource())]}, TypeError, "both"),
        ({"sources": []}, TypeError, "at least one"),
        ({"sources": [Watch(source=FakeSource())], "key_map": parent_of}, TypeError, "own"),
        ({"sources": [FakeSource()]}, TypeError, "Watch values"),
        (
            {
                "sources": [
                    Watch(source=FakeSource(), name="a"),
                    Watch(source=FakeSource(), name="a"),
                ]
            },
            ValueError,
            "named 'a'",
        ),
    ],
)
async def test_misuse_of_sources_is_a_clear_error(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ReconcileLoop(reconcile=Recorder(), clock=FakeClock(), **kwargs)


async def test_unknown_cache_name_names_the_watches() -> None:
    loop = _loop(FakeSource(), FakeSource(), Recorder(), FakeClock())
    with pytest.raises(KeyError, match=r"\['pools', 'pods'\]"):
        loop.cache("nodes")


async def test_cache_sync_timeout_names_the_source_that_did_not_sync() -> None:
    clock, pools, pods = FakeClock(), FakeSource(), FakeSource()
    loop = _loop(pools, pods, Recorder(), clock, cache_sync_timeout=30.0)
    pools.push(_pools(Pool("pool-a")))
    pods.failing_opens = 1_000
    start = asyncio.ensure_future(loop.start())
    await settle()
    await clock.advance(31.0)
    with pytest.raises(ReconcileLoopError) as raised:
        await start
    message = str(raised.value)
    assert "source 'pods' not synced, its last error: source factory raised" in message
    assert "'pools'" not in message
