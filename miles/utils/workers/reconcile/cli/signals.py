"""SIGINT and SIGTERM for a command that owns the terminal. Go: kubectl's ``pkg/util/interrupt``
(``interrupt.New(onSignal, cleanup).Run(fn)``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator

INTERRUPTED_EXIT = 130
SIGNAL_EXIT_BASE = 128
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _on_stop_signals(handler: Callable[[int], None]) -> Iterator[None]:
    """``handler(signum)`` runs on the event loop for SIGINT and SIGTERM while the block runs."""
    loop = asyncio.get_running_loop()
    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, handler, signum)
    try:
        yield
    finally:
        for signum in _STOP_SIGNALS:
            loop.remove_signal_handler(signum)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` instead of raising, so teardown runs as ordinary code."""
    with _on_stop_signals(lambda signum: stop.set()):
        yield


class SignalCancel:
    """SIGINT and SIGTERM cancel the task that installed this, at whatever it awaits (connecting,
    listing, watching), so ``finally`` blocks restore the terminal; :attr:`exit_code` is then
    ``128 + signal`` (130, 143), as a shell reports a process killed by it. A second signal
    cancels the teardown too."""

    def __init__(self) -> None:
        self.received: int | None = None

    @property
    def exit_code(self) -> int | None:
        return None if self.received is None else SIGNAL_EXIT_BASE + self.received

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            if self.received is None:
                self.received = signum
            task.cancel()

        with _on_stop_signals(on_signal):
            yield

    async def run(self, work: Awaitable[None]) -> int | None:
        """Await ``work``; on a signal, its exit code instead of the cancellation."""
        task = asyncio.current_task()
        assert task is not None
        with self.installed():
            try:
                await work
            except asyncio.CancelledError:
                if self.received is None:
                    raise
                task.uncancel()
        return self.exit_code
