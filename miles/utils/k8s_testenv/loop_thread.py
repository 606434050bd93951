"""An asyncio event loop on a daemon thread, driven from any thread (Go: a goroutine).

The test proxies run on one, so a busy or stalled test loop cannot stall the traffic of another
client (the client-go oracle) through them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CONTROL_TIMEOUT = 10.0
_CLOSE_GRACE = 0.5
"""How long closing waits for tasks to see their aborted sockets before cancelling them."""


class LoopThreadError(RuntimeError):
    """The loop is not running (it was stopped, or its thread crashed)."""


class LoopThread:
    """`start(setup)` runs `setup` on a new loop and returns its result; the loop then runs until
    `stop()` or `kill()`, after which `cleanup` runs on it and every task left is awaited (then
    cancelled)."""

    def __init__(self, *, name: str, cleanup: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._cleanup = cleanup
        self._crash: BaseException | None = None
        self._stopping = False
        self._killed = False

    def start(self, setup: Coroutine[Any, Any, T]) -> T:
        if self._thread is not None:
            setup.close()
            raise LoopThreadError(f"{self.name} is already started")
        ready: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(setup, ready), name=self.name, daemon=True
        )
        self._thread.start()
        return ready.result(timeout=CONTROL_TIMEOUT)

    def stop(self) -> None:
        self._stopping = True
        self._halt()
        self._thread = None

    def kill(self) -> None:
        """Stops the loop as a crash would: `failure()` then says so (tests of the harness)."""
        self._killed = True
        self._halt()

    def failure(self) -> str | None:
        """Why the loop is not running any more, or None while it runs (or after `stop()`)."""
        if self._stopping or self._thread is None:
            return None
        if self._killed:
            return f"{self.name} was killed"
        if self._crash is not None:
            return f"{self.name} crashed: {type(self._crash).__name__}: {self._crash}"
        if not self._thread.is_alive():
            return f"{self.name} thread exited"
        return None

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        loop = self._loop
        problem = self.failure()
        if loop is None or problem is not None or self._stopping:
            work.close()
            raise LoopThreadError(problem or f"{self.name} is not running")
        return asyncio.run_coroutine_threadsafe(work, loop)

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        return self.submit(work).result(timeout=CONTROL_TIMEOUT)

    def _halt(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=CONTROL_TIMEOUT)

    def _run(self, setup: Coroutine[Any, Any, T], ready: concurrent.futures.Future[T]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            ready.set_result(loop.run_until_complete(setup))
            loop.run_forever()
        except BaseException as err:
            self._crash = err
            if not ready.done():
                ready.set_exception(err)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(self._close())
            loop.close()

    async def _close(self) -> None:
        await self._cleanup()
        # A connection accepted while closing starts a handler task of its own: repeat until none
        # is left, so none is still connecting upstream when the loop closes.
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            _, pending = await asyncio.wait(tasks, timeout=_CLOSE_GRACE)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
