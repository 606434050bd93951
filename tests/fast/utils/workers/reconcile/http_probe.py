"""A raw HTTP/1.1 exchange over a real socket on 127.0.0.1, for the probe and metrics servers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: str


async def exchange(port: int, raw: bytes) -> Answer:
    """Sends ``raw`` as is and reads the answer to the end of the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split(" ")[1]), headers, body.decode())


async def get(port: int, target: str, *, method: str = "GET", **headers: str) -> Answer:
    lines = [
        f"{method} {target} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return await exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode())
