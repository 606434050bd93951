"""HTTP/1.1 to the apiserver on asyncio's own transports: the write client's default transport.
Go: net/http ``Transport`` (its HTTP/1.1 half).

``HttpTransport`` keeps a pool of keep-alive connections, one request in flight on each (as Go's
HTTP/1.1 ``persistConn``), TLS through ``ssl`` with the context the client's configuration implies
(``tls_context``: its CA, client certificate, ``verify_ssl``), and the bearer token and default
headers of that configuration (``BearerCredentials``, shared with
``k8s_api.KubernetesAsyncioTransport``). It costs about half aiohttp's client CPU per write
(record row "``client/``: the write client's transport"). It speaks to no proxy:
``k8s_api.write_transport`` picks aiohttp's transport where one applies.

What ``k8s_http2.Http2Transport`` shares with it is here, written once: ``Endpoint`` (the server,
its TLS and the connect timeout; a connection made or ``connect_error``), ``DeadlineTimer`` (one
timer for the earliest deadline in flight), ``request_headers`` and ``ServerTransport``
(``for_api_client``, ``async with``).

A failure below HTTP raises ``KubernetesConnectionError``; every HTTP answer is returned whole.
A request written on a reused connection that the server closed before answering (the keep-alive
race) is sent again on a fresh connection only when its method is idempotent, as Go's
``persistConn.shouldRetryRequest``; any other is the caller's (``client/request_retry``).
"""

from __future__ import annotations

import abc
import asyncio
import re
import ssl
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Required, Self, TypedDict, TypeVar, Unpack
from urllib.parse import urlencode, urlsplit

from miles.utils.workers.reconcile.arguments import positive_finite
from miles.utils.workers.reconcile.k8s_config import ServiceAccountToken, tls_failure_reason
from miles.utils.workers.reconcile.k8s_errors import ConnectionFailure, KubernetesConnectionError
from miles.utils.workers.reconcile.k8s_transport import RawResponse, Request

CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 90.0
"""Seconds an idle connection is kept for reuse. Go: client-go's ``utilnet.SetTransportDefaults``
``IdleConnTimeout``."""
MAX_CONNECTIONS = 100
"""Connections open at once, as ``kubernetes_asyncio``'s ``connection_pool_maxsize``."""
MAX_HEAD_BYTES = 10 << 20
"""Go: ``net/http``'s default ``MaxResponseHeaderBytes``."""
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
"""The methods Go sends again after the keep-alive race (``Request.isReplayable``)."""
_HAS_BODY = frozenset({"POST", "PUT", "PATCH"})
_URLS_HELD = 4096


class Headers(Mapping[str, str]):
    """An answer's header fields, their names looked up in any case; a repeated field's values
    joined by ", " (Go reads them so as one). Go: ``http.Header``. Read off the wire, the fields
    are parsed only when first looked up (given ``fields``, joined then): a write client reads
    its 2xx answers' headers rarely."""

    __slots__ = ("_block", "_fields", "_given")

    def __init__(self, fields: Mapping[str, str] | None = None, *, block: str = "") -> None:
        self._block = block
        self._given = fields
        self._fields: dict[str, str] | None = None

    def _parsed(self) -> dict[str, str]:
        if self._fields is None:
            given = self._given
            fields = _FIELD.findall(self._block) if given is None else given.items()
            self._fields = _joined(fields)
        return self._fields

    def __getitem__(self, name: str) -> str:
        return self._parsed()[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())

    def __repr__(self) -> str:
        return f"Headers({self._parsed()!r})"


def _joined(fields: Iterable[tuple[str, str]]) -> dict[str, str]:
    joined: dict[str, str] = {}
    for name, value in fields:
        key = name.lower()
        joined[key] = f"{joined[key]}, {value}" if key in joined else value
    return joined


class BearerCredentials:
    """The headers every request carries for a ``kubernetes_asyncio`` ``ApiClient``: its default
    headers and its configuration's bearer token, built again only when the credential changed.
    The configuration's refresh hook (a ``ServiceAccountToken``) runs before every request, as
    ``ApiClient.update_params_for_auth`` runs it, and may set a new token; after a 401 a
    ``ServiceAccountToken`` reads its file again (``forget``)."""

    def __init__(self, *, api_client: Any) -> None:
        self._api_client = api_client
        self._credential: tuple[object, ...] | None = None
        self._headers: dict[str | None, dict[str, str]] = {}

    async def headers(self, content_type: str | None) -> dict[str, str]:
        configuration = self._api_client.configuration
        hook = configuration.refresh_api_key_hook
        if hook is not None:
            refreshed = hook(configuration)
            if asyncio.iscoroutine(refreshed):
                await refreshed
        return self._made(content_type)

    def ready(self, content_type: str | None) -> dict[str, str] | None:
        """``headers`` where no refresh hook must run first (a kubeconfig's token or client
        certificate), without a coroutine; None where one must (await ``headers``)."""
        if self._api_client.configuration.refresh_api_key_hook is not None:
            return None
        return self._made(content_type)

    def _made(self, content_type: str | None) -> dict[str, str]:
        configuration = self._api_client.configuration
        token = configuration.api_key.get("BearerToken")
        prefix = configuration.api_key_prefix.get("BearerToken")
        credential = (token, prefix, *self._api_client.default_headers.items())
        if credential != self._credential:
            self._credential = credential
            self._headers = {}
        headers = self._headers.get(content_type)
        if headers is None:
            headers = {**self._api_client.default_headers, "Accept": "application/json"}
            if content_type is not None:
                headers["Content-Type"] = content_type
            if token:  # as Configuration.get_api_key_with_prefix and auth_settings make it
                headers["authorization"] = f"{prefix} {token}" if prefix else token
            self._headers[content_type] = headers
        return headers

    def forget(self) -> None:
        hook = getattr(self._api_client.configuration, "refresh_api_key_hook", None)
        if isinstance(hook, ServiceAccountToken):
            hook.forget()


def tls_context(configuration: Any) -> ssl.SSLContext:
    """The TLS context a ``kubernetes_asyncio`` ``Configuration`` implies, as its
    ``RESTClientObject`` builds it (CA file, client certificate, ``verify_ssl``,
    ``disable_strict_ssl_verification``), offering HTTP/1.1 alone by ALPN."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if getattr(configuration, "disable_strict_ssl_verification", False):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass(frozen=True, slots=True)
class Answer:
    """One response as read off a connection: status, header fields, body, and whether the
    connection may carry another request."""

    status: int
    headers: Headers
    body: bytes
    keep_alive: bool


class MalformedResponse(Exception):
    """The bytes read are no HTTP/1.1 response; the message says what is wrong."""


class _Lost(Exception):
    """The connection closed before the answer ended; ``answered``: some of it had come."""

    def __init__(self, cause: BaseException | None, *, answered: bool) -> None:
        super().__init__(str(cause) if cause else "the server closed the connection")
        self.answered = answered


_UNTIL_CLOSE = -1
_CHUNKED = -2


class ResponseReader:
    """Reads one HTTP/1.1 response at a time from the bytes ``feed`` is given: the status line and
    header fields, interim 1xx answers skipped, then a body framed by ``Content-Length``, chunked
    transfer coding or the connection's close; none after ``HEAD``, 204 or 304. Go:
    ``http.ReadResponse``."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._head_only = False
        self._status = 0
        self._headers: Headers | None = None
        self._length = 0
        self._keep_alive = True
        self._chunks: list[bytes] = []
        self._trailers = False

    def expect(self, *, head_only: bool) -> None:
        """A new request was sent; its answer is read next."""
        self._head_only = head_only
        self._headers = None
        self._chunks = []
        self._trailers = False

    @property
    def pending(self) -> bool:
        """Bytes are held that no answer took."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> Answer | None:
        """The answer, once ``data`` completed it; raises ``MalformedResponse``."""
        self._buffer += data
        if self._headers is None and not self._read_head():
            return None
        if self._length >= 0:
            return self._sized()
        return self._chunked() if self._length == _CHUNKED else None

    def at_close(self) -> Answer | None:
        """The answer a body read until the connection's close makes, if one was under way."""
        if self._headers is None or self._length != _UNTIL_CLOSE:
            return None
        body, self._buffer = bytes(self._buffer), bytearray()
        return Answer(self._status, self._headers, body, keep_alive=False)

    def _read_head(self) -> bool:
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise MalformedResponse(f"a response head over {MAX_HEAD_BYTES} bytes")
                return False
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            status, headers, framing, keep_alive = parse_head(head)
            if 100 <= status <= 199 and status != 101:
                continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self._status, self._headers, self._keep_alive = status, headers, keep_alive
            self._length = self._framing(status, framing)
            return True

    def _framing(self, status: int, fields: dict[str, str]) -> int:
        if self._head_only or status in (101, 204, 304):
            return 0
        coding = fields.get("transfer-encoding")
        if coding is not None:
            if coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
                self._keep_alive = False
                return _UNTIL_CLOSE
            return _CHUNKED
        length = fields.get("content-length")
        if length is None:
            self._keep_alive = False
            return _UNTIL_CLOSE
        values = {v.strip() for v in length.split(",")}
        value = values.pop()
        if values or not value.isdigit():
            raise MalformedResponse(f"Content-Length {length!r}")
        return int(value)

    def _sized(self) -> Answer | None:
        if len(self._buffer) < self._length:
            return None
        body = bytes(self._buffer[: self._length])
        del self._buffer[: self._length]
        return self._answer(body)

    def _chunked(self) -> Answer | None:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n")
            if end < 0:
                return None
            if self._trailers:
                del buffer[: end + 2]
                if end == 0:
                    return self._answer(b"".join(self._chunks))
                continue
            size = _chunk_size(bytes(buffer[:end]))
            if size == 0:
                del buffer[: end + 2]
                self._trailers = True
                continue
            stop = end + 2 + size
            if len(buffer) < stop + 2:
                return None
            if buffer[stop : stop + 2] != b"\r\n":
                raise MalformedResponse("chunk data not followed by CRLF")
            self._chunks.append(bytes(buffer[end + 2 : stop]))
            del buffer[: stop + 2]

    def _answer(self, body: bytes) -> Answer:
        assert self._headers is not None
        headers, self._headers = self._headers, None
        return Answer(self._status, headers, body, self._keep_alive)


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_HEAD = re.compile(_STATUS_LINE.pattern + rf"((?:\r\n{_TOKEN}:[^\r\n]*)*)")
_FIELD = re.compile(r"\r\n([^:]+):[ \t]*([^\r\n]*?)[ \t]*(?=\r\n|$)")
_FRAMING = re.compile(
    r"\r\n(content-length|transfer-encoding|connection):[ \t]*([^\r\n]*?)[ \t]*(?=\r\n|$)"
)


def parse_head(head: bytes) -> tuple[int, Headers, dict[str, str], bool]:
    """A response head's status, its header fields, the fields that frame its body
    (``content-length``, ``transfer-encoding``, ``connection``, lowercased) and whether the
    connection stays open after it; raises ``MalformedResponse``. One regular expression checks
    the whole head, so the interpreter touches only the three framing fields per answer."""
    text = head.decode("latin-1")
    match = _HEAD.fullmatch(text)
    if match is None:
        raise MalformedResponse(_malformed_line(text))
    minor, code, block = match.groups()
    framing = _joined(_FRAMING.findall(block.lower()))
    connection = framing.get("connection", "")
    keep_alive = "close" not in connection if minor == "1" else "keep-alive" in connection
    return int(code), Headers(block=block), framing, keep_alive


def _malformed_line(text: str) -> str:
    lines = text.split("\r\n")
    if _STATUS_LINE.fullmatch(lines[0]) is None:
        return f"status line {lines[0][:80]!r}"
    bad = next(line for line in lines[1:] if re.fullmatch(rf"{_TOKEN}:[^\r\n]*", line) is None)
    return f"header line {bad[:80]!r}"


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].strip()
    if not size or size.strip(b"0123456789abcdefABCDEF"):
        raise MalformedResponse(f"chunk size line {line[:40]!r}")
    return int(size, 16)


class _Connection(asyncio.Protocol):
    """One connection to the server; its answers read by a ``ResponseReader``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.expires: float | None = None
        self._reader = ResponseReader()
        self._waiter: asyncio.Future[Answer] | None = None
        self._answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def send(
        self, message: bytes, *, head_only: bool, expires: float | None
    ) -> asyncio.Future[Answer]:
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self._waiter, self._answered, self.expires = waiter, False, expires
        self._reader.expect(head_only=head_only)
        self.transport.write(message)
        return waiter

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None:
            self.close()  # bytes no request asked for (Go: "unsolicited response")
            return
        self._answered = True
        try:
            answer = self._reader.feed(data)
        except MalformedResponse as err:
            self._settle(err)
            self.close()
            return
        if answer is not None:
            self._settle(answer)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None:
            answer = self._reader.at_close()
            self._settle(answer or _Lost(exc, answered=self._answered))

    def expire(self) -> None:
        """The request's deadline passed: it fails with ``TimeoutError`` and the connection, in
        an unknown state, closes."""
        self._settle(TimeoutError())
        self.close()

    def _settle(self, outcome: Answer | Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.expires = None
        if waiter is None or waiter.done():
            return
        if isinstance(outcome, Exception):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)

    def keeps(self, answer: Answer) -> bool:
        return answer.keep_alive and not self._reader.pending and self.usable()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


async def request_headers(
    credentials: BearerCredentials | None, content_type: str | None
) -> dict[str, str]:
    """A request's header fields after its target: the credentials' (the same dict while they
    did not change), or without credentials ``Accept`` and ``Content-Type`` alone."""
    headers = ready_headers(credentials, content_type)
    if headers is None:
        assert credentials is not None
        return await credentials.headers(content_type)
    return headers


def ready_headers(
    credentials: BearerCredentials | None, content_type: str | None
) -> dict[str, str] | None:
    """``request_headers`` where they are ready without awaiting (``BearerCredentials.ready``),
    else None: a write's transport awaits no coroutine for them then. Credentials of another
    class (anything with ``headers`` and ``forget``) are always awaited."""
    if isinstance(credentials, BearerCredentials):
        return credentials.ready(content_type)
    if credentials is not None:
        return None
    headers = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


_Protocol = TypeVar("_Protocol", bound=asyncio.Protocol)


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """The server a transport connects to, read from its URL (``https://host:port`` or
    ``http://...``, a path prefix kept) with the TLS context and server name for an ``https``
    one, and the time a connection's TCP and TLS handshake may take. Go: ``http.Transport``'s
    ``DialContext`` and ``TLSClientConfig``."""

    host: str
    port: int
    authority: str
    prefix: str
    tls: ssl.SSLContext | None
    server_name: str | None
    connect_timeout: float

    @classmethod
    def of(
        cls,
        server: str,
        *,
        tls: ssl.SSLContext | None,
        tls_server_name: str | None,
        connect_timeout: float,
    ) -> Endpoint:
        url = urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"server {server!r}: an http or https URL with a host is needed")
        secure = url.scheme == "https"
        return cls(
            host=url.hostname,
            port=url.port or (443 if secure else 80),
            authority=url.netloc,
            prefix=url.path.rstrip("/"),
            tls=(tls or ssl.create_default_context()) if secure else None,
            server_name=(tls_server_name or url.hostname) if secure else None,
            connect_timeout=positive_finite("connect_timeout", connect_timeout),
        )

    @property
    def server(self) -> str:
        """``host:port``, as errors name the server."""
        return f"{self.host}:{self.port}"

    def targets(self) -> Targets:
        """Requests' paths and queries as sent, under the URL's path prefix."""
        return Targets(prefix=self.prefix)

    async def connect(self, factory: Callable[[], _Protocol], what: str) -> _Protocol:
        """A new connection made by ``factory``, within ``connect_timeout``; raises
        ``KubernetesConnectionError`` (``connect_error``) for ``what`` where none is made."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    factory, self.host, self.port, ssl=self.tls, server_hostname=self.server_name
                )
        except TimeoutError:
            raise connect_error(what, self.server, self.connect_timeout, None) from None
        except OSError as err:
            raise connect_error(what, self.server, self.connect_timeout, err) from None
        return connection

    def deadline_error(self, what: str, deadline: float | None) -> KubernetesConnectionError:
        """``what`` ended by its request's ``deadline``."""
        return KubernetesConnectionError(
            f"{what} ended by its client deadline ({deadline:g} s)",
            kind=ConnectionFailure.TIMEOUT,
            server=self.server,
        )


class Targets:
    """A request's path and query as sent, under the URL's path prefix, each query's encoding
    made once: a write client sends the same few queries (``fieldManager``, ``force``) on ever
    new paths (a create-delete deletes a new name each time, so holding whole targets missed); at
    most ``_URLS_HELD`` queries held."""

    def __init__(self, *, prefix: str) -> None:
        self._prefix = prefix
        self._queries: dict[tuple[tuple[str, str], ...], str] = {}

    def __call__(self, path: str, query: Sequence[tuple[str, str]]) -> str:
        key = query if isinstance(query, tuple) else tuple(query)
        suffix = self._queries.get(key)
        if suffix is None:
            if len(self._queries) >= _URLS_HELD:
                self._queries.clear()
            suffix = self._queries[key] = f"?{urlencode(key)}" if key else ""
        return self._prefix + path + suffix


class DeadlineTimer:
    """The deadlines of requests in flight checked by one timer, set for the earliest, not one
    per request: asyncio's timer heap compares its handles in Python, and a timer per request was
    a tenth of the transport's CPU per write (cProfile). When it fires, ``expire(now)`` fails
    what is due and returns the deadlines still ahead; the timer is set for their earliest."""

    def __init__(self, *, expire: Callable[[float], Iterable[float]]) -> None:
        self._expire = expire
        self._timer: asyncio.TimerHandle | None = None
        self._at: float | None = None

    def watch(self, expires: float | None) -> None:
        """A request in flight until ``expires`` (a loop time; None: no deadline)."""
        if expires is None or (self._at is not None and self._at <= expires):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._at = expires
        self._timer = asyncio.get_running_loop().call_at(expires, self._fire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._at = None

    def _fire(self) -> None:
        self._timer = self._at = None
        later = list(self._expire(asyncio.get_running_loop().time()))
        if later:
            self.watch(min(later))


class TransportOptions(TypedDict, total=False):
    """``HttpTransport``'s keywords, which ``k8s_http2.Http2Transport`` takes too."""

    server: Required[str]
    tls: ssl.SSLContext | None
    tls_server_name: str | None
    credentials: BearerCredentials | None
    max_connections: int
    connect_timeout: float


class ServerTransport(abc.ABC):
    """What the write transports are alike as objects: made for a ``kubernetes_asyncio``
    ``ApiClient`` by ``for_api_client`` (its constructor takes ``TransportOptions``) and closed
    by ``aclose`` or ``async with``."""

    @abc.abstractmethod
    def __init__(self, **options: Unpack[TransportOptions]) -> None:
        """A transport to ``options["server"]``."""

    @classmethod
    def for_api_client(cls, api_client: Any, *, connect_timeout: float = CONNECT_TIMEOUT) -> Self:
        """To the server of a ``kubernetes_asyncio`` ``ApiClient``, with its configuration's TLS,
        token and pool size and its default headers. Its proxy, if any, is not used."""
        configuration = api_client.configuration
        secure = urlsplit(configuration.host).scheme == "https"
        options: TransportOptions = {
            "server": configuration.host,
            "tls": tls_context(configuration) if secure else None,
            "tls_server_name": configuration.tls_server_name,
            "credentials": BearerCredentials(api_client=api_client),
            "max_connections": configuration.connection_pool_maxsize or MAX_CONNECTIONS,
            "connect_timeout": connect_timeout,
        }
        return cls(**options)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Closes every connection."""


class HttpTransport(ServerTransport):
    """The write client's ``Transport`` over HTTP/1.1 keep-alive connections to ``server``
    (``https://host:port`` or ``http://...``, a path prefix kept). Go: ``http.Transport``.

    ``tls`` is the context for an ``https`` server (``tls_context``), ``tls_server_name`` the name
    its certificate is checked against where it is not the URL's host; ``credentials`` give each
    request's headers. At most ``max_connections`` are open; a request beyond waits for one.
    ``connect_timeout`` bounds each connection's TCP and TLS handshake, a request's ``deadline``
    all of it. ``aclose`` (or ``async with``) closes every connection.
    """

    def __init__(
        self,
        *,
        server: str,
        tls: ssl.SSLContext | None = None,
        tls_server_name: str | None = None,
        credentials: BearerCredentials | None = None,
        max_connections: int = MAX_CONNECTIONS,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self._endpoint = Endpoint.of(
            server, tls=tls, tls_server_name=tls_server_name, connect_timeout=connect_timeout
        )
        self._host_line = f"Host: {self._endpoint.authority}\r\n".encode()
        self._credentials = credentials
        self._max = max_connections
        self._idle: deque[_Connection] = deque()
        self._busy: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._targets = self._endpoint.targets()
        self._deadlines = DeadlineTimer(expire=self._expire)
        self._blocks: dict[str | None, tuple[dict[str, str], bytes]] = {}

    @property
    def endpoint(self) -> Endpoint:
        """The server, its TLS and the connect timeout, as the constructor read them."""
        return self._endpoint

    async def aclose(self) -> None:
        self._deadlines.cancel()
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()

    async def send(self, request: Request) -> RawResponse:
        method, deadline = request.method, request.deadline
        message = await self._message(request)
        what = f"{method} {request.path}"
        expires = None if deadline is None else asyncio.get_running_loop().time() + deadline
        try:
            answer = await self._exchange(what, method, message, expires)
        except TimeoutError:
            raise self._endpoint.deadline_error(what, deadline) from None
        if answer.status == 401 and self._credentials is not None:
            self._credentials.forget()
        return RawResponse(status=answer.status, body=answer.body, headers=answer.headers)

    async def _message(self, request: Request) -> bytes:
        method, body = request.method, request.body
        headers = ready_headers(self._credentials, request.content_type)
        if headers is None:
            headers = await request_headers(self._credentials, request.content_type)
        parts = [
            self._target(method, request.path, request.query),
            self._block(request.content_type, headers),
        ]
        if body is not None or method in _HAS_BODY:
            parts.append(b"Content-Length: %d\r\n\r\n" % len(body or b""))
            if body:
                parts.append(body)
        else:
            parts.append(b"\r\n")
        return b"".join(parts)

    def _target(self, method: str, path: str, query: Sequence[tuple[str, str]]) -> bytes:
        """The request line and Host."""
        return f"{method} {self._targets(path, query)} HTTP/1.1\r\n".encode() + self._host_line

    def _block(self, content_type: str | None, headers: dict[str, str]) -> bytes:
        """The header lines after Host, encoded again only when the credentials' headers did."""
        held = self._blocks.get(content_type)
        if held is not None and held[0] is headers:
            return held[1]
        block = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()
        self._blocks[content_type] = (headers, block)
        return block

    async def _exchange(
        self, what: str, method: str, message: bytes, expires: float | None
    ) -> Answer:
        connection = self._idle_connection() or await self._connection(what, expires)
        while True:
            self._deadlines.watch(expires)
            try:
                answer = await connection.send(message, head_only=method == "HEAD", expires=expires)
            except _Lost as lost:
                self._drop(connection)
                if connection.reused and not lost.answered and method in IDEMPOTENT_METHODS:
                    connection = await self._connection(what, expires)
                    continue
                raise KubernetesConnectionError(
                    f"{what} cut short: {lost}", server=self._endpoint.server, reason=str(lost)
                ) from None
            except MalformedResponse as err:
                self._drop(connection)
                raise KubernetesConnectionError(
                    f"{what} failed: the HTTP response is malformed ({err})",
                    server=self._endpoint.server,
                ) from None
            except BaseException:
                self._drop(connection)  # a deadline or a cancel mid-exchange: its state is unknown
                raise
            self._release(connection, connection.keeps(answer))
            return answer

    def _idle_connection(self) -> _Connection | None:
        """The connection used last that is still open and not idle too long (Go keeps its idle
        connections most recent first too)."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable() and now - connection.idle_since < IDLE_TIMEOUT:
                connection.reused = True
                self._busy.add(connection)
                return connection
            connection.close()
        return None

    async def _connection(self, what: str, expires: float | None) -> _Connection:
        """A new connection, once the limit allows one, within the request's deadline."""
        async with asyncio.timeout_at(expires):
            while len(self._busy) + self._opening >= self._max:
                await self._wait_for_slot(asyncio.get_running_loop())
                idle = self._idle_connection()
                if idle is not None:
                    return idle
            return await self._open(what)

    def _expire(self, now: float) -> list[float]:
        """Fails the requests whose deadline passed (``DeadlineTimer``); the later deadlines."""
        later = []
        for connection in list(self._busy):
            expires = connection.expires
            if expires is None:
                continue
            if expires <= now:
                connection.expire()
            else:
                later.append(expires)
        return later

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> None:
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._wake()  # the slot it was given passes to the next
            else:
                self._waiters.remove(waiter)
            raise

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _open(self, what: str) -> _Connection:
        self._opening += 1
        try:
            connection = await self._endpoint.connect(_Connection, what)
        finally:
            self._opening -= 1
            self._wake()
        self._busy.add(connection)
        return connection

    def _release(self, connection: _Connection, keep: bool) -> None:
        self._busy.discard(connection)
        if keep:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.close()
        self._wake()

    def _drop(self, connection: _Connection) -> None:
        self._release(connection, keep=False)


def connect_error(
    what: str, server: str, connect_timeout: float, err: OSError | None
) -> KubernetesConnectionError:
    """Why a connection to ``server`` for ``what`` was not made (``err`` None: not within
    ``connect_timeout``), as ``KubernetesConnectionError`` with its kind."""
    if err is None:
        kind, reason = ConnectionFailure.TIMEOUT, f"not made within {connect_timeout:g} s"
    elif isinstance(err, ssl.SSLCertVerificationError):
        kind, reason = ConnectionFailure.TLS_VERIFICATION, tls_failure_reason(err)
    elif isinstance(err, ssl.SSLError):
        kind, reason = ConnectionFailure.TLS_HANDSHAKE, tls_failure_reason(err)
    elif isinstance(err, ConnectionRefusedError):
        kind, reason = ConnectionFailure.REFUSED, err.strerror or str(err)
    else:
        kind, reason = ConnectionFailure.UNREACHABLE, err.strerror or str(err)
    state = "refused" if kind is ConnectionFailure.REFUSED else "failed"
    return KubernetesConnectionError(
        f"{what}: connection to {server} {state}: {reason}",
        kind=kind,
        server=server,
        reason=reason,
    )
