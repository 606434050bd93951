"""A silent watch told dead or idle by asking the apiserver on another connection.
Go: x/net/http2's connection health check (``ReadIdleTimeout`` 30 s, ``PingTimeout`` 15 s, set by
apimachinery ``pkg/util/net/http.go``), which HTTP/1.1 cannot send on a watch's own connection.

``WatchHealthCheck`` wraps a watch's byte stream. Once a read has waited ``probe_after`` seconds,
it asks ``probe`` whether the apiserver had an event after the watch's cursor (a short watch from
that cursor on another connection, in ``k8s_api``): an event the watch has still not delivered
``PROBE_GRACE`` seconds later ends the read with ``KubernetesConnectionError`` (``stalled``); no
event keeps the watch, asked again ``PROBE_EVERY`` seconds after the last probe began; a probe that
cannot reach the apiserver ends the read with the probe's own failure, and so does one answered
that the cursor is ahead of the server's revision (504 "Too large resource version": its history
went back, as when etcd is restored from an older snapshot), which the reflector relists on. A
probe the server answers without telling (410 Expired, 429, other 5xx) leaves that read to the
read-idle ``backstop``, which also holds while the watch has no cursor (a streaming list before
its initial events end).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

from miles.utils.workers.reconcile.clock import Clock, time_function
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    KubernetesApiError,
    KubernetesConnectionError,
)
from miles.utils.workers.reconcile.k8s_framing import (
    ByteStream,
    InterruptibleRead,
    read_idle_error,
)
from miles.utils.workers.reconcile.log import one_line

PROBE_EVERY = 15.0
"""Seconds from one probe of a silent read to the next: client-go's ``PingTimeout``, so a silent
watch costs at most four short probe watches a minute."""
PROBE_GRACE = 2.0
"""Seconds the watch may take to deliver an event a probe has seen before it is judged dead: the
apiserver sends one event to all its watchers at once, so a live connection delivers it within
milliseconds; the grace covers a busy client or server."""

Probe = Callable[[str], Awaitable[str | None]]
"""Asks the apiserver, on another connection, for the first event after a cursor: its
resourceVersion, or ``None`` when it had none. Raises ``KubernetesConnectionError`` when the
apiserver cannot be reached and ``KubernetesApiError`` when it answered without telling."""


class _Answer(Enum):
    ALIVE = "alive"
    UNDECIDED = "undecided"


@dataclass(frozen=True, slots=True)
class _Read:
    """The read waiting now: its number (one per ``readany``) and when it began."""

    number: int
    began: float


class WatchHealthCheck(InterruptibleRead):
    """``content`` read under a health check; ``async with`` runs the task that keeps it.

    ``cursor`` is the resourceVersion of the last frame the watch delivered (the caller sets it)
    or the one it was opened from; ``None`` while there is none to probe from. ``server`` names
    the apiserver in the error that ends a dead watch.
    """

    def __init__(
        self,
        content: ByteStream,
        *,
        probe: Probe,
        probe_after: float,
        backstop: float,
        cursor: str | None,
        server: str | None,
        clock: Clock,
    ) -> None:
        super().__init__(content, now=time_function(clock))
        self.cursor = cursor
        self._probe = probe
        self._probe_after = probe_after
        self._backstop = backstop
        self._server = server
        self._clock = clock
        self._keeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WatchHealthCheck:
        self._keeper = asyncio.create_task(self._keep(), name="watch health check")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper

    def _waiting(self) -> _Read | None:
        return _Read(self.reads, self.began) if self.waiting else None

    async def _keep(self) -> None:
        probed = (0, 0.0)  # the read last probed, and when that probe began
        undecided = 0  # a read whose probe the server answered without telling
        while True:
            read = self._waiting()
            if read is None:
                await self._clock.sleep(min(self._probe_after, self._backstop))
                continue
            cursor = None if undecided == read.number else self.cursor
            if cursor is None:
                due = read.began + self._backstop
            elif probed[0] == read.number:
                due = probed[1] + PROBE_EVERY
            else:
                due = read.began + self._probe_after
            if (wait := due - self._now()) > 0:
                # At most probe_after: a read without a cursor may be followed by one with it.
                await self._clock.sleep(min(wait, self._probe_after))
                continue
            asked = self._now()
            answer = (
                read_idle_error(self._backstop, server=self._server)
                if cursor is None
                else await self._ask(read, cursor)
            )
            if isinstance(answer, Exception):
                if self._end(read, answer):
                    return
            elif answer is _Answer.UNDECIDED:
                undecided = read.number
            probed = (read.number, asked)

    async def _ask(self, read: _Read, cursor: str) -> _Answer | Exception:
        """What a probe from ``cursor`` says of the watch: alive, undecided, or the error that
        ends it."""
        try:
            missed = await self._probe(cursor)
        except KubernetesApiError as err:
            return err if _too_large(err) else _Answer.UNDECIDED
        except KubernetesConnectionError as err:
            return self._unreachable(read, err)
        except Exception as err:  # a probe that fails otherwise ends the watch with its failure
            return err
        if missed is None:
            return _Answer.ALIVE
        await self._clock.sleep(PROBE_GRACE)
        return self._stalled(read, cursor, missed)

    def _end(self, read: _Read, verdict: Exception) -> bool:
        """Expires ``read`` with ``verdict`` if it is still the read waiting."""
        if self._waiting() != read:
            return False
        return self.interrupt(verdict)

    def _silence(self, read: _Read) -> str:
        return f"{self._now() - read.began:.0f}s"

    def _stalled(self, read: _Read, cursor: str, missed: str) -> KubernetesConnectionError:
        return KubernetesConnectionError(
            f"pod watch on {self._server or 'the apiserver'} delivered nothing for "
            f"{self._silence(read)} while the apiserver had event resourceVersion={missed} after "
            f"resourceVersion={cursor} (a probe on another connection saw it)",
            kind=ConnectionFailure.STALLED,
            server=self._server,
        )

    def _unreachable(self, read: _Read, err: KubernetesConnectionError) -> Exception:
        return KubernetesConnectionError(
            f"pod watch delivered nothing for {self._silence(read)} and a probe on another "
            f"connection failed: {one_line(err)}",
            kind=err.kind,
            server=err.server or self._server,
            reason=err.reason,
        )


def _too_large(err: KubernetesApiError) -> bool:
    """The apiserver's answer to a cursor beyond its revision: 504, with the cause
    ``ResourceVersionTooLarge`` or the message "Too large resource version" (v1.36.3 sends both)."""
    if err.code != 504:
        return False
    causes = getattr(err, "causes", ())
    named = any(getattr(cause, "reason", "") == "ResourceVersionTooLarge" for cause in causes)
    return named or "too large resource version" in str(err).lower()
