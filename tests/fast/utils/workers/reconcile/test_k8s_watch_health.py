"""Unit layer (no sockets): ``WatchHealthCheck``'s rule on a ``FakeClock``, with a byte stream
that delivers only when a test says so and a scripted probe. Row "HTTP/2 health check" of
docs/reconcile-loop.md."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConnectionError,
)
from miles.utils.workers.reconcile.k8s_watch_health import (
    PROBE_EVERY,
    PROBE_GRACE,
    WatchHealthCheck,
)

AFTER = 30.0
BACKSTOP = 90.0


class Content:
    """A body that delivers a chunk only when ``deliver`` is called."""

    def __init__(self) -> None:
        self.arrived: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def readany(self) -> bytes:
        try:
            return await self.arrived
        finally:
            self.arrived = asyncio.get_running_loop().create_future()

    def deliver(self, chunk: bytes = b"{}\n") -> None:
        self.arrived.set_result(chunk)


@dataclass
class Apiserver:
    """The probe: each call records its cursor and returns (or raises) the next answer, the last
    one for ever."""

    answers: list[str | Exception | None] = field(default_factory=lambda: [None])
    cursors: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    clock: FakeClock = field(default_factory=FakeClock)
    takes: float = 0.0

    async def probe(self, cursor: str) -> str | None:
        self.cursors.append(cursor)
        self.times.append(self.clock.time())
        if self.takes:
            await self.clock.sleep(self.takes)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@asynccontextmanager
async def checked(
    apiserver: Apiserver, cursor: str | None = "7"
) -> AsyncIterator[tuple[Content, WatchHealthCheck]]:
    content = Content()
    health = WatchHealthCheck(
        content,
        probe=apiserver.probe,
        probe_after=AFTER,
        backstop=BACKSTOP,
        cursor=cursor,
        server="10.0.0.1:6443",
        clock=apiserver.clock,
    )
    async with health:
        yield content, health


def reading(health: WatchHealthCheck) -> asyncio.Task[bytes]:
    return asyncio.ensure_future(health.readany())


async def ended(read: Awaitable[bytes]) -> KubernetesConnectionError:
    with pytest.raises(KubernetesConnectionError) as failure:
        await read
    return failure.value


async def test_an_idle_watch_is_kept_and_probed_every_15s_of_silence() -> None:
    """A read silent for 300 s whose probes find nothing: never ended; the first probe at 30 s,
    then one each ``PROBE_EVERY`` after the last ended, from the watch's cursor."""
    apiserver = Apiserver()
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(AFTER - 0.1)
        assert apiserver.cursors == []
        await apiserver.clock.advance(300.0 - AFTER + 0.1)
        assert not read.done()
        read.cancel()
    assert apiserver.times == [AFTER + PROBE_EVERY * n for n in range(19)]
    assert set(apiserver.cursors) == {"7"}


@pytest.mark.parametrize("takes", [10.0, 20.0])
async def test_probes_of_one_read_begin_15s_apart_and_never_overlap(takes: float) -> None:
    """A probe that takes 10 s is followed by the next 15 s after it began; one that takes 20 s
    (past ``PROBE_EVERY``, within the transport's 15 s deadline plus a wait for a connection) by
    the next as it ends, never two at once."""
    apiserver = Apiserver(takes=takes)
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(100.0)
        read.cancel()
    gap = max(PROBE_EVERY, takes)
    assert apiserver.times == [AFTER + gap * n for n in range(int((100.0 - AFTER) // gap) + 1)]


async def test_a_watch_missing_an_event_the_probe_saw_ends_after_the_grace() -> None:
    """The probe at 30 s sees event 9 after cursor 8 (the last frame's, set by the transport);
    the watch delivers nothing within ``PROBE_GRACE``: it ends, ``stalled``, naming the server,
    the silence and both resourceVersions."""
    apiserver = Apiserver(answers=["9"])
    async with checked(apiserver) as (content, health):
        first = reading(health)
        content.deliver()
        await first
        health.cursor = "8"
        read = reading(health)
        await apiserver.clock.advance(AFTER)
        assert apiserver.cursors == ["8"]
        assert not read.done()
        await apiserver.clock.advance(PROBE_GRACE)
        failure = await ended(read)
    assert failure.kind is ConnectionFailure.STALLED
    assert failure.server == "10.0.0.1:6443"
    assert not failure.idle
    assert "delivered nothing for 32s" in str(failure)
    assert "resourceVersion=9 after resourceVersion=8" in str(failure)


async def test_a_watch_that_delivers_within_the_grace_is_kept() -> None:
    """The probe sees an event; the watch delivers it a second later: alive, and its next read is
    probed afresh 30 s after it began."""
    apiserver = Apiserver(answers=["9", None])
    async with checked(apiserver) as (content, health):
        read = reading(health)
        await apiserver.clock.advance(AFTER + PROBE_GRACE / 2)
        content.deliver()
        assert await read == b"{}\n"
        again = reading(health)
        await apiserver.clock.advance(PROBE_GRACE)
        assert not again.done()
        await apiserver.clock.advance(AFTER)
        assert not again.done()
        again.cancel()
    assert apiserver.times == [AFTER, 2 * AFTER + PROBE_GRACE / 2]


@pytest.mark.parametrize("kind", [ConnectionFailure.TIMEOUT, ConnectionFailure.REFUSED])
async def test_a_probe_that_cannot_reach_the_apiserver_ends_the_watch(
    kind: ConnectionFailure,
) -> None:
    """The probe's connection fails: the watch ends with the probe's kind (the reflector backs off
    from a refused one), its message naming the probe."""
    unreachable = KubernetesConnectionError("connect", kind=kind, server="10.0.0.2:6443")
    apiserver = Apiserver(answers=[unreachable])
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(AFTER)
        failure = await ended(read)
    assert (failure.kind, failure.server) == (kind, "10.0.0.2:6443")
    assert "a probe on another connection failed" in str(failure)


async def test_a_probe_the_server_cannot_answer_leaves_the_read_to_the_backstop() -> None:
    """A 410 to the probe (its cursor compacted away) cannot tell: no further probe of that read,
    which ends at the read-idle backstop."""
    expired = KubernetesApiError(410, "Expired", "too old resource version")
    apiserver = Apiserver(answers=[expired, None])
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(BACKSTOP - 0.1)
        assert not read.done()
        await apiserver.clock.advance(0.1)
        failure = await ended(read)
    assert failure.idle
    assert apiserver.times == [AFTER]


async def test_a_probe_answered_that_the_cursor_is_too_large_ends_the_watch_with_it() -> None:
    """etcd restored from an older snapshot under the apiserver: the probe from the watch's cursor
    is answered 504 "Too large resource version" (v1.36.3's message), which ends the read at once
    with that answer, for the reflector to relist (reason "cursor too large"); a 504 that does not
    say so still cannot tell."""
    too_large = KubernetesApiError(
        504, "Timeout", "Timeout: Too large resource version: 219, current: 214"
    )
    apiserver = Apiserver(answers=[too_large])
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(AFTER)
        with pytest.raises(KubernetesApiError, match="Too large resource version"):
            await read
    gateway = Apiserver(answers=[KubernetesApiError(504, "Gateway Timeout")])
    async with checked(gateway) as (_, health):
        read = reading(health)
        await gateway.clock.advance(AFTER + PROBE_EVERY)
        assert not read.done()
        read.cancel()


async def test_without_a_cursor_only_the_backstop_holds() -> None:
    """A streaming list before its initial events end has no cursor: nothing is probed, and a read
    silent for the backstop ends ``idle``."""
    apiserver = Apiserver()
    async with checked(apiserver, cursor=None) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(BACKSTOP)
        failure = await ended(read)
    assert failure.idle
    assert apiserver.cursors == []


async def test_a_read_with_a_cursor_after_one_without_is_probed_30s_after_it_began() -> None:
    """A streaming list's reads before its initial events end have no cursor (the check waits on
    the backstop, 90 s from the read's start); the read after the end bookmark, begun at 40 s, is
    probed at 70 s, not when the earlier read's backstop would have come."""
    apiserver = Apiserver()
    async with checked(apiserver, cursor=None) as (content, health):
        first = reading(health)
        await apiserver.clock.advance(40.0)
        content.deliver()
        await first
        health.cursor = "8"
        read = reading(health)
        await apiserver.clock.advance(40.0)
        read.cancel()
    assert apiserver.times == [40.0 + AFTER]


async def test_time_between_reads_is_not_silence() -> None:
    """The consumer holds a batch for 100 s between reads: no probe then; the next read is probed
    30 s after it began."""
    apiserver = Apiserver()
    async with checked(apiserver) as (content, health):
        first = reading(health)
        content.deliver()
        await first
        await apiserver.clock.advance(100.0)
        read = reading(health)
        await apiserver.clock.advance(AFTER)
        read.cancel()
    assert apiserver.times == [100.0 + AFTER]


async def test_a_probe_failing_otherwise_ends_the_watch_with_its_failure() -> None:
    """A probe that raises something neither a connection nor an API error (a bug, an undecodable
    answer) ends the watch with it, for the reflector's rule for unknown failures."""
    apiserver = Apiserver(answers=[ValueError("bad probe")])
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(AFTER)
        with pytest.raises(ValueError, match="bad probe"):
            await read


async def test_leaving_the_block_stops_the_check() -> None:
    """``async with`` owns the task: none is left once the block ends, and no sleeper."""
    apiserver = Apiserver()
    before = asyncio.all_tasks()
    async with checked(apiserver) as (_, health):
        read = reading(health)
        await apiserver.clock.advance(1.0)
        read.cancel()
    await apiserver.clock.advance(0.0)
    assert asyncio.all_tasks() - before == set()
    assert apiserver.clock.sleepers == 0
