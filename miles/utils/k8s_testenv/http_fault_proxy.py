"""A loopback HTTP/1.1 proxy in front of a kube-apiserver that answers, corrupts or swallows
chosen requests: the apiserver-side faults a reflector must survive.

Go counterpart: none in client-go; it plays the HTTP faults toxiproxy cannot (a chosen status to a
LIST or a WATCH, a broken chunk mid-frame, a connection that goes dead without a FIN).

TLS is terminated here, with a certificate for 127.0.0.1 from a throwaway CA of the proxy's own
(`certs.generate_serving_pair`), and re-encrypted upstream, verifying the apiserver against the CA
of the kubeconfig being proxied. `write_kubeconfig()` writes the copy clients use: the same user,
the proxy as the server, the proxy's CA. Owning the CA keeps the proxy independent of the plane's
private keys, so it also fronts a reused cluster. ALPN offers `http/1.1` only, so a Go client (the
oracle) speaks HTTP/1.1 here and its HTTP/2 health check does not apply behind this proxy.

Faults are `add(match, action, count=, seconds=)`: the first live fault whose `Match` fits a
request decides it; `Respond` answers new requests itself, `BlackHole` swallows new requests and
the rest of open responses (the connection is never closed), `CutAfterForward` sends a request on
to the apiserver and resets the client before any byte of the answer, `CorruptChunk` breaks the
next chunk of a chunked response (new or open) with a bad chunk-size line or a chunk not ended by
CRLF, and then holds the connection open; `RewriteFrame` forwards the next pod frame of a watch
(ADDED, MODIFIED or DELETED) rewritten (`without_name` and `cut_in_name` are two rewrites),
`Delay` forwards each chunk of a streaming response a fixed time after it arrived (a watch whose
frames reach the client late; `delay_line` is how). A `Match` can pick one client by its
User-Agent, and `RewriteFrame` and `CorruptChunk` one pod's frames.
`freeze()` stops the responses streaming now (a watch) where they are, connections kept open,
while new requests go through: a NAT entry expired under a watch.
Every request is recorded in `requests` (bounded), with what the proxy did to it.

Like `TcpProxy`, it runs its own event loop on a daemon thread, so a busy test loop does not stall
another client's traffic; `async with` starts and stops it, and every method may be called from any
thread.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import math
import re
import ssl
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from miles.utils.k8s_testenv.certs import generate_serving_pair
from miles.utils.k8s_testenv.errors import K8sTestEnvError
from miles.utils.k8s_testenv.loop_thread import LoopThread
from miles.utils.k8s_testenv.ports import LOOPBACK
from miles.utils.k8s_testenv.tcp_proxy import reset_transport

_HEAD_LIMIT = 1024 * 1024
_PIECE = 64 * 1024
_HISTORY = 4096
_BAD_CHUNK_SIZE = b"zz-not-a-chunk-size\r\n"
_BAD_CHUNK_TERMINATOR = b"{}-chunk data longer than its size\r\n"
_REASONS = {
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_PHRASES = {
    200: "OK",
    410: "Gone",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class HttpProxyError(K8sTestEnvError):
    """The proxy cannot start (an unreadable kubeconfig) or is not running."""


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    headers: Mapping[str, str]

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.target).query).items()}

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "").lower() in ("true", "1")


@dataclass(frozen=True)
class Match:
    """Which requests a fault applies to: the method, watch or not (None: both), a regular
    expression searched in the path, query parameters that must be present (value None) or
    equal to a value, and how the User-Agent begins (which client: Go's names the binary,
    `kubernetes_asyncio`'s is `OpenAPI-Generator/`)."""

    method: str | None = "GET"
    watch: bool | None = None
    path: str = ""
    query: Mapping[str, str | None] = field(default_factory=dict)
    user_agent: str = ""

    def __call__(self, head: RequestHead) -> bool:
        if self.method is not None and head.method != self.method:
            return False
        if not head.headers.get("user-agent", "").startswith(self.user_agent):
            return False
        if self.watch is not None and head.is_watch != self.watch:
            return False
        if self.path and re.search(self.path, head.path) is None:
            return False
        query = head.query
        return all(
            name in query and (value is None or query[name] == value)
            for name, value in self.query.items()
        )


PODS = r"/api/v1/namespaces/[^/]+/pods$"
WATCH = Match(watch=True, path=PODS)
LIST = Match(watch=False, path=PODS)
PAGED_LIST_CONTINUATION = Match(watch=False, path=PODS, query={"continue": None})


@dataclass(frozen=True)
class Respond:
    """Answer the request with `status` and a `metav1.Status` body; `headers` are added (say
    `Retry-After`). With `in_band=True` a watch gets HTTP 200 and one `ERROR` event carrying the
    Status instead, then the end of the stream, as a real apiserver reports an expired cursor."""

    status: int
    message: str = "injected by the HTTP fault proxy"
    reason: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    in_band: bool = False

    def status_object(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason or _REASONS.get(self.status, "InternalError"),
            "code": self.status,
        }

    def describe(self) -> str:
        return f"answered {self.status}" + (" in-band" if self.in_band else "")


@dataclass(frozen=True)
class BlackHole:
    """Forward nothing more on the connection, in either direction, and never close it."""

    def describe(self) -> str:
        return "black-holed"


@dataclass(frozen=True)
class CutAfterForward:
    """Forward the request, wait for the apiserver's answer to begin, then reset the client's
    connection without a byte of it: the write was made and the client cannot know."""

    def describe(self) -> str:
        return "forwarded, then cut before the answer"


@dataclass(frozen=True)
class CorruptChunk:
    """Forward half of the next chunk of the response as a valid chunk (so the client holds half
    a frame), then break the chunked framing; then forward nothing and keep it open.

    `framing="size"` breaks it with a chunk-size line that is not hex; `"terminator"` with a chunk
    whose data is not followed by CRLF (its size announces fewer bytes than follow). With `pod`,
    the next chunk that is a frame about that pod (its `metadata.name`)."""

    framing: Literal["size", "terminator"] = "size"
    pod: str | None = None

    def describe(self) -> str:
        return "chunk corrupted" if self.framing == "size" else "chunk terminator corrupted"

    def breakage(self, data: bytes) -> bytes:
        """The bytes sent in place of a chunk carrying `data`."""
        half = data[: max(1, len(data) // 2)]
        head = b"%x\r\n%s\r\n" % (len(half), half)
        if self.framing == "size":
            return head + _BAD_CHUNK_SIZE
        return head + b"2\r\n" + _BAD_CHUNK_TERMINATOR


@dataclass(frozen=True)
class RewriteFrame:
    """Forward the next chunk of a watch response that opens a pod frame (ADDED, MODIFIED or
    DELETED) as `rewrite` returns it (the chunk's bytes in, what to send out: a frame without a
    name, a cut line, bytes that are not a frame), then go on forwarding. `what` names the
    rewrite in the request record; with `pod`, only a frame about that pod is taken."""

    rewrite: Callable[[bytes], bytes]
    what: str = "rewritten"
    pod: str | None = None

    def describe(self) -> str:
        return f"frame {self.what}"


@dataclass(frozen=True)
class Delay:
    """Forward each chunk of a streaming response (a watch's frames) `seconds` after the proxy
    read it from the apiserver, in order: a client whose cache lags the apiserver by `seconds`.
    The response is read on meanwhile, so the lag stays `seconds` over a burst instead of adding
    up. A response is read through the delay line if the fault is live when it begins; each
    chunk is held if the fault is still live when it arrives (`count` counts chunks)."""

    seconds: float

    def describe(self) -> str:
        return f"delayed {self.seconds:g}s"


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a chunked response as the apiserver sent it; the last has no data and may
    carry trailers."""

    size_line: bytes
    data: bytes = b""
    trailers: bytes = b""

    @property
    def last(self) -> bool:
        return not self.data

    def encoded(self) -> bytes:
        if self.last:
            return self.size_line + b"\r\n" + self.trailers + b"\r\n"
        return self.size_line + b"\r\n" + self.data + b"\r\n"


async def delay_line(
    chunks: AsyncIterator[Chunk],
    hold: Callable[[Chunk], float],
    *,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncGenerator[Chunk, None]:
    """`chunks`, read ahead as they arrive, each yielded `hold(chunk)` seconds after its arrival
    and never before the one ahead of it. An error reading them is raised after the chunks that
    arrived before it. `now` and `sleep` are a clock's (a test's fake one)."""
    line: asyncio.Queue[tuple[float, Chunk] | Exception | None] = asyncio.Queue()

    async def read() -> None:
        try:
            async for chunk in chunks:
                line.put_nowait((now() + hold(chunk), chunk))
        except Exception as err:
            line.put_nowait(err)
        else:
            line.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        due = -math.inf
        while (arrived := await line.get()) is not None:
            if isinstance(arrived, Exception):
                raise arrived
            due = max(due, arrived[0])
            if (wait := due - now()) > 0:
                await sleep(wait)
            yield arrived[1]
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


_POD_FRAME_OPENINGS = tuple(b'{"type":"%s"' % kind for kind in (b"ADDED", b"MODIFIED", b"DELETED"))
_NAME_OPENING = b'"name":"'


def without_name(chunk: bytes) -> bytes:
    """A rewrite: the frame with its object's `metadata.name` taken out, otherwise whole."""
    frame = json.loads(chunk)
    del frame["object"]["metadata"]["name"]
    return json.dumps(frame, separators=(",", ":")).encode() + b"\n"


def cut_in_name(chunk: bytes) -> bytes:
    """A rewrite: the frame cut one byte into its object's name (the first `"name"` of a pod
    frame), then a newline. Cut inside a string, the line is unreadable to any JSON reader at
    once; cut between two tokens, Go's `json.Decoder` would read on into the next frame and fail
    only when that one came."""
    start = chunk.index(_NAME_OPENING) + len(_NAME_OPENING)
    return chunk[: start + 1] + b"\n"


def frame_about(chunk: bytes, pod: str) -> bool:
    """Whether a chunk is one watch frame whose object is named `pod`."""
    try:
        return bool(json.loads(chunk)["object"]["metadata"]["name"] == pod)
    except (ValueError, KeyError, TypeError):
        return False


Action = Respond | BlackHole | CorruptChunk | RewriteFrame | CutAfterForward | Delay


@dataclass(eq=False)
class Fault:
    """One fault: `applied` counts the requests or streams it changed so far."""

    match: Match
    action: Action
    count: int | None
    until: float | None
    applied: int = 0
    removed: bool = False

    def live(self, now: float) -> bool:
        if self.removed or (self.count is not None and self.applied >= self.count):
            return False
        return self.until is None or now < self.until


@dataclass(frozen=True)
class Seen:
    """A request the proxy received: when, what, and what it did to it."""

    at: float
    method: str
    target: str
    is_watch: bool
    user_agent: str
    outcome: str


@dataclass(frozen=True)
class _Upstream:
    host: str
    port: int
    ssl: ssl.SSLContext | None
    server_hostname: str | None


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    holding: bool = False
    released: asyncio.Event = field(default_factory=asyncio.Event)
    streaming: RequestHead | None = None
    frozen: bool = False
    last_sent: float = 0.0

    def send(self, data: bytes) -> None:
        self.client.write(data)
        self.last_sent = time.monotonic()

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream[1].transport.abort()
            self.upstream = None

    def reset(self) -> None:
        """Closes the client side with a reset, not an orderly close, and releases a hold."""
        self.drop_upstream()
        reset_transport(self.client)
        self.released.set()


class _Hold(Exception):
    """The connection is now a black hole: stop serving it, keep it open."""


class _Close(Exception):
    """The exchange cannot go on (the upstream broke mid-response, or a side asked to close)."""


class HttpFaultProxy:
    """`async with HttpFaultProxy(kubeconfig=...) as proxy:` fronts that kubeconfig's server."""

    def __init__(
        self, *, kubeconfig: Path, name: str = "http-fault-proxy", history: int = _HISTORY
    ) -> None:
        self.name = name
        self._source = _read_json(kubeconfig)
        self._upstream = _upstream_of(self._source, kubeconfig)
        self._thread = LoopThread(name=name, cleanup=self._close_everything)
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._pki: tempfile.TemporaryDirectory[str] | None = None
        self._ca_cert: Path | None = None
        self._port: int | None = None
        self.requests: collections.deque[Seen] = collections.deque(maxlen=history)

    @property
    def port(self) -> int:
        if self._port is None:
            raise HttpProxyError(f"{self.name} is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    async def __aenter__(self) -> HttpFaultProxy:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)

    def start(self) -> None:
        self._pki = tempfile.TemporaryDirectory(prefix="miles-http-proxy-")
        try:
            pair = generate_serving_pair(Path(self._pki.name))
            self._ca_cert = pair.ca_cert
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(pair.serving_cert, pair.serving_key)
            context.set_alpn_protocols(["http/1.1"])
            self._port = self._thread.start(self._listen(context))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Resets every connection, closes the listener, joins the thread, removes the CA."""
        self._thread.stop()
        if self._pki is not None:
            self._pki.cleanup()
            self._pki = None

    def failure(self) -> str | None:
        """Why the proxy is not forwarding any more, or None while it runs (or after `stop()`)."""
        return self._thread.failure()

    @property
    def open_connections(self) -> int:
        """Client connections open now, black-holed ones included."""
        return len(self._connections)

    def write_kubeconfig(self, path: Path) -> Path:
        """A copy of the proxied kubeconfig whose every server is this proxy, trusting its CA."""
        if self._ca_cert is None:
            raise HttpProxyError(f"{self.name} is not started")
        config = json.loads(json.dumps(self._source))
        ca_data = base64.b64encode(self._ca_cert.read_bytes()).decode()
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.url
            cluster["cluster"].pop("certificate-authority", None)
            cluster["cluster"]["certificate-authority-data"] = ca_data
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)
        return path

    # --- faults ------------------------------------------------------------------------------

    def add(
        self,
        match: Match,
        action: Action,
        *,
        count: int | None = None,
        seconds: float | None = None,
    ) -> Fault:
        """Applies `action` to the requests `match` fits, `count` times or for `seconds`, or until
        `remove()`; later faults come after earlier ones."""
        until = None if seconds is None else time.monotonic() + seconds
        fault = Fault(match=match, action=action, count=count, until=until)
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        with self._lock:
            fault.removed = True
            if fault in self._faults:
                self._faults.remove(fault)

    def clear(self) -> None:
        with self._lock:
            for fault in self._faults:
                fault.removed = True
            self._faults.clear()

    async def reset_held(self) -> int:
        """Resets every black-holed connection (the client gets a reset); returns how many."""
        return await asyncio.wrap_future(self._thread.submit(self._reset(all_of_them=False)))

    async def freeze(self, match: Match = WATCH) -> list[float]:
        """Freezes every response `match` fits that is streaming now: nothing more of it reaches
        the client, whose connection stays open and silent, while new requests are served as
        before. Returns when each frozen response last sent its client a byte
        (`time.monotonic()`); `reset_held()` ends them."""
        return await asyncio.wrap_future(self._thread.submit(self._freeze(match)))

    async def cut(self) -> int:
        """Resets every client connection now, open watches included; returns how many."""
        return await asyncio.wrap_future(self._thread.submit(self._reset(all_of_them=True)))

    def seen(
        self, match: Callable[[Seen], bool] | None = None, *, since: float | None = None
    ) -> list[Seen]:
        with self._lock:
            requests = list(self.requests)
        return [
            r for r in requests if (since is None or r.at >= since) and (match is None or match(r))
        ]

    def _take(
        self, head: RequestHead, kinds: tuple[type, ...], chunk: bytes = b""
    ) -> Action | None:
        now = time.monotonic()
        with self._lock:
            for fault in self._faults:
                if (
                    isinstance(fault.action, kinds)
                    and fault.live(now)
                    and fault.match(head)
                    and _about_its_pod(fault.action, chunk)
                ):
                    fault.applied += 1
                    return fault.action
        return None

    def _record(self, head: RequestHead, outcome: str) -> None:
        seen = Seen(
            at=time.monotonic(),
            method=head.method,
            target=head.target,
            is_watch=head.is_watch,
            user_agent=head.headers.get("user-agent", ""),
            outcome=outcome,
        )
        with self._lock:
            self.requests.append(seen)

    # --- serving -----------------------------------------------------------------------------

    async def _listen(self, context: ssl.SSLContext) -> int:
        self._server = await asyncio.start_server(
            self._serve, host=LOOPBACK, port=0, ssl=context, limit=_HEAD_LIMIT
        )
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _close_everything(self) -> None:
        for connection in list(self._connections):
            connection.reset()
        if self._server is not None:
            self._server.close()

    async def _freeze(self, match: Match) -> list[float]:
        frozen = [
            c
            for c in self._connections
            if c.streaming is not None and not (c.holding or c.frozen) and match(c.streaming)
        ]
        for connection in frozen:
            connection.frozen = True
        return [connection.last_sent for connection in frozen]

    async def _reset(self, *, all_of_them: bool) -> int:
        chosen = [c for c in self._connections if all_of_them or c.holding]
        for connection in chosen:
            connection.reset()
        return len(chosen)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(client=writer)
        self._connections.add(connection)
        try:
            while (head := await _read_request_head(reader)) is not None:
                await self._exchange(connection, head, reader)
        except _Hold:
            connection.holding = True
            connection.drop_upstream()
            await connection.released.wait()
        except (_Close, ConnectionError, OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._connections.discard(connection)
            connection.reset()

    async def _exchange(
        self, connection: _Connection, head: RequestHead, reader: asyncio.StreamReader
    ) -> None:
        action = self._take(head, (Respond, BlackHole, CutAfterForward))
        if isinstance(action, BlackHole):
            self._record(head, action.describe())
            raise _Hold
        body = await _read_body(reader, head.headers)
        if isinstance(action, CutAfterForward):
            self._record(head, action.describe())
            await self._send(connection, head, body)
            raise _Close
        if isinstance(action, Respond):
            self._record(head, action.describe())
            await _answer(connection.client, head, action)
            return
        self._record(head, "forwarded")
        await self._forward(connection, head, body)

    async def _forward(self, connection: _Connection, head: RequestHead, body: bytes) -> None:
        reused = connection.upstream is not None
        try:
            upstream_r, status_line, headers, raw_head = await self._send(connection, head, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            if not reused:
                raise
            # An idle keep-alive connection the apiserver closed: resend once on a new one, as
            # Go's transport does for a request that got no byte of response.
            connection.drop_upstream()
            upstream_r, status_line, headers, raw_head = await self._send(connection, head, body)
        connection.send(raw_head)
        await connection.client.drain()
        if head.method == "HEAD" or _status_code(status_line) in (204, 304):
            return
        connection.streaming = head
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await self._pump_chunks(head, upstream_r, connection)
        elif "content-length" in headers:
            await self._pump_length(head, upstream_r, connection, int(headers["content-length"]))
        else:
            await self._pump_length(head, upstream_r, connection, None)
            raise _Close
        connection.streaming = None
        if headers.get("connection", "").lower() == "close":
            raise _Close

    async def _send(
        self, connection: _Connection, head: RequestHead, body: bytes
    ) -> tuple[asyncio.StreamReader, bytes, dict[str, str], bytes]:
        upstream_r, upstream_w = await self._upstream_of(connection)
        upstream_w.write(_request_bytes(head, body))
        await upstream_w.drain()
        status_line, headers, raw_head = await _read_response_head(upstream_r)
        return upstream_r, status_line, headers, raw_head

    async def _upstream_of(
        self, connection: _Connection
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if connection.upstream is None or connection.upstream[0].at_eof():
            connection.drop_upstream()
            up = self._upstream
            connection.upstream = await asyncio.open_connection(
                up.host, up.port, ssl=up.ssl, server_hostname=up.server_hostname, limit=_HEAD_LIMIT
            )
        return connection.upstream

    async def _pump_chunks(
        self, head: RequestHead, upstream: asyncio.StreamReader, connection: _Connection
    ) -> None:
        client = connection.client
        chunks = _read_chunks(upstream)
        if self._delaying(head):
            chunks = delay_line(chunks, lambda chunk: self._hold(head, chunk))
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                self._hold_if_frozen(head, connection)
                if chunk.last:
                    connection.send(chunk.encoded())
                    await client.drain()
                    return
                if client.is_closing():
                    # The client went away while the proxy waited on the apiserver: this watch
                    # must not take a fault meant for the client's next one.
                    raise _Close
                await self._send_chunk(head, chunk, connection)

    async def _send_chunk(self, head: RequestHead, chunk: Chunk, connection: _Connection) -> None:
        data = chunk.data
        if data.startswith(_POD_FRAME_OPENINGS):
            rewrite = self._take(head, (RewriteFrame,), data)
            if isinstance(rewrite, RewriteFrame):
                data = rewrite.rewrite(data)
                self._record(head, f"response {rewrite.describe()}")
                chunk = Chunk(size_line=b"%x" % len(data), data=data)
        action = self._take(head, (BlackHole, CorruptChunk), data)
        if isinstance(action, CorruptChunk):
            connection.send(action.breakage(data))
            await connection.client.drain()
        if action is not None:
            self._record(head, f"response {action.describe()}")
            raise _Hold
        connection.send(chunk.encoded())
        await connection.client.drain()

    def _delaying(self, head: RequestHead) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(
                isinstance(fault.action, Delay) and fault.live(now) and fault.match(head)
                for fault in self._faults
            )

    def _hold(self, head: RequestHead, chunk: Chunk) -> float:
        delay = self._take(head, (Delay,), chunk.data)
        if not isinstance(delay, Delay):
            return 0.0
        self._record(head, f"response {delay.describe()}")
        return delay.seconds

    async def _pump_length(
        self,
        head: RequestHead,
        upstream: asyncio.StreamReader,
        connection: _Connection,
        length: int | None,
    ) -> None:
        remaining = length
        while remaining is None or remaining > 0:
            piece = await upstream.read(_PIECE if remaining is None else min(_PIECE, remaining))
            if not piece:
                if remaining is None:
                    return
                raise _Close
            self._hold_if_frozen(head, connection)
            if self._take(head, (BlackHole,)) is not None:
                self._record(head, "response black-holed")
                raise _Hold
            connection.send(piece)
            await connection.client.drain()
            if remaining is not None:
                remaining -= len(piece)

    def _hold_if_frozen(self, head: RequestHead, connection: _Connection) -> None:
        if connection.frozen:
            self._record(head, "response frozen")
            raise _Hold


def _about_its_pod(action: Action, chunk: bytes) -> bool:
    if not isinstance(action, (RewriteFrame, CorruptChunk)) or action.pod is None:
        return True
    return frame_about(chunk, action.pod)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise HttpProxyError(
            f"kubeconfig {path} cannot be proxied: the proxy reads only the JSON kubeconfigs "
            f"k8s_testenv writes ({type(err).__name__}: {err})"
        ) from err


def _upstream_of(config: Any, path: Path) -> _Upstream:
    try:
        current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        name = current["context"]["cluster"]
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == name)
        url = urlsplit(cluster["server"])
    except (KeyError, StopIteration, TypeError) as err:
        raise HttpProxyError(f"kubeconfig {path} names no server for its current context") from err
    if url.hostname is None:
        raise HttpProxyError(f"kubeconfig {path}: server {cluster['server']!r} has no host")
    if url.scheme != "https":
        return _Upstream(url.hostname, url.port or 80, None, None)
    context = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        context.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        context.load_verify_locations(cafile=cluster["certificate-authority"])
    context.set_alpn_protocols(["http/1.1"])
    return _Upstream(url.hostname, url.port or 443, context, url.hostname)


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    return (await reader.readuntil(b"\r\n"))[:-2]


async def _read_chunks(reader: asyncio.StreamReader) -> AsyncGenerator[Chunk, None]:
    """The chunks of a chunked response body, up to and including the last."""
    while True:
        size_line = await _read_line(reader)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            trailers = b""
            while line := await _read_line(reader):
                trailers += line + b"\r\n"
            yield Chunk(size_line=size_line, trailers=trailers)
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield Chunk(size_line=size_line, data=data)


def _parse_headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


async def _read_request_head(reader: asyncio.StreamReader) -> RequestHead | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if err.partial.strip():
            raise
        return None
    request_line, *lines = raw[:-4].split(b"\r\n")
    method, target, _version = request_line.decode("latin-1").split(" ", 2)
    return RequestHead(method=method, target=target, headers=_parse_headers(lines))


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    """A request body, de-chunked if it came chunked (it is re-sent with a Content-Length)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while size := int((await _read_line(reader)).split(b";", 1)[0].strip(), 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while await _read_line(reader):
            pass
        return b"".join(parts)
    return await reader.readexactly(int(headers.get("content-length", "0")))


def _request_bytes(head: RequestHead, body: bytes) -> bytes:
    lines = [f"{head.method} {head.target} HTTP/1.1"]
    for name, value in head.headers.items():
        if name not in ("transfer-encoding", "content-length"):
            lines.append(f"{name}: {value}")
    if body or head.method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _read_response_head(
    reader: asyncio.StreamReader,
) -> tuple[bytes, dict[str, str], bytes]:
    while True:
        raw = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = raw[:-4].split(b"\r\n")
        if _status_code(status_line) != 100:
            return status_line, _parse_headers(lines), raw


def _status_code(status_line: bytes) -> int:
    return int(status_line.split(b" ", 2)[1])


async def _answer(client: asyncio.StreamWriter, head: RequestHead, action: Respond) -> None:
    status = action.status_object()
    if action.in_band and head.is_watch:
        event = json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
        code, body = 200, b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)
        framing = "transfer-encoding: chunked"
    else:
        code, body = action.status, json.dumps(status).encode()
        framing = f"content-length: {len(body)}"
    lines = [
        f"HTTP/1.1 {code} {_PHRASES.get(code, 'Error')}",
        "content-type: application/json",
        framing,
        *(f"{name}: {value}" for name, value in action.headers.items()),
    ]
    client.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await client.drain()
    if head.headers.get("connection", "").lower() == "close":
        raise _Close
