"""A response body cut into watch lines, and the deadline on its reads.
Go: apimachinery ``pkg/util/framer`` (the JSON frame reader) and ``StreamWatcher``'s read loop.

``iter_line_batches`` yields the non-blank lines each read completes; ``ReadIdleDeadline`` ends a
read that waits too long for bytes, with one timer for the whole stream. ``k8s_api`` reads every
watch through them; ``k8s_wire`` decodes the lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import nullcontext
from typing import Any, Protocol

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
            last = len(chunk) - 1
            if not buffer and chunk.find(b"\n") == last:
                # A read of one whole line, as most of a watch's are: cut where it lies, not
                # copied into the buffer and out again (bench.watch_reads: 1.2 us a read to 0.35).
                lines = [] if chunk.isspace() else [chunk[:last]]
            else:
                lines = _complete_lines(buffer, chunk)
            if lines:
                yield lines
            if len(buffer) > max_line_bytes:
                raise FrameDecodeError(f"watch line longer than {max_line_bytes} bytes")
    if buffer.strip():
        raise KubernetesConnectionError(f"stream ended inside a frame ({len(buffer)} bytes)")


def _complete_lines(buffer: bytearray, chunk: bytes) -> list[bytes]:
    """The non-blank lines ``chunk`` completes after the part of one pending in ``buffer``, which
    keeps the part after them. The scan starts at ``chunk``: a long line arriving in many reads is
    not scanned again for each."""
    scan_from = len(buffer)
    buffer += chunk
    start = 0
    lines: list[bytes] = []
    while (end := buffer.find(b"\n", max(start, scan_from))) != -1:
        line = bytes(buffer[start:end])
        start = end + 1
        if line and not line.isspace():
            lines.append(line)
    del buffer[:start]
    return lines


def read_idle_error(idle: float, *, server: str | None = None) -> KubernetesConnectionError:
    """What ends a read that has waited ``idle`` seconds for bytes (``idle=True``)."""
    return KubernetesConnectionError(
        f"nothing read for {idle:g}s (read-idle deadline)", idle=True, server=server
    )


class InterruptibleRead:
    """Reads of ``content`` that a callback may end while one waits (``interrupt``): the reading
    task is cancelled and the read raises the error given instead of ``CancelledError``.

    It does what an ``asyncio.timeout(None)`` around each read, expired by ``reschedule``, did,
    without the timeout's object and its two awaits on every read (``bench.watch_reads`` under
    callgrind). As the timeout did, the task is cancelled on the loop's next turn, so a read whose
    bytes arrive in the turn the callback runs returns them, and a cancellation someone else asked
    for stays theirs. ``began`` is when the last read began, by ``now``.
    """

    def __init__(self, content: ByteStream, *, now: Callable[[], float]) -> None:
        self.reads = 0
        self.began = 0.0
        self._content = content
        self._now = now
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._error: Exception | None = None

    @property
    def waiting(self) -> bool:
        return self._task is not None

    async def readany(self) -> bytes:
        self.reads += 1
        self.began = self._now()
        task = self._task = asyncio.current_task()
        if task is not None:
            self._cancelling = task.cancelling()
        try:
            return await self._content.readany()
        except asyncio.CancelledError:
            error = self._error
            if error is None or task is None or task.uncancel() > self._cancelling:
                raise
            raise error from None
        finally:
            self._task = None
            self._error = None

    def interrupt(self, error: Exception) -> bool:
        """Ends the read waiting now with ``error``; ``False`` when none is waiting."""
        if self._task is None:
            return False
        self._error = error
        asyncio.get_running_loop().call_soon(self._cancel, self.reads)
        return True

    def _cancel(self, read: int) -> None:
        if self._task is not None and self._error is not None and self.reads == read:
            self._task.cancel()


class ReadIdleDeadline(InterruptibleRead):
    """``content`` read through a deadline: a read that has waited ``idle`` seconds for bytes ends,
    with one timer for the whole stream.

    The one timer, armed for the ``with`` block, when it fires, interrupts the read that has
    waited too long, or else re-arms for the read waiting now. A deadline per read
    (``asyncio.timeout(idle)``) scheduled and cancelled one timer per read, and its cancelled
    handles stayed in the event loop's heap until the loop purged them, about a hundred reads
    later. The deadline never spans the caller's ``yield``: a broken chunked body never ends
    aiohttp's reader, and a peer gone without a FIN never sends another byte, but the time the
    caller takes between reads is not silence.
    """

    def __init__(self, content: ByteStream, idle: float) -> None:
        self._loop = asyncio.get_running_loop()
        super().__init__(content, now=self._loop.time)
        self._idle = idle
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> ReadIdleDeadline:
        self._timer = self._loop.call_at(self._loop.time() + self._idle, self._check)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        if not self.waiting:
            self._timer = self._loop.call_at(now + self._idle, self._check)
        elif now - self.began >= self._idle:
            self.interrupt(read_idle_error(self._idle))
        else:
            self._timer = self._loop.call_at(self.began + self._idle, self._check)
