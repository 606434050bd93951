"""`TcpProxy` against a loopback echo server: forwarding, cut, cut mid-frame, silence, death.

Layer: k8s_apiserver (differential), though it needs no cluster: it proves the faults the
differential harness injects do what their names say. Waits are bounded socket reads, never sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from miles.utils.k8s_testenv.tcp_proxy import ProxyError, TcpProxy

_READ = 5.0


@asynccontextmanager
async def _echo_server() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, host="127.0.0.1", port=0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@asynccontextmanager
async def _started(proxy: TcpProxy) -> AsyncIterator[TcpProxy]:
    await asyncio.to_thread(proxy.start)
    try:
        yield proxy
    finally:
        await asyncio.to_thread(proxy.stop)


@asynccontextmanager
async def _proxied() -> AsyncIterator[tuple[TcpProxy, asyncio.StreamReader, asyncio.StreamWriter]]:
    async with (
        _echo_server() as port,
        _started(TcpProxy(upstream_host="127.0.0.1", upstream_port=port)) as proxy,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            yield proxy, reader, writer
        finally:
            writer.close()


async def _round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), _READ)


async def test_bytes_pass_through_unchanged() -> None:
    async with _proxied() as (_, reader, writer):
        payload = bytes(range(256)) * 1000
        assert await _round_trip(reader, writer, payload) == payload


async def test_cut_resets_every_open_connection() -> None:
    async with _proxied() as (proxy, reader, writer):
        await _round_trip(reader, writer, b"hello")
        assert await asyncio.to_thread(proxy.cut) == 1
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), _READ)


async def _until_registered(proxy: TcpProxy) -> None:
    """The proxy accepted the connection and dialled upstream (connect returns before that)."""
    for _ in range(int(_READ / 0.01)):
        if proxy.open_connections >= 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the proxy registered no connection within {_READ}s")


class _Recorder(asyncio.Protocol):
    """Keeps every byte received and how the connection ended (a StreamReader would hide the
    bytes that arrived just before a reset behind the reset)."""

    def __init__(self) -> None:
        self.received = b""
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


async def test_cut_mid_frame_forwards_half_of_the_next_chunk_then_resets() -> None:
    async with (
        _echo_server() as port,
        _started(TcpProxy(upstream_host="127.0.0.1", upstream_port=port)) as proxy,
    ):
        loop = asyncio.get_running_loop()
        transport, recorder = await loop.create_connection(_Recorder, "127.0.0.1", proxy.port)
        try:
            await _until_registered(proxy)
            cut = proxy.cut_mid_frame(idle_after=_READ)
            transport.write(b"x" * 1000)
            report = await asyncio.wrap_future(cut)
            ended_by = await asyncio.wait_for(recorder.lost, _READ)
        finally:
            transport.close()
        assert report.mid_frame == 1
        assert 0 < len(recorder.received) < 1000
        assert isinstance(ended_by, ConnectionResetError)


async def test_silence_holds_bytes_back_until_resume() -> None:
    async with _proxied() as (proxy, reader, writer):
        await _round_trip(reader, writer, b"before")
        await asyncio.to_thread(proxy.go_silent)
        writer.write(b"held")
        await writer.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.3)
        assert proxy.open_connections == 1
        await asyncio.to_thread(proxy.resume)
        assert await asyncio.wait_for(reader.readexactly(4), _READ) == b"held"


async def test_a_dead_proxy_reports_why_and_refuses_control() -> None:
    async with _proxied() as (proxy, _, _):
        assert proxy.failure() is None
        await asyncio.to_thread(proxy.kill)
        problem = proxy.failure()
        assert problem is not None
        assert "killed" in problem
        with pytest.raises(ProxyError):
            proxy.cut()
