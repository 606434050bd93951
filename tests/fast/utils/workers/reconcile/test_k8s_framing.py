"""Line framing of a streamed body (``k8s_framing``): the read-idle deadline and the cut into
lines."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles.utils.workers.reconcile.clock import settle
from miles.utils.workers.reconcile.k8s_errors import KubernetesConnectionError
from miles.utils.workers.reconcile.k8s_framing import ReadIdleDeadline, iter_lines


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
