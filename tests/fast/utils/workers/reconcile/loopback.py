"""A scripted server on a free port of 127.0.0.1, for the write transports' fast tests."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Accept = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def loopback_server(accept: Accept, *, tls: ssl.SSLContext | None) -> AsyncIterator[str]:
    """Serves ``accept`` on each connection (over TLS with ``tls``) until the block ends; yields
    the server's URL."""
    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
