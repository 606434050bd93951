"""A response body cut into watch lines, and the deadline on its reads.
Go: apimachinery ``pkg/util/framer`` (the JSON frame reader) and ``StreamWatcher``'s read loop.

``iter_line_batches`` yields the non-blank lines each read completes; ``ReadIdleDeadline`` ends a
read that waits too long for bytes, with one timer for the whole stream. ``k8s_api`` reads every
watch through them; ``k8s_wire`` decodes the lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import nullcontext
from typing import Protocol

from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError, KubernetesConnectionError

MAX_LINE_BYTES = 64 * 2**20
"""Far above etcd's 1.5 MiB object limit; a longer line is read as an undecodable frame."""


class ByteStream(Protocol):
    async def readany(self) -> bytes: ...


async def iter_lines(
    content: ByteStream,
    max_line_bytes: int = MAX_LINE_BYTES,
    *,
    idle_timeout: float | None = None,
) -> AsyncIterator[bytes]:
    """Non-blank lines of a byte stream, however long; see ``iter_line_batches``."""
    async for batch in iter_line_batches(content, max_line_bytes, idle_timeout=idle_timeout):
        for line in batch:
            yield line


async def iter_line_batches(
    content: ByteStream,
    max_line_bytes: int = MAX_LINE_BYTES,
    *,
    idle_timeout: float | None = None,
) -> AsyncGenerator[list[bytes], None]:
    """The non-blank lines each read of a byte stream completes, one list per read.

    A stream that ends inside a line raises ``KubernetesConnectionError`` after the complete lines
    before it; so does one that delivers nothing for ``idle_timeout`` seconds (``idle=True``).
    """
    buffer = bytearray()
    guarded = (
        nullcontext(content) if idle_timeout is None else ReadIdleDeadline(content, idle_timeout)
    )
    with guarded as stream:
        while chunk := await stream.readany():
            scan_from = len(buffer)
            buffer += chunk
            start = 0
            lines: list[bytes] = []
            while (end := buffer.find(b"\n", max(start, scan_from))) != -1:
                line = bytes(buffer[start:end])
                start = end + 1
                if line.strip():
                    lines.append(line)
            del buffer[:start]
            if lines:
                yield lines
            if len(buffer) > max_line_bytes:
                raise FrameDecodeError(f"watch line longer than {max_line_bytes} bytes")
    if buffer.strip():
        raise KubernetesConnectionError(f"stream ended inside a frame ({len(buffer)} bytes)")


def read_idle_error(idle: float, *, server: str | None = None) -> KubernetesConnectionError:
    """What ends a read that has waited ``idle`` seconds for bytes (``idle=True``)."""
    return KubernetesConnectionError(
        f"nothing read for {idle:g}s (read-idle deadline)", idle=True, server=server
    )


class ReadIdleDeadline:
    """``content`` read through a deadline: a read that has waited ``idle`` seconds for bytes ends,
    with one timer for the whole stream.

    A read notes when it started and waits inside an ``asyncio.timeout`` with no deadline of its
    own; the one timer, armed for the ``with`` block, when it fires, expires the read that has
    waited too long, or else re-arms for the read waiting now. A deadline per read
    (``asyncio.timeout(idle)``) scheduled and cancelled one timer per read, and its cancelled
    handles stayed in the event loop's heap until the loop purged them, about a hundred reads
    later. The deadline never spans the caller's ``yield``: a broken chunked body never ends
    aiohttp's reader, and a peer gone without a FIN never sends another byte, but the time the
    caller takes between reads is not silence.
    """

    def __init__(self, content: ByteStream, idle: float) -> None:
        self._content = content
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._read_started = 0.0
        self._reading: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> ReadIdleDeadline:
        self._timer = self._loop.call_at(self._loop.time() + self._idle, self._check)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def readany(self) -> bytes:
        self._read_started = self._loop.time()
        reading = self._reading = asyncio.timeout(None)
        try:
            async with reading:
                return await self._content.readany()
        except TimeoutError:
            if not reading.expired():
                raise
            raise read_idle_error(self._idle) from None
        finally:
            self._reading = None

    def _check(self) -> None:
        now = self._loop.time()
        if self._reading is None:
            self._timer = self._loop.call_at(now + self._idle, self._check)
        elif now - self._read_started >= self._idle:
            self._reading.reschedule(now)
        else:
            self._timer = self._loop.call_at(self._read_started + self._idle, self._check)
