"""A small HTTP/1.1 server for probes and metrics. Go: CR ``pkg/internal/httpserver`` over
``net/http``'s ``Server`` and ``ServeMux``.

One request per connection (``Connection: close``), ``GET`` and ``HEAD`` only, the request head
bounded in size and in time; a request body is never read. A bad request gets a status code and
one debug log line, never a traceback; a handler that raises gets a 500 and one error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

from miles.utils.workers.reconcile.arguments import positive_finite

logger = logging.getLogger(__name__)

TEXT_PLAIN = "text/plain; charset=utf-8"
MAX_REQUEST_HEAD = 8192
REQUEST_HEAD_TIMEOUT = 10.0
"""Go's ``httpserver.New`` sets ``ReadHeaderTimeout`` to 32 s; a probe's head arrives at once."""
_METHODS = ("GET", "HEAD")


@dataclass(frozen=True, slots=True)
class Request:
    path: str
    """Percent-decoded, without the query."""
    query: Mapping[str, list[str]]
    """Every parameter, a bare ``?verbose`` included with the value ``""``."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """By lower-cased name; a repeated header keeps its last value."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = TEXT_PLAIN
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]
"""Answers every request the server accepts; ``not_found`` for a path it does not serve."""


def text(status: int, body: str, **headers: str) -> Response:
    headers = {"X-Content-Type-Options": "nosniff", **headers}
    return Response(status, body.encode(), TEXT_PLAIN, headers)


def not_found() -> Response:
    """Go's ``http.NotFound``."""
    return text(HTTPStatus.NOT_FOUND, "404 page not found\n")


def parse_address(address: str) -> tuple[str | None, int] | None:
    """A Go bind address: ``":8080"`` (every interface), ``"127.0.0.1:0"``, ``"[::1]:8080"``;
    ``"0"`` or ``""`` is off (``None``), as CR's ``BindAddress`` and ``HealthProbeBindAddress``."""
    if address in ("", "0"):
        return None
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bind address {address!r} is not host:port (e.g. ':8080'); '0' is off")
    host = host.removeprefix("[").removesuffix("]")
    return (host or None), int(port)


class HttpServer:
    """Serves ``handler`` on ``host:port`` inside ``async with``; ``port`` is the port bound."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str | None,
        port: int,
        name: str,
        head_timeout: float = REQUEST_HEAD_TIMEOUT,
    ) -> None:
        self._handler = handler
        self._host = host
        self._requested_port = port
        self.name = name
        self._head_timeout = positive_finite("head_timeout", head_timeout)
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError(f"the {self.name} server is not serving")
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> HttpServer:
        try:
            self._server = await asyncio.start_server(
                self._serve, self._host, self._requested_port, limit=MAX_REQUEST_HEAD
            )
        except OSError as exc:
            where = f"{self._host or ''}:{self._requested_port}"
            reason = f"{self.name} server cannot listen on {where}: {exc.strerror}"
            raise OSError(exc.errno, reason) from None
        logger.info("%s server listening on port %d", self.name, self.port)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response, head_only = await self._respond(reader)
            writer.write(_encode(response, head_only))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        try:
            async with asyncio.timeout(self._head_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.LimitOverrunError, ValueError):
            return _bad(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"), False
        except TimeoutError:
            return _bad(HTTPStatus.REQUEST_TIMEOUT, "request head not received in time"), False
        method, target, version = _request_line(head)
        if not version.startswith("HTTP/1.") or not target.startswith("/"):
            return _bad(HTTPStatus.BAD_REQUEST, f"malformed request line {head[:80]!r}"), False
        if method not in _METHODS:
            allow = ", ".join(_METHODS)
            return text(HTTPStatus.METHOD_NOT_ALLOWED, "Method Not Allowed\n", Allow=allow), False
        parts = urlsplit(target)
        query = parse_qs(parts.query, keep_blank_values=True)
        request = Request(unquote(parts.path), query, _headers(head))
        try:
            response = await self._handler(request)
        except Exception as exc:
            logger.error("%s server: %s %s failed: %r", self.name, method, request.path, exc)
            response = text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error\n")
        return response, method == "HEAD"


def _request_line(head: bytes) -> tuple[str, str, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else ("", "", "")


def _headers(head: bytes) -> dict[str, str]:
    found = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon:
            found[name.strip().lower()] = value.strip()
    return found


def _bad(status: HTTPStatus, reason: str) -> Response:
    logger.debug("bad HTTP request: %s", reason)
    return text(status, f"{status.value} {status.phrase}\n")


def _encode(response: Response, head_only: bool) -> bytes:
    status = HTTPStatus(response.status)
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in response.headers.items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body
