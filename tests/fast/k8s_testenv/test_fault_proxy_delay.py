"""The HTTP fault proxy's `Delay`: its delay line holds each chunk a fixed time after it arrived,
in order, reading on meanwhile so that the lag does not add up. No cluster: a `FakeClock`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from miles.utils.k8s_testenv.http_fault_proxy import Chunk, Delay, delay_line
from miles.utils.workers.reconcile.clock import FakeClock, settle

HOLD = 1.5


def _chunk(data: bytes) -> Chunk:
    return Chunk(size_line=b"%x" % len(data), data=data)


class _Upstream:
    """Chunks the test hands over one at a time, as an apiserver sends them; `fail` ends the
    stream with an error instead."""

    def __init__(self) -> None:
        self._arriving: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        self.closed = False

    def send(self, data: bytes) -> None:
        self._arriving.put_nowait(_chunk(data))

    async def send_spaced(self, clock: FakeClock, *arrivals: tuple[bytes, float]) -> None:
        """Each chunk sent, then the clock moved on by the gap after it."""
        for data, gap in arrivals:
            self.send(data)
            await clock.advance(gap)

    def fail(self, err: BaseException) -> None:
        self._arriving.put_nowait(err)

    async def chunks(self) -> AsyncIterator[Chunk]:
        try:
            while isinstance(arrived := await self._arriving.get(), Chunk):
                yield arrived
            raise arrived
        finally:
            self.closed = True


class _Client:
    """Reads the delay line, noting when each chunk came out."""

    def __init__(self, upstream: _Upstream, clock: FakeClock, hold: Callable[[Chunk], float]):
        self.received: list[tuple[float, bytes]] = []
        self.error: BaseException | None = None
        self._clock = clock
        self._line = delay_line(upstream.chunks(), hold, now=clock.time, sleep=clock.sleep)
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self._line:
                self.received.append((self._clock.time(), chunk.data))
        except ConnectionError as err:
            self.error = err

    async def close(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task
        await self._line.aclose()


def _delay_line(
    hold: Callable[[Chunk], float] = lambda _: HOLD,
) -> tuple[FakeClock, _Upstream, _Client]:
    """A delay line holding each chunk ``hold(chunk)`` seconds, its upstream and its reader."""
    clock, upstream = FakeClock(), _Upstream()
    return clock, upstream, _Client(upstream, clock, hold)


async def test_each_chunk_comes_out_its_hold_after_it_arrived_so_a_burst_does_not_add_up() -> None:
    clock, upstream, client = _delay_line()
    await upstream.send_spaced(clock, (b"a", 0.5), (b"b", 0.1), (b"c", 0.8))
    assert client.received == []
    await clock.advance(0.1)
    assert client.received == [(1.5, b"a")]
    await clock.advance(1.0)
    assert client.received == [(1.5, b"a"), (2.0, b"b"), (2.1, b"c")]
    await client.close()


async def test_a_chunk_held_less_still_waits_for_the_one_ahead_of_it() -> None:
    clock, upstream, client = _delay_line(lambda chunk: HOLD if chunk.data == b"held" else 0.0)
    await upstream.send_spaced(clock, (b"held", 0.2), (b"not held", 0.2))
    assert client.received == []
    await clock.advance(1.1)
    assert client.received == [(1.5, b"held"), (1.5, b"not held")]
    upstream.send(b"later")
    await settle()
    assert client.received[-1] == (1.5, b"later")
    await client.close()


async def test_a_broken_upstream_is_raised_after_the_chunks_that_came_before_it() -> None:
    clock, upstream, client = _delay_line()
    upstream.send(b"a")
    upstream.fail(ConnectionResetError("reset by peer"))
    await clock.advance(1.0)
    assert client.received == []
    assert client.error is None
    await clock.advance(0.5)
    await client.task
    assert client.received == [(1.5, b"a")]
    assert isinstance(client.error, ConnectionResetError)


async def test_closing_the_line_stops_reading_the_upstream() -> None:
    clock, upstream, client = _delay_line()
    upstream.send(b"a")
    await settle()
    await client.close()
    assert upstream.closed
    assert clock.sleepers == 0


def test_the_last_chunk_carries_the_trailers_and_a_delay_names_its_hold() -> None:
    assert _chunk(b"{}\n").encoded() == b"3\r\n{}\n\r\n"
    last = Chunk(size_line=b"0", trailers=b"x-trailer: 1\r\n")
    assert last.last
    assert last.encoded() == b"0\r\nx-trailer: 1\r\n\r\n"
    assert Delay(1.5).describe() == "delayed 1.5s"
