"""A loopback TCP proxy the tests control: cut every connection, go silent, resume.

Go counterpart: none in client-go; it plays the network faults toxiproxy's `reset_peer` and
`timeout` toxics play. Bytes pass through untouched (TLS included), so a kubeconfig whose server is
`https://127.0.0.1:<port>` still verifies the apiserver's certificate for 127.0.0.1.

The proxy runs its own event loop on a daemon thread (`loop_thread.LoopThread`), so a busy or
stalled test loop does not stall the traffic of another client (the client-go oracle) through it.
Every public method is called from any thread and returns once the proxy has done it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from miles.utils.k8s_testenv.component import Component
from miles.utils.k8s_testenv.loop_thread import CONTROL_TIMEOUT, LoopThread, LoopThreadError
from miles.utils.k8s_testenv.ports import LOOPBACK

T = TypeVar("T")

_CHUNK = 64 * 1024
_MID_FRAME_DELIVERY = 0.2
"""How long the half chunk gets to reach the client before the reset (a reset drops unread data)."""


def reset_transport(writer: asyncio.StreamWriter) -> None:
    """Closes with a reset (SO_LINGER 0), not an orderly close: the peer reads ECONNRESET."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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
            reset_transport(writer)
        self.cut_done.set()


@dataclass(frozen=True)
class CutReport:
    """What `cut_mid_frame` did: connections cut inside a chunk, and idle ones cut outright."""

    mid_frame: int
    idle: int


class ProxyError(RuntimeError):
    """The proxy is not running (it was stopped, or its thread crashed)."""


class TcpProxy(Component):
    """Forwards `127.0.0.1:<port>` to `upstream_host:upstream_port`; `with` starts and stops it.

    `go_silent()` stops forwarding in both directions and keeps every socket open (new connections
    are accepted and then get no bytes either), as a dead peer behind a live route would;
    `resume()` forwards what was held back. `cut()` resets every open connection;
    `cut_mid_frame()` resets each one halfway through the next chunk the server sends.
    """

    def __init__(self, *, upstream_host: str, upstream_port: int, name: str = "tcp-proxy") -> None:
        self.name = name
        self._upstream = (upstream_host, upstream_port)
        self._thread = LoopThread(name=name, cleanup=self._close_everything)
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._connections: set[_Connection] = set()
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise ProxyError(f"{self.name} is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        try:
            self._port = self._thread.start(self._serve())
        except LoopThreadError as err:
            raise ProxyError(str(err)) from err

    def stop(self) -> None:
        """Resets every connection, closes the listener and joins the thread."""
        self._thread.stop()

    def kill(self) -> None:
        """Stops forwarding as a crash would: `failure()` then says so (tests of the harness)."""
        self._thread.kill()

    def failure(self) -> str | None:
        """Why the proxy is not forwarding any more, or None while it runs (or after `stop()`)."""
        return self._thread.failure()

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

    async def _serve(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, host=LOOPBACK, port=0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _close_everything(self) -> None:
        if self._flowing is not None:
            self._flowing.set()
        for connection in list(self._connections):
            connection.abort()
        if self._server is not None:
            self._server.close()

    def _submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            return self._thread.submit(work)
        except LoopThreadError as err:
            raise ProxyError(str(err)) from err

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        return self._submit(work).result(timeout=CONTROL_TIMEOUT)

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
