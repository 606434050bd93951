"""A loopback TCP proxy the tests control: cut every connection, go silent, resume.

Go counterpart: none in client-go; it plays the network faults toxiproxy's `reset_peer` and
`timeout` toxics play. Bytes pass through untouched (TLS included), so a kubeconfig whose server is
`https://127.0.0.1:<port>` still verifies the apiserver's certificate for 127.0.0.1.

The proxy runs its own event loop on a daemon thread, so a busy or stalled test loop does not stall
the traffic of another client (the client-go oracle) through it. Every public method is called from
any thread and returns once the proxy has done it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from miles.utils.k8s_testenv.ports import LOOPBACK

T = TypeVar("T")

_CHUNK = 64 * 1024
_CONTROL_TIMEOUT = 10.0
_CLOSE_GRACE = 0.5
"""How long closing waits for the pumps to see their aborted sockets before cancelling them."""
_MID_FRAME_DELIVERY = 0.2
"""How long the half chunk gets to reach the client before the reset (a reset drops unread data)."""


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    cut_next_chunk: bool = False
    closed: bool = False
    cut_done: asyncio.Event = field(default_factory=asyncio.Event)

    def abort(self) -> None:
        """Closes both sides at once; the client gets a reset, not an orderly close."""
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self.cut_done.set()


@dataclass(frozen=True)
class CutReport:
    """What `cut_mid_frame` did: connections cut inside a chunk, and idle ones cut outright."""

    mid_frame: int
    idle: int


class ProxyError(RuntimeError):
    """The proxy is not running (it was stopped, or its thread crashed)."""


class TcpProxy:
    """Forwards `127.0.0.1:<port>` to `upstream_host:upstream_port`; `with` starts and stops it.

    `go_silent()` stops forwarding in both directions and keeps every socket open (new connections
    are accepted and then get no bytes either), as a dead peer behind a live route would;
    `resume()` forwards what was held back. `cut()` resets every open connection;
    `cut_mid_frame()` resets each one halfway through the next chunk the server sends.
    """

    def __init__(self, *, upstream_host: str, upstream_port: int, name: str = "tcp-proxy") -> None:
        self.name = name
        self._upstream = (upstream_host, upstream_port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._connections: set[_Connection] = set()
        self._port: int | None = None
        self._crash: BaseException | None = None
        self._stopping = False
        self._killed = False

    @property
    def port(self) -> int:
        if self._port is None:
            raise ProxyError(f"{self.name} is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise ProxyError(f"{self.name} is already started")
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run_thread, args=(ready,), name=self.name, daemon=True
        )
        self._thread.start()
        self._port = ready.result(timeout=_CONTROL_TIMEOUT)

    def stop(self) -> None:
        """Resets every connection, closes the listener and joins the thread."""
        self._stopping = True
        self._halt()
        self._thread = None

    def kill(self) -> None:
        """Stops forwarding as a crash would: `failure()` then says so (tests of the harness)."""
        self._killed = True
        self._halt()

    def _halt(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=_CONTROL_TIMEOUT)

    def failure(self) -> str | None:
        """Why the proxy is not forwarding any more, or None while it runs (or after `stop()`)."""
        if self._stopping or self._thread is None:
            return None
        if self._killed:
            return f"{self.name} was killed"
        if self._crash is not None:
            return f"{self.name} crashed: {type(self._crash).__name__}: {self._crash}"
        if not self._thread.is_alive():
            return f"{self.name} thread exited"
        return None

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def go_silent(self) -> None:
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        self._call(self._set_flowing(True))

    def cut(self) -> int:
        """Resets every open connection now; returns how many there were."""
        return self._call(self._cut_all())

    def cut_mid_frame(self, *, idle_after: float) -> concurrent.futures.Future[CutReport]:
        """Arms every open connection to forward half of the next server chunk and then reset.

        A connection that receives nothing within `idle_after` seconds is reset outright. The
        future resolves once every armed connection is closed; make the server send something
        (write an object the clients watch) after calling this.
        """
        return self._submit(self._cut_mid_frame(idle_after))

    def _run_thread(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(ready))
            loop.run_forever()
        except BaseException as err:
            self._crash = err
            if not ready.done():
                ready.set_exception(err)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(self._close_everything())
            loop.close()

    async def _serve(self, ready: concurrent.futures.Future[int]) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, host=LOOPBACK, port=0)
        ready.set_result(self._server.sockets[0].getsockname()[1])

    async def _close_everything(self) -> None:
        if self._flowing is not None:
            self._flowing.set()
        for connection in list(self._connections):
            connection.abort()
        if self._server is not None:
            self._server.close()
        # A connection accepted while closing starts a handler task of its own: repeat until none
        # is left, so none is still connecting upstream when the loop closes.
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            _, pending = await asyncio.wait(tasks, timeout=_CLOSE_GRACE)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        loop = self._loop
        problem = self.failure()
        if loop is None or problem is not None or self._stopping:
            work.close()
            raise ProxyError(problem or f"{self.name} is not running")
        return asyncio.run_coroutine_threadsafe(work, loop)

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        return self._submit(work).result(timeout=_CONTROL_TIMEOUT)

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _cut_all(self) -> int:
        connections = list(self._connections)
        for connection in connections:
            connection.abort()
        return len(connections)

    async def _cut_mid_frame(self, idle_after: float) -> CutReport:
        connections = [c for c in self._connections if not c.closed]
        for connection in connections:
            connection.cut_next_chunk = True
        waits = [asyncio.create_task(c.cut_done.wait()) for c in connections]
        if waits:
            await asyncio.wait(waits, timeout=idle_after)
        for wait in waits:
            wait.cancel()
        idle = [c for c in connections if not c.closed]
        for connection in idle:
            connection.abort()
        return CutReport(mid_frame=len(connections) - len(idle), idle=len(idle))

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_w.transport.abort()
            return
        connection = _Connection(client=client_w, upstream=upstream_w)
        self._connections.add(connection)
        try:
            await asyncio.gather(
                self._pump(client_r, upstream_w, connection, from_server=False),
                self._pump(upstream_r, client_w, connection, from_server=True),
            )
        except asyncio.CancelledError:
            pass
        finally:
            connection.abort()
            self._connections.discard(connection)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        connection: _Connection,
        *,
        from_server: bool,
    ) -> None:
        assert self._flowing is not None
        try:
            while data := await reader.read(_CHUNK):
                await self._flowing.wait()
                if connection.closed:
                    return
                if from_server and connection.cut_next_chunk:
                    writer.write(data[: max(1, len(data) // 2)])
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    await asyncio.sleep(_MID_FRAME_DELIVERY)
                    connection.abort()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            connection.abort()
