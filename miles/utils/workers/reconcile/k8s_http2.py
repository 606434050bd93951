"""HTTP/2 to the apiserver: one TLS connection carries every write in flight, framed here, the
header blocks by ``k8s_hpack``. Go: golang.org/x/net/http2 ``Transport``.

``Http2Transport`` offers ``h2`` and ``http/1.1`` by ALPN; where the server picks ``h2`` all
requests are streams of one connection (as client-go's), the frames a loop turn made sent in one
write; where it does not (a plain ``http`` server, a proxy that speaks only HTTP/1.1) every
request goes through ``k8s_http.HttpTransport`` instead. On one connection the apiserver spends
less CPU per write than on sixteen HTTP/1.1 ones; the frames are made and read here rather than
by the ``h2`` library, whose state machine cost the client more than that saving (record row
"``client/``: HTTP/2 to the apiserver").

The credentials, TLS context, deadlines and connection errors are ``HttpTransport``'s (its
``k8s_http.Endpoint``, ``DeadlineTimer`` and ``ServerTransport``). A cut connection fails its
streams with ``KubernetesConnectionError`` and nothing is sent again, except a stream the server did
not process: one it refused (``RST_STREAM`` ``REFUSED_STREAM``) or one above the last stream id of
its ``GOAWAY``, sent again on a new connection, as Go's ``canRetryError``. A new stream waits while
the server's ``MAX_CONCURRENT_STREAMS`` are open (Go's ``StrictMaxConcurrentStreams``; the apiserver
allows hundreds). Both directions keep HTTP/2's flow control; a server that breaks the protocol ends
the connection and its streams.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Unpack

from miles.utils.workers.reconcile.k8s_errors import KubernetesConnectionError
from miles.utils.workers.reconcile.k8s_hpack import HeaderDecoder, HpackError, StaticEncoder
from miles.utils.workers.reconcile.k8s_http import (
    DeadlineTimer,
    Headers,
    HttpTransport,
    ServerTransport,
    TransportOptions,
    ready_headers,
    request_headers,
)
from miles.utils.workers.reconcile.k8s_transport import RawResponse, Request

RECEIVE_WINDOW = 16 << 20
"""Bytes the server may send ahead, per stream and on the connection. Go: http2 ``Transport``'s
``transportDefaultStreamFlow`` (4 MiB) and ``transportDefaultConnFlow`` (1 GiB); larger than the
first so a LIST answer is not held back waiting for window updates."""
SEND_AGAIN = 5
"""Times a stream the server did not process is sent again (Go retries such a request six
times)."""
_PATH_NAME = b"\x04"
"""A literal field, not indexed, named by the static table's ``:path`` (RFC 7541 6.2.2)."""
_LENGTH_NAME = b"\x0f\x0d"
"""The same, named by its ``content-length`` (index 28: 15 and 13 more)."""


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME_HEAD = struct.Struct(">IBI")  # length (24 bits) and type, flags, stream id (RFC 9113 4.1)
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE = (
    0,
    1,
    3,
    4,
    5,
    6,
    7,
    8,
)
_CONTINUATION = 9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_MAX_FRAME = 16384
"""The largest frame this side takes (the default ``SETTINGS_MAX_FRAME_SIZE``, never raised)."""
_FIRST_WINDOW = 65535
_MAX_STREAM_ID = (1 << 31) - 1
_REFUSED_STREAM = 0x7
_CANCEL = 0x8
_ERROR_NAMES = (
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
    "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
    "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
)  # fmt: skip


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME_HEAD.pack((len(payload) << 8) | kind, flags, stream_id) + payload


def _error_name(code: int) -> str:
    return _ERROR_NAMES[code] if code < len(_ERROR_NAMES) else f"error {code:#x}"


class _ProtocolError(Exception):
    """The server broke HTTP/2: the connection is of no further use."""


class _Unprocessed(Exception):
    """The server did not process the stream: it may be sent again."""


@dataclass(eq=False)
class _Stream:
    answer: asyncio.Future[RawResponse]
    expires: float | None
    send_window: int
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    unacknowledged: int = 0
    window: asyncio.Future[None] | None = None
    heard: int = 0  # the connection's reads when the stream opened


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection, framed here (RFC 9113; header blocks by ``k8s_hpack``): the streams
    in flight, both directions' flow control, and one write of the frames a loop turn made."""

    def __init__(self) -> None:
        self.streams: dict[int, _Stream] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.draining = False
        self._encoder = StaticEncoder()
        self._decoder = HeaderDecoder()
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._flushing = False
        self._next_id = 1
        self._max_streams = 100  # until the server's SETTINGS say (Go's client assumes 100)
        self._max_frame = _MAX_FRAME
        self._initial_window = _FIRST_WINDOW
        self._send_window = _FIRST_WINDOW
        self._unacknowledged = 0
        self._block: tuple[int, int, bytearray] | None = None  # a header block's stream, flags
        self._slots: list[asyncio.Future[None]] = []
        self._reads = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.alpn != "h2":
            return  # not a byte of HTTP/2 to a server that did not pick it; the opener closes it
        settings = struct.pack(">HIHI", 0x2, 0, 0x4, RECEIVE_WINDOW)  # no push; the window
        more = struct.pack(">I", RECEIVE_WINDOW - _FIRST_WINDOW)
        transport.write(
            _PREFACE + _frame(_SETTINGS, 0, 0, settings) + _frame(_WINDOW_UPDATE, 0, 0, more)
        )

    @property
    def alpn(self) -> str | None:
        assert self.transport is not None
        ssl_object = self.transport.get_extra_info("ssl_object")
        return None if ssl_object is None else ssl_object.selected_alpn_protocol()

    def usable(self) -> bool:
        return not (self.closed or self.draining)

    def full(self) -> bool:
        return len(self.streams) >= self._max_streams

    async def slot(self) -> None:
        """Until a stream more may open under the server's ``MAX_CONCURRENT_STREAMS``."""
        while self.full():
            waiter = asyncio.get_running_loop().create_future()
            self._slots.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._slots:
                    self._slots.remove(waiter)
            if not self.usable():
                raise _Unprocessed("the connection closed before the stream opened")

    async def exchange(
        self, block: bytes, body: bytes | None, expires: float | None
    ) -> RawResponse:
        """The answer to a request of the header block ``block`` (static-table HPACK)."""
        stream_id = self._next_id
        if stream_id > _MAX_STREAM_ID:
            self.draining = True  # stream ids run out after 2**30 requests: a new connection
            raise _Unprocessed("no stream id left on the connection")
        self._next_id += 2
        answer: asyncio.Future[RawResponse] = asyncio.get_running_loop().create_future()
        stream = _Stream(answer, expires, self._initial_window, heard=self._reads)
        self.streams[stream_id] = stream
        try:
            # No fields: a table size update alone where the server's SETTINGS asked for one.
            block = self._encoder.encode(()) + block
            self._send_headers(stream_id, block, not body)
            sent = self._queue_body(stream_id, stream, body, 0) if body else 0
            if body and sent < len(body):
                await self._send_rest(stream_id, stream, body, sent)
            self._flush_soon()
            return await answer
        except BaseException:
            self._abandon(stream_id)
            raise

    def _send_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        size = self._max_frame
        flags = _END_STREAM if end_stream else 0
        if len(block) <= size:
            self._out.append(_frame(_HEADERS, flags | _END_HEADERS, stream_id, block))
            return
        pieces = [block[i : i + size] for i in range(0, len(block), size)]
        self._out.append(_frame(_HEADERS, flags, stream_id, pieces[0]))
        for piece in pieces[1:-1]:
            self._out.append(_frame(_CONTINUATION, 0, stream_id, piece))
        self._out.append(_frame(_CONTINUATION, _END_HEADERS, stream_id, pieces[-1]))

    def _queue_body(self, stream_id: int, stream: _Stream, body: bytes, sent: int) -> int:
        """Queues DATA frames of ``body`` from ``sent`` on as far as both windows allow; the
        bytes of it queued so far."""
        while sent < len(body):
            room = min(self._send_window, stream.send_window, self._max_frame, len(body) - sent)
            if room <= 0:
                return sent
            piece = body[sent : sent + room]
            sent += room
            self._send_window -= room
            stream.send_window -= room
            flags = _END_STREAM if sent == len(body) else 0
            self._out.append(_frame(_DATA, flags, stream_id, piece))
        return sent

    async def _send_rest(self, stream_id: int, stream: _Stream, body: bytes, sent: int) -> None:
        """The rest of a body the flow-control windows held back, queued as they open."""
        while sent < len(body):
            self._flush_soon()
            stream.window = asyncio.get_running_loop().create_future()
            either: list[asyncio.Future[Any]] = [stream.answer, stream.window]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if stream.answer.done():
                return  # the server answered (or reset) before taking the whole body
            sent = self._queue_body(stream_id, stream, body, sent)

    def _abandon(self, stream_id: int) -> None:
        """A stream its caller no longer waits for (a deadline, a cancel): reset, if still open."""
        if self.streams.pop(stream_id, None) is None or self.closed:
            return
        self._wake_one()
        if self.draining and not self.streams:
            self.close()
            return
        self._out.append(_frame(_RST_STREAM, 0, stream_id, struct.pack(">I", _CANCEL)))
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def data_received(self, data: bytes) -> None:
        self._reads += 1
        buffer = self._buffer
        buffer += data
        at, end = 0, len(buffer)
        try:
            while end - at >= 9:
                head, flags, stream_id = _FRAME_HEAD.unpack_from(buffer, at)
                length = head >> 8
                if length > _MAX_FRAME:
                    raise _ProtocolError(f"a frame of {length} bytes")
                if end - at - 9 < length:
                    break
                payload = bytes(buffer[at + 9 : at + 9 + length])
                at += 9 + length
                self._on_frame(head & 0xFF, flags, stream_id & _MAX_STREAM_ID, payload)
        except (_ProtocolError, HpackError, struct.error, IndexError) as err:
            self._fail_all(KubernetesConnectionError(f"HTTP/2 protocol error: {err}"))
            self.close()
            return
        del buffer[:at]
        if self._unacknowledged > RECEIVE_WINDOW // 2:
            increment = struct.pack(">I", self._unacknowledged)
            self._out.append(_frame(_WINDOW_UPDATE, 0, 0, increment))
            self._unacknowledged = 0
        if self._out:
            self._flush_soon()

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != _CONTINUATION:
            raise _ProtocolError("a header block broken off")
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind in (_HEADERS, _CONTINUATION):
            self._on_header_block(kind, flags, stream_id, payload)
        elif kind == _SETTINGS:
            if not flags & _ACK:
                self._on_settings(payload)
        elif kind == _WINDOW_UPDATE:
            self._on_window(stream_id, int.from_bytes(payload[:4]) & _MAX_STREAM_ID)
        elif kind == _PING:
            if not flags & _ACK:
                self._out.append(_frame(_PING, _ACK, 0, payload))
        elif kind == _RST_STREAM:
            self._on_reset(stream_id, int.from_bytes(payload[:4]))
        elif kind == _GOAWAY:
            self._on_goaway(int.from_bytes(payload[:4]) & _MAX_STREAM_ID)
        elif kind == _PUSH_PROMISE:
            raise _ProtocolError("a push promise, with push disabled")

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._unacknowledged += len(payload)
        stream = self.streams.get(stream_id)
        if flags & _PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if stream is None:
            return
        if payload:
            stream.chunks.append(payload)
        if flags & _END_STREAM:
            self._end(stream_id)
            return
        stream.unacknowledged += len(payload)
        if stream.unacknowledged > RECEIVE_WINDOW // 2:  # a long answer: its window again
            increment = struct.pack(">I", stream.unacknowledged)
            self._out.append(_frame(_WINDOW_UPDATE, 0, stream_id, increment))
            stream.unacknowledged = 0

    def _on_header_block(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """HEADERS and its CONTINUATIONs, decoded whole (every block, for the decoder's table)."""
        if kind == _HEADERS:
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & _PRIORITY:
                payload = payload[5:]
            if not flags & _END_HEADERS:
                self._block = (stream_id, flags, bytearray(payload))
                return
        else:
            if self._block is None or self._block[0] != stream_id:
                raise _ProtocolError("a CONTINUATION without its HEADERS")
            self._block[2].extend(payload)
            if not flags & _END_HEADERS:
                return
            stream_id, flags, block = self._block
            self._block, payload = None, bytes(block)
        fields = self._decoder.decode(payload)
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._on_headers(stream, fields)
        if flags & _END_STREAM:
            self._end(stream_id)

    @staticmethod
    def _on_headers(stream: _Stream, fields: Iterable[tuple[str, str]]) -> None:
        if stream.status >= 200:
            return  # trailers
        own = stream.headers
        for name, value in fields:
            if name == ":status":
                stream.status = int(value)
                if stream.status < 200:
                    return  # an interim answer: the final one follows
            elif not name.startswith(":"):
                own[name] = f"{own[name]}, {value}" if name in own else value

    def _on_settings(self, payload: bytes) -> None:
        for at in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, at)
            if key == 0x1:
                self._encoder.header_table_size = value
            elif key == 0x3:
                self._max_streams = value
            elif key == 0x4:
                if value > _MAX_STREAM_ID:
                    raise _ProtocolError(f"an initial window of {value}")
                delta, self._initial_window = value - self._initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == 0x5:
                self._max_frame = value
        self._out.append(_frame(_SETTINGS, _ACK, 0))
        self._wake_all()
        self._wake_senders()

    def _on_window(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            self._send_window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
        self._wake_senders()

    def _wake_senders(self) -> None:
        for stream in self.streams.values():
            if stream.window is not None and not stream.window.done():
                stream.window.set_result(None)

    def _end(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        self._wake_one()
        body = b"".join(stream.chunks)
        answer = RawResponse(status=stream.status, body=body, headers=Headers(stream.headers))
        _settle(stream.answer, answer)
        if self.draining and not self.streams:
            self.close()

    def _on_reset(self, stream_id: int, code: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        self._wake_one()
        if code == _REFUSED_STREAM:
            _settle(stream.answer, _Unprocessed("the server refused the stream"))
        else:
            error = KubernetesConnectionError(f"the server reset the stream ({_error_name(code)})")
            _settle(stream.answer, error)

    def _on_goaway(self, last: int) -> None:
        """GOAWAY: the streams above its last stream id were not processed; the rest finish."""
        self.draining = True
        for stream_id in [i for i in self.streams if i > last]:
            _settle(self.streams.pop(stream_id).answer, _Unprocessed("above the server's GOAWAY"))
        self._wake_all()
        if not self.streams:
            self.close()

    def expire(self, now: float) -> list[float]:
        """Fails the streams whose deadline passed with ``TimeoutError``; the later deadlines.
        A connection that read nothing while such a stream was open takes no new stream: Go's
        health ping would find it dead, and HTTP/1.1 drops the connection of any late request."""
        later = []
        for stream in list(self.streams.values()):
            if stream.expires is None:
                continue
            if stream.expires <= now:
                if stream.heard == self._reads:
                    self.draining = True
                _settle(stream.answer, TimeoutError())
            else:
                later.append(stream.expires)
        return later

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reason = f"the connection was cut: {exc}" if exc else "the server closed the connection"
        self._fail_all(KubernetesConnectionError(reason))

    def _fail_all(self, error: Exception) -> None:
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            _settle(stream.answer, error)
        self._wake_all()

    def _wake_one(self) -> None:
        while self._slots:
            waiter = self._slots.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    def _wake_all(self) -> None:
        slots, self._slots = self._slots, []
        for waiter in slots:
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _settle(answer: asyncio.Future[RawResponse], outcome: RawResponse | Exception) -> None:
    if answer.done():
        return
    if isinstance(outcome, Exception):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)


class Http2Transport(ServerTransport):
    """The write client's ``Transport`` over one HTTP/2 connection to ``server`` (``https://...``;
    an ``http`` server is spoken to over HTTP/1.1), falling back to ``HttpTransport`` where ALPN
    does not pick ``h2``. Go: http2 ``Transport`` under ``http.Transport``.

    Its keywords (``server``, ``tls``, ``tls_server_name``, ``credentials``, ``max_connections``
    of the HTTP/1.1 fallback, ``connect_timeout``) are ``HttpTransport``'s, and so are its
    endpoint and credentials; ``tls`` gets the ALPN protocols ``h2`` and ``http/1.1``. ``aclose``
    (or ``async with``) closes every connection.
    """

    def __init__(self, **options: Unpack[TransportOptions]) -> None:
        self._http1 = HttpTransport(**options)
        self._endpoint = self._http1.endpoint
        if self._endpoint.tls is not None:
            self._endpoint.tls.set_alpn_protocols(["h2", "http/1.1"])
        self._only_http1 = self._endpoint.tls is None
        self._authority = self._endpoint.authority.encode()
        self._credentials = options.get("credentials")
        self._connection: _Connection | None = None
        self._draining: list[_Connection] = []
        self._opening: asyncio.Task[_Connection | None] | None = None
        self._targets = self._endpoint.targets()
        self._static = StaticEncoder()
        self._heads: dict[str, bytes] = {}
        self._blocks: dict[str | None, tuple[dict[str, str], bytes]] = {}
        self._deadlines = DeadlineTimer(expire=self._expire)

    @property
    def protocol(self) -> str | None:
        """``"h2"`` or ``"http/1.1"`` once a connection said which, else None."""
        if self._only_http1:
            return "http/1.1"
        return "h2" if self._connection is not None else None

    async def aclose(self) -> None:
        self._deadlines.cancel()
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
            self._opening = None
        for connection in self._live():
            connection.close()
        self._connection, self._draining = None, []
        await self._http1.aclose()

    async def send(self, request: Request) -> RawResponse:
        if self._only_http1:
            return await self._http1.send(request)
        what = f"{request.method} {request.path}"
        deadline = request.deadline
        expires = None if deadline is None else asyncio.get_running_loop().time() + deadline
        try:
            answer = await self._send(request, what, expires)
        except TimeoutError:
            raise self._endpoint.deadline_error(what, deadline) from None
        if answer is None:
            return await self._http1.send(request)
        if answer.status == 401 and self._credentials is not None:
            self._credentials.forget()
        return answer

    async def _send(self, request: Request, what: str, expires: float | None) -> RawResponse | None:
        """The answer, or None where the server does not speak HTTP/2."""
        content_type = request.content_type
        headers = ready_headers(self._credentials, content_type)
        if headers is None:
            headers = await request_headers(self._credentials, content_type)
        block = self._headers(request, headers)
        for _ in range(SEND_AGAIN + 1):
            connection = self._connection
            if connection is None or not connection.usable():
                connection = await self._usable(what, expires)
            if connection is None:
                return None
            self._deadlines.watch(expires)
            try:
                if connection.full():
                    async with asyncio.timeout_at(expires):
                        await connection.slot()
                return await connection.exchange(block, request.body, expires)
            except _Unprocessed:
                continue
            except KubernetesConnectionError as err:
                raise KubernetesConnectionError(
                    f"{what} cut short: {err}", server=self._endpoint.server, reason=str(err)
                ) from None
        raise KubernetesConnectionError(
            f"{what}: the server refused it {SEND_AGAIN + 1} times unprocessed",
            server=self._endpoint.server,
        )

    def _headers(self, request: Request, headers: dict[str, str]) -> bytes:
        """The request's header block, joined from blocks made once (a block is its fields'
        encodings one after another): the method's pseudo-header fields, the credentials' fields;
        only ``:path`` and ``content-length`` are made anew."""
        method, body = request.method, request.body
        head = self._heads.get(method) or self._head(method)
        path = self._path_field(self._targets(request.path, request.query).encode())
        credentials = self._credential_block(request.content_type, headers)
        if not body:
            return head + path + credentials
        length = b"%d" % len(body)
        return head + path + credentials + _LENGTH_NAME + bytes((len(length),)) + length

    def _head(self, method: str) -> bytes:
        fields = [(b":method", method.encode()), (b":scheme", b"https")]
        head = self._heads[method] = self._static.encode(
            [*fields, (b":authority", self._authority)]
        )
        return head

    def _path_field(self, path: bytes) -> bytes:
        if len(path) < 127:  # its length in the 7-bit prefix (RFC 7541 5.1)
            return _PATH_NAME + bytes((len(path),)) + path
        return self._static.encode([(b":path", path)])

    def _credential_block(self, content_type: str | None, headers: dict[str, str]) -> bytes:
        """The credentials' header fields, lowercase (HTTP/2 wants them so), encoded again only
        when the credentials' headers were made again."""
        held = self._blocks.get(content_type)
        if held is not None and held[0] is headers:
            return held[1]
        fields = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
        block = self._static.encode(fields)
        self._blocks[content_type] = (headers, block)
        return block

    async def _usable(self, what: str, expires: float | None) -> _Connection | None:
        """The open HTTP/2 connection, or a new one (one opening shared by all who wait), or None
        where the server picked HTTP/1.1."""
        connection = self._connection
        if connection is not None and connection.usable():
            return connection
        if connection is not None:
            self._connection = None
            if not connection.closed:
                self._draining.append(connection)  # its streams finish; its deadlines are swept
        if self._only_http1:
            return None
        opening = self._opening
        if opening is None:
            opening = self._opening = asyncio.ensure_future(self._open(what))
            opening.add_done_callback(self._opened)
        async with asyncio.timeout_at(expires):
            return await asyncio.shield(opening)

    def _opened(self, opening: asyncio.Task[_Connection | None]) -> None:
        """The opening is over: the next request that needs a connection opens one anew; its
        failure, if no request waits for it any more, is not left unread."""
        if self._opening is opening:
            self._opening = None
        if not opening.cancelled():
            opening.exception()

    def _live(self) -> list[_Connection]:
        self._draining = [c for c in self._draining if not c.closed]
        current = [] if self._connection is None else [self._connection]
        return current + self._draining

    async def _open(self, what: str) -> _Connection | None:
        connection = await self._endpoint.connect(_Connection, what)
        if connection.alpn != "h2":
            connection.close()
            self._only_http1 = True
            return None
        self._connection = connection
        return connection

    def _expire(self, now: float) -> list[float]:
        """Fails the streams whose deadline passed (``DeadlineTimer``); the later deadlines."""
        return [expires for c in self._live() for expires in c.expire(now)]
