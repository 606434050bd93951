"""Fast layer: ``k8s_http2``, the write client's HTTP/2 transport, against scripted loopback TLS
servers speaking HTTP/2 through the ``h2`` library: requests as streams of one connection, the
fallback to HTTP/1.1 where ALPN does not pick ``h2``, a refused stream and a stream above GOAWAY's
last id sent again, a cut connection and a reset stream never sent again, the deadline (the
stream reset; a connection silent for a whole deadline retired), a body larger than the server's
flow-control window, a 401, an answer's header block in CONTINUATION frames, a PING answered, a
server breaking the protocol (its framing, or a header block HPACK refuses)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from miles.utils.k8s_testenv.certs import ServingPair, generate_serving_pair
from miles.utils.workers.reconcile.k8s_errors import ConnectionFailure, KubernetesConnectionError
from miles.utils.workers.reconcile.k8s_http import BearerCredentials
from miles.utils.workers.reconcile.k8s_http2 import Http2Transport
from miles.utils.workers.reconcile.k8s_transport import Request
from tests.fast.utils.workers.reconcile.loopback import loopback_server


@dataclass
class Received:
    connection: int
    stream_id: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Peer:
    """The server's side of one connection: its index (from 1), its ``h2`` state, its writer."""

    index: int
    h2: h2.connection.H2Connection
    writer: asyncio.StreamWriter
    resets: list[int] = field(default_factory=list)
    pings: list[bytes] = field(default_factory=list)

    def answer(self, stream_id: int, status: int = 200, body: bytes = b"{}") -> None:
        fields = [(":status", str(status)), ("content-type", "application/json")]
        self.h2.send_headers(stream_id, [*fields, ("content-length", str(len(body)))])
        self.h2.send_data(stream_id, body, end_stream=True)
        self.flush()

    def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())


Handler = Callable[[Peer, Received], Awaitable[None]]


async def answering(peer: Peer, request: Received) -> None:
    peer.answer(request.stream_id, body=b'{"echo":%d}' % len(request.body))


@asynccontextmanager
async def serving(
    tls: ssl.SSLContext, handler: Handler = answering
) -> AsyncIterator[tuple[str, list[Received], list[Peer]]]:
    """A loopback HTTP/2 server calling ``handler`` on each whole request; yields its URL, the
    requests it received in order, and its connections."""
    requests: list[Received] = []
    peers: list[Peer] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        peer = Peer(len(peers) + 1, h2.connection.H2Connection(config=config), writer)
        peers.append(peer)
        peer.h2.initiate_connection()
        peer.flush()
        heads: dict[int, dict[str, str]] = {}
        bodies: dict[int, bytes] = {}
        try:
            while data := await reader.read(65536):
                for event in peer.h2.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        heads[event.stream_id] = dict(event.headers)  # type: ignore[arg-type]
                    elif isinstance(event, h2.events.DataReceived):
                        bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                        peer.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamReset):
                        peer.resets.append(event.stream_id)
                    elif isinstance(event, h2.events.PingAckReceived):
                        peer.pings.append(bytes(event.ping_data or b""))
                    elif isinstance(event, h2.events.StreamEnded):
                        head = heads.pop(event.stream_id)
                        request = Received(
                            peer.index,
                            event.stream_id,
                            head.pop(":method"),
                            head.pop(":path"),
                            head,
                            bodies.pop(event.stream_id, b""),
                        )
                        requests.append(request)
                        await handler(peer, request)
                peer.flush()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async with loopback_server(accept, tls=tls) as url:
        yield url, requests, peers


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> ServingPair:
    return generate_serving_pair(tmp_path_factory.mktemp("pki"))


def server_tls(pair: ServingPair, *, alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.serving_cert, pair.serving_key)
    context.set_alpn_protocols(["h2"] if alpn is None else alpn)
    return context


def client(url: str, ca: Path) -> Http2Transport:
    return Http2Transport(server=url, tls=ssl.create_default_context(cafile=ca))


def patch(path: str, body: bytes = b"{}", deadline: float | None = 5.0) -> Request:
    return Request(
        method="PATCH",
        path=path,
        query=[("fieldManager", "m")],
        body=body,
        content_type="application/merge-patch+json",
        deadline=deadline,
    )


async def test_concurrent_requests_are_streams_of_one_connection(pair: ServingPair) -> None:
    async with (
        serving(server_tls(pair)) as (url, requests, peers),
        client(url, pair.ca_cert) as transport,
    ):
        answers = await asyncio.gather(*(transport.send(patch(f"/p/{i}")) for i in range(16)))
        later = await transport.send(Request(method="GET", path="/g"))
        assert transport.protocol == "h2"
    assert [a.status for a in answers] == [200] * 16
    assert answers[0].body == b'{"echo":2}'
    assert answers[0].headers["Content-Type"] == "application/json"
    assert later.status == 200
    assert len(peers) == 1
    assert sorted(r.path for r in requests[:16]) == sorted(
        f"/p/{i}?fieldManager=m" for i in range(16)
    )
    assert requests[0].headers["content-type"] == "application/merge-patch+json"
    assert requests[0].headers["accept"] == "application/json"


async def test_the_header_block_joined_per_request_reads_back_whole(pair: ServingPair) -> None:
    """The header block is joined from the method's and the credentials' blocks, ``:path`` and
    ``content-length``: a path past the 7-bit length prefix, a body's length and a body-less
    DELETE all arrive as sent."""
    long_path = "/api/v1/namespaces/ns/configmaps/" + "n" * 200
    async with (
        serving(server_tls(pair)) as (url, requests, _),
        client(url, pair.ca_cert) as transport,
    ):
        await transport.send(patch(long_path, body=b"x" * 1000))
        await transport.send(patch("/short"))
        await transport.send(Request(method="DELETE", path="/d", query=[("a", "b c")]))
    assert [(r.method, r.path) for r in requests] == [
        ("PATCH", f"{long_path}?fieldManager=m"),
        ("PATCH", "/short?fieldManager=m"),
        ("DELETE", "/d?a=b+c"),
    ]
    assert [r.headers.get("content-length") for r in requests] == ["1000", "2", None]
    assert [len(r.body) for r in requests] == [1000, 2, 0]


async def test_a_server_without_h2_is_spoken_to_over_http11(pair: ServingPair) -> None:
    """ALPN picks ``http/1.1`` (a proxy that speaks only HTTP/1.1): the requests go through
    ``HttpTransport`` on the same TLS settings."""
    seen: list[bytes] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                seen.append(head.split(b"\r\n", 1)[0])
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]  # fmt: skip
                await reader.readexactly(length[0] if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async with (
        loopback_server(accept, tls=server_tls(pair, alpn=["http/1.1"])) as url,
        client(url, pair.ca_cert) as transport,
    ):
        first = await transport.send(patch("/a"))
        second = await transport.send(patch("/b"))
        assert transport.protocol == "http/1.1"
    assert (first.status, second.status) == (200, 200)
    assert seen == [b"PATCH /a?fieldManager=m HTTP/1.1", b"PATCH /b?fieldManager=m HTTP/1.1"]


async def refusing_first(peer: Peer, request: Received) -> None:
    if request.stream_id == 1:
        peer.h2.reset_stream(1, h2.errors.ErrorCodes.REFUSED_STREAM)
    else:
        await answering(peer, request)


async def going_away(peer: Peer, request: Received) -> None:
    """GOAWAY naming stream 0 as the last processed: stream 1 was not."""
    if peer.index == 1:
        peer.h2.close_connection(last_stream_id=0)
    else:
        await answering(peer, request)


@pytest.mark.parametrize(
    ("unprocessing", "received"),
    [
        (refusing_first, [(1, 1, "PATCH"), (1, 3, "PATCH")]),  # again on the same connection
        (going_away, [(1, 1, "PATCH"), (2, 1, "PATCH")]),  # again on a second connection
    ],
)
async def test_a_stream_the_server_did_not_process_is_sent_again(
    pair: ServingPair, unprocessing: Handler, received: list[tuple[int, int, str]]
) -> None:
    async with (
        serving(server_tls(pair), unprocessing) as (url, requests, peers),
        client(url, pair.ca_cert) as transport,
    ):
        answer = await transport.send(patch("/a"))
    assert answer.status == 200
    assert [(r.connection, r.stream_id, r.method) for r in requests] == received
    assert len(peers) == received[-1][0]


@pytest.mark.parametrize("cut", ["close", "reset"])
async def test_a_processed_stream_cut_short_is_not_sent_again(pair: ServingPair, cut: str) -> None:
    async def cutting(peer: Peer, request: Received) -> None:
        if request.path.startswith("/a") and cut == "close":
            peer.writer.transport.abort()
        elif request.path.startswith("/a"):
            peer.h2.reset_stream(request.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        else:
            await answering(peer, request)

    async with (
        serving(server_tls(pair), cutting) as (url, requests, _),
        client(url, pair.ca_cert) as transport,
    ):
        with pytest.raises(KubernetesConnectionError, match="PATCH /a cut short") as broken:
            await transport.send(patch("/a"))
        assert broken.value.kind is ConnectionFailure.BROKEN
        assert (await transport.send(patch("/b"))).status == 200
    assert [r.path for r in requests] == ["/a?fieldManager=m", "/b?fieldManager=m"]


async def silent_on_a(peer: Peer, request: Received) -> None:
    if not request.path.startswith("/a"):
        await answering(peer, request)


async def test_the_deadline_ends_and_resets_a_stream_never_answered(pair: ServingPair) -> None:
    """The connection answered another stream meanwhile: it is alive, and kept."""
    async with (
        serving(server_tls(pair), silent_on_a) as (url, requests, peers),
        client(url, pair.ca_cert) as transport,
    ):
        late = asyncio.ensure_future(transport.send(patch("/a", deadline=0.2)))
        assert (await transport.send(patch("/b"))).status == 200
        with pytest.raises(KubernetesConnectionError, match="client deadline") as failure:
            await late
        assert failure.value.kind is ConnectionFailure.TIMEOUT
        assert (await transport.send(patch("/c"))).status == 200
    assert peers[0].resets == [r.stream_id for r in requests if r.path.startswith("/a")]
    assert len(peers) == 1


async def test_a_connection_silent_for_a_whole_deadline_takes_no_new_stream(
    pair: ServingPair,
) -> None:
    """Nothing read while the late stream was open: the next request opens a new connection
    (where Go's health ping would have found the connection dead)."""
    async with (
        serving(server_tls(pair), silent_on_a) as (url, requests, _),
        client(url, pair.ca_cert) as transport,
    ):
        assert (await transport.send(patch("/b"))).status == 200
        with pytest.raises(KubernetesConnectionError, match="client deadline"):
            await transport.send(patch("/a", deadline=0.05))
        assert (await transport.send(patch("/c"))).status == 200
    assert [(r.connection, r.path) for r in requests] == [
        (1, "/b?fieldManager=m"),
        (1, "/a?fieldManager=m"),
        (2, "/c?fieldManager=m"),
    ]


async def test_a_body_beyond_the_flow_control_window_is_sent_whole(pair: ServingPair) -> None:
    """The server's initial window is 65,535 bytes: the rest waits for its WINDOW_UPDATEs."""
    body = b"x" * 300_000
    async with (
        serving(server_tls(pair)) as (url, requests, _),
        client(url, pair.ca_cert) as transport,
    ):
        answer = await transport.send(patch("/big", body=body))
    assert answer.body == b'{"echo":300000}'
    assert requests[0].body == body


async def test_a_refused_connection_names_the_server(pair: ServingPair) -> None:
    async with serving(server_tls(pair)) as (url, _, _):
        pass
    async with client(url, pair.ca_cert) as transport:
        with pytest.raises(KubernetesConnectionError, match="refused") as refused:
            await transport.send(patch("/a"))
    assert refused.value.kind is ConnectionFailure.REFUSED
    assert refused.value.server == url.removeprefix("https://")


class Rotating:
    """Credentials whose token changes when forgotten (a ServiceAccountToken read again)."""

    def __init__(self) -> None:
        self.token = "first"
        self._held: dict[str | None, dict[str, str]] = {}

    async def headers(self, content_type: str | None) -> dict[str, str]:
        held = self._held.get(content_type)
        if held is None or held["Authorization"] != f"Bearer {self.token}":
            held = {"Accept": "application/json", "Authorization": f"Bearer {self.token}"}
            if content_type is not None:
                held["Content-Type"] = content_type
            self._held[content_type] = held
        return held

    def forget(self) -> None:
        self.token = "second"


async def test_a_401_makes_the_credentials_read_again(pair: ServingPair) -> None:
    async def first_token_refused(peer: Peer, request: Received) -> None:
        refused = request.headers["authorization"] == "Bearer first"
        peer.answer(request.stream_id, status=401 if refused else 200)

    credentials = Rotating()
    async with (
        serving(server_tls(pair), first_token_refused) as (url, requests, _),
        Http2Transport(
            server=url,
            tls=ssl.create_default_context(cafile=pair.ca_cert),
            credentials=cast(BearerCredentials, credentials),
        ) as transport,
    ):
        statuses = [(await transport.send(patch(f"/{i}"))).status for i in range(3)]
    assert statuses == [401, 200, 200]
    assert [r.headers["authorization"] for r in requests] == ["Bearer first"] + [
        "Bearer second"
    ] * 2


async def test_an_answer_in_continuations_and_a_ping_are_read(pair: ServingPair) -> None:
    """The server's header block past one frame comes in CONTINUATION frames; its PING is
    answered."""
    acks: list[bytes] = []

    async def long_header_and_ping(peer: Peer, request: Received) -> None:
        peer.h2.ping(b"12345678")
        fields = [(":status", "200"), ("x-long", "v" * 40_000)]
        peer.h2.send_headers(request.stream_id, fields)
        peer.h2.send_data(request.stream_id, b"{}", end_stream=True)

    async with (
        serving(server_tls(pair), long_header_and_ping) as (url, _, peers),
        client(url, pair.ca_cert) as transport,
    ):
        answer = await transport.send(patch("/a"))
        await transport.send(patch("/b"))
        acks.extend(peers[0].pings)
    assert answer.status == 200
    assert answer.headers["x-long"] == "v" * 40_000
    assert acks[:1] == [b"12345678"]


@pytest.mark.parametrize(
    "frames",
    [
        b"\x00\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 64,  # a frame over 16 KiB
        b"\x00\x00\x01\x01\x04\x00\x00\x00\x01\x80",  # HEADERS whose block has index 0
    ],
)
async def test_a_server_breaking_the_protocol_fails_the_streams(
    pair: ServingPair, frames: bytes
) -> None:
    async def garbage(peer: Peer, request: Received) -> None:
        peer.writer.write(frames)

    async with (
        serving(server_tls(pair), garbage) as (url, _, _),
        client(url, pair.ca_cert) as transport,
    ):
        with pytest.raises(KubernetesConnectionError, match="protocol error") as broken:
            await transport.send(patch("/a"))
    assert broken.value.kind is ConnectionFailure.BROKEN
