"""Line framing of a streamed body (``k8s_framing``): the read-idle deadline and the cut into
lines."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles.utils.workers.reconcile.clock import settle
from miles.utils.workers.reconcile.k8s_errors import KubernetesConnectionError
from miles.utils.workers.reconcile.k8s_framing import (
    InterruptibleRead,
    ReadIdleDeadline,
    iter_line_batches,
    iter_lines,
)


async def test_read_idle_deadline_counts_only_the_time_a_read_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row "read-idle deadline", one timer per stream: a read that waits less than the deadline
    returns, however long the caller then takes before the next one; a read that waits the whole
    deadline ends with an idle ``KubernetesConnectionError``. The event loop's clock is a fake
    here, so no test time passes."""
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])

    async def passes(seconds: float) -> None:
        now[0] += seconds
        await settle()

    class Content:
        def __init__(self) -> None:
            self.arrived: asyncio.Future[bytes] = loop.create_future()

        async def readany(self) -> bytes:
            try:
                return await self.arrived
            finally:
                self.arrived = loop.create_future()

    content = Content()
    with ReadIdleDeadline(content, 10.0) as stream:
        first = asyncio.ensure_future(stream.readany())
        await settle()
        await passes(9.0)
        content.arrived.set_result(b"frame\n")
        assert await first == b"frame\n"
        await passes(30.0)
        second = asyncio.ensure_future(stream.readany())
        await settle()
        await passes(9.0)
        assert not second.done()
        await passes(1.5)
        assert second.done()
        with pytest.raises(KubernetesConnectionError) as failure:
            second.result()
        assert failure.value.idle


@given(st.lists(st.binary(max_size=60), max_size=6), st.data())
@settings(deadline=None)
def test_line_splitting_ignores_chunk_boundaries(lines: list[bytes], data: st.DataObject) -> None:
    payload = b"".join(line.replace(b"\n", b"") + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), max_size=5)))
    bounds = zip([0, *cuts], [*cuts, len(payload)], strict=True)
    chunks = [payload[a:b] for a, b in bounds if b > a]

    class Content:
        async def readany(self) -> bytes:
            return chunks.pop(0) if chunks else b""

    async def split() -> list[bytes]:
        return [line async for line in iter_lines(Content())]

    expected = [line.replace(b"\n", b"") for line in lines]
    assert asyncio.run(split()) == [line for line in expected if line.strip()]


@given(st.lists(st.binary(max_size=60), max_size=6), st.data())
@settings(deadline=None)
def test_each_batch_is_the_lines_its_read_completes(
    lines: list[bytes], data: st.DataObject
) -> None:
    """A read of whole lines (cut where it lies) and a read that ends inside one, or completes one
    begun before it, give the same batches: per read, the non-blank lines it completes."""
    payload = b"".join(line.replace(b"\n", b"") + b"\n" for line in lines)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(payload) - 1)), max_size=5))))
    bounds = zip([0, *cuts], [*cuts, len(payload)], strict=True)
    chunks = [payload[a:b] for a, b in bounds if b > a]
    expected: list[list[bytes]] = []
    read = b""
    for chunk in chunks:
        *complete, read = (read + chunk).split(b"\n")
        if batch := [line for line in complete if line.strip()]:
            expected.append(batch)
    reads = list(chunks)

    class Content:
        async def readany(self) -> bytes:
            return reads.pop(0) if reads else b""

    async def batches() -> list[list[bytes]]:
        return [batch async for batch in iter_line_batches(Content())]

    assert asyncio.run(batches()) == expected


class _Waiting:
    """A byte stream whose one read waits until the test hands it bytes."""

    def __init__(self) -> None:
        self.arrived: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def readany(self) -> bytes:
        return await self.arrived


async def test_an_interrupted_read_raises_the_error_given() -> None:
    content = _Waiting()
    read = InterruptibleRead(content, now=lambda: 0.0)
    assert not read.interrupt(KubernetesConnectionError("no read waits"))
    waiting = asyncio.ensure_future(read.readany())
    await settle()
    assert read.waiting
    assert read.reads == 1
    assert read.interrupt(KubernetesConnectionError("silent", idle=True))
    with pytest.raises(KubernetesConnectionError, match="silent"):
        await waiting
    assert not read.waiting


async def test_bytes_arriving_in_the_turn_of_the_interrupt_are_returned() -> None:
    """As ``asyncio.timeout``'s expiry: the task is cancelled on the loop's next turn, after the
    read woken in this one has returned."""
    content = _Waiting()
    read = InterruptibleRead(content, now=lambda: 0.0)
    waiting = asyncio.ensure_future(read.readany())
    await settle()
    content.arrived.set_result(b"frame\n")
    read.interrupt(KubernetesConnectionError("too late"))
    assert await waiting == b"frame\n"
    await settle()
    assert not waiting.cancelled()


async def test_a_cancellation_asked_by_another_stays_a_cancellation() -> None:
    content = _Waiting()
    read = InterruptibleRead(content, now=lambda: 0.0)
    waiting = asyncio.ensure_future(read.readany())
    await settle()
    read.interrupt(KubernetesConnectionError("idle"))
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
