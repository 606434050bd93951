"""Fast layer: ``k8s_http``, the write client's HTTP/1.1 transport. Its response reader on bytes
fed in pieces (lengths, chunks, interim answers, bodiless answers, a body read to the close,
malformed heads and chunks), and the transport against scripted loopback servers: keep-alive, the
keep-alive race (an idempotent request sent again on a fresh connection, a PATCH not), a cut body,
the deadline, a refused connection, the pool's limit, TLS with a CA, a server name and a client
certificate."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest

from miles.utils.k8s_testenv.certs import ServingPair, generate_serving_pair
from miles.utils.workers.reconcile.k8s_errors import ConnectionFailure, KubernetesConnectionError
from miles.utils.workers.reconcile.k8s_http import (
    Answer,
    BearerCredentials,
    Endpoint,
    Headers,
    HttpTransport,
    MalformedResponse,
    ResponseReader,
    parse_head,
)
from miles.utils.workers.reconcile.k8s_transport import Request
from tests.fast.utils.workers.reconcile.loopback import loopback_server

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def read(*pieces: bytes, head_only: bool = False) -> Answer | None:
    reader = ResponseReader()
    reader.expect(head_only=head_only)
    answer = None
    for piece in pieces:
        assert answer is None, "an answer came before its last byte"
        answer = reader.feed(piece)
    return answer


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def test_a_sized_body_fed_byte_by_byte() -> None:
    answer = read(*bytewise(OK))
    assert answer is not None
    assert (answer.status, answer.body, answer.keep_alive) == (200, b"{}", True)
    assert dict(answer.headers) == {"content-type": "application/json", "content-length": "2"}


def test_a_chunked_body_with_an_extension_and_trailers() -> None:
    data = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;ext=1\r\nabcd\r\n2\r\nef\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    answer = read(*bytewise(data))
    assert answer is not None
    assert (answer.status, answer.body, answer.keep_alive) == (201, b"abcdef", True)


def test_interim_answers_are_skipped() -> None:
    answer = read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + OK)
    assert answer is not None
    assert (answer.status, answer.body) == (200, b"{}")


@pytest.mark.parametrize(
    ("head", "head_only"),
    [
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", True),
    ],
)
def test_no_body_after_head_204_or_304(head: bytes, head_only: bool) -> None:
    answer = read(head, head_only=head_only)
    assert answer is not None
    assert answer.body == b""


def test_a_body_without_length_ends_at_the_close() -> None:
    reader = ResponseReader()
    reader.expect(head_only=False)
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\npart one ") is None
    assert reader.feed(b"part two") is None
    answer = reader.at_close()
    assert answer is not None
    assert (answer.body, answer.keep_alive) == (b"part one part two", False)


def test_keep_alive_follows_the_version_and_connection_field() -> None:
    assert parse_head(b"HTTP/1.1 200 OK\r\nConnection: Close")[3] is False
    assert parse_head(b"HTTP/1.1 200 OK")[3] is True
    assert parse_head(b"HTTP/1.0 200 OK")[3] is False
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive")[3] is True


def test_header_names_look_up_in_any_case_and_repeats_join() -> None:
    status, headers, framing, _ = parse_head(
        b"HTTP/1.1 429 Too Many\r\nRetry-After:  3 \r\nWarning: a\r\nwarning: b\r\n"
        b"Content-Length: 0"
    )
    assert status == 429
    assert headers["retry-after"] == headers["RETRY-AFTER"] == headers.get("Retry-After") == "3"
    assert headers["Warning"] == "a, b"
    assert sorted(headers) == ["content-length", "retry-after", "warning"]
    assert framing == {"content-length": "0"}
    given = Headers({"Retry-After": "1"})
    assert (given["retry-after"], len(given)) == ("1", 1)


async def test_credentials_are_ready_without_a_coroutine_unless_a_hook_must_run() -> None:
    """Without a refresh hook the headers come synchronously, the same dict ``headers`` gives;
    with one, ``ready`` says None and ``headers`` runs the hook (its new token in the headers)."""
    configuration = SimpleNamespace(
        refresh_api_key_hook=None,
        api_key={"BearerToken": "t1"},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    credentials = BearerCredentials(
        api_client=SimpleNamespace(configuration=configuration, default_headers={})
    )
    ready = credentials.ready("application/json")
    assert ready is not None
    assert ready is await credentials.headers("application/json")
    assert ready["authorization"] == "Bearer t1"

    def rotate(config: SimpleNamespace) -> None:
        config.api_key["BearerToken"] = "t2"

    configuration.refresh_api_key_hook = rotate
    assert credentials.ready("application/json") is None
    assert (await credentials.headers("application/json"))["authorization"] == "Bearer t2"


def test_targets_are_the_endpoints_with_each_query_encoded_once() -> None:
    endpoint = Endpoint.of(
        "https://h:6443/k8s/c-1/", tls=None, tls_server_name=None, connect_timeout=1.0
    )
    targets = endpoint.targets()
    queries: list[list[tuple[str, str]]] = [[], [("fieldManager", "a b/c"), ("force", "true")]]
    for path in ("/api/v1/x", "/api/v1/y"):
        for query in queries:
            for given in (query, tuple(query)):
                expected = endpoint.prefix + path + (f"?{urlencode(query)}" if query else "")
                assert targets(path, given) == expected
    assert targets("/p", queries[1]) == "/k8s/c-1/p?fieldManager=a+b%2Fc&force=true"


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
    ],
)
def test_malformed_responses_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedResponse):
        read(data)


# --- the transport against scripted servers ------------------------------------------------------


class Peer:
    """The server's side of one connection: its index (from 1), its streams, and the request
    lines every connection of the server received."""

    def __init__(
        self,
        index: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        log: list[bytes],
    ) -> None:
        self.index, self.reader, self.writer, self._log = index, reader, writer, log

    async def request(self) -> bytes:
        """One request's head and body (by its Content-Length)."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        self._log.append(head.split(b"\r\n", 1)[0])
        return head + await self.reader.readexactly(length)


Handler = Callable[[Peer], Awaitable[None]]


@asynccontextmanager
async def serving(
    handler: Handler, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback server calling ``handler`` on each connection; yields its URL and the request
    lines it received, in order."""
    connections = 0
    requests: list[bytes] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await handler(Peer(connections, reader, writer, requests))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async with loopback_server(accept, tls=tls) as url:
        yield url, requests


async def answering(peer: Peer) -> None:
    while True:
        await peer.request()
        peer.writer.write(OK)


async def test_requests_share_one_kept_alive_connection() -> None:
    seen: list[int] = []

    async def handler(peer: Peer) -> None:
        seen.append(peer.index)
        await answering(peer)

    async with serving(handler) as (url, requests), HttpTransport(server=url) as transport:
        for _ in range(3):
            response = await transport.send(
                Request(method="PATCH", path="/p", body=b"{}", content_type="x/y")
            )
            assert (response.status, response.body) == (200, b"{}")
    assert seen == [1]
    assert requests == [b"PATCH /p HTTP/1.1"] * 3


def closing_after_first_answer(answers: int = 1) -> Handler:
    """The first connection answers ``answers`` requests, then closes as it reads the next one
    without answering (the server closed a kept-alive connection as the request went out)."""

    async def handler(peer: Peer) -> None:
        if peer.index == 1:
            for _ in range(answers):
                await peer.request()
                peer.writer.write(OK)
            await peer.request()
            return
        await answering(peer)

    return handler


async def test_the_keep_alive_race_sends_a_get_again_on_a_fresh_connection() -> None:
    async with (
        serving(closing_after_first_answer()) as (url, requests),
        HttpTransport(server=url) as transport,
    ):
        await transport.send(Request(method="GET", path="/a"))
        response = await transport.send(Request(method="GET", path="/b", query=[("x", "1 2")]))
    assert response.status == 200
    assert requests == [b"GET /a HTTP/1.1", b"GET /b?x=1+2 HTTP/1.1", b"GET /b?x=1+2 HTTP/1.1"]


async def test_the_keep_alive_race_never_sends_a_patch_again() -> None:
    async with (
        serving(closing_after_first_answer()) as (url, requests),
        HttpTransport(server=url) as transport,
    ):
        await transport.send(Request(method="GET", path="/a"))
        with pytest.raises(KubernetesConnectionError, match="PATCH /b cut short") as cut:
            await transport.send(Request(method="PATCH", path="/b", body=b"{}"))
        assert cut.value.kind is ConnectionFailure.BROKEN
        assert (await transport.send(Request(method="PATCH", path="/c", body=b"{}"))).status == 200
    assert requests == [b"GET /a HTTP/1.1", b"PATCH /b HTTP/1.1", b"PATCH /c HTTP/1.1"]


@pytest.mark.parametrize(
    ("answer", "failure"),
    [
        (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"kind":', "GET /a cut short"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nnot-hex\r\n", "malformed"),
    ],
    ids=["cut-mid-body", "malformed-chunk"],
)
async def test_a_broken_answer_fails_and_is_not_sent_again(answer: bytes, failure: str) -> None:
    """A GET cut after part of its answer came is not sent again (only one that got no byte is);
    the request retry policy above decides."""

    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.writer.write(answer)
        await peer.writer.drain()

    async with serving(handler) as (url, requests), HttpTransport(server=url) as transport:
        with pytest.raises(KubernetesConnectionError, match=failure) as broken:
            await transport.send(Request(method="GET", path="/a"))
    assert broken.value.kind is ConnectionFailure.BROKEN
    assert requests == [b"GET /a HTTP/1.1"]


async def test_the_deadline_ends_a_request_the_server_never_answers() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 1:
            await peer.request()
            await peer.reader.read()
            return
        await answering(peer)

    async with serving(handler) as (url, _), HttpTransport(server=url) as transport:
        with pytest.raises(KubernetesConnectionError, match="client deadline") as late:
            await transport.send(Request(method="GET", path="/a", deadline=0.05))
        assert late.value.kind is ConnectionFailure.TIMEOUT
        assert (await transport.send(Request(method="GET", path="/b", deadline=5))).status == 200


async def test_a_refused_connection_names_the_server() -> None:
    async with serving(answering) as (url, _):
        pass
    async with HttpTransport(server=url) as transport:
        with pytest.raises(KubernetesConnectionError, match="refused") as refused:
            await transport.send(Request(method="GET", path="/a"))
    assert refused.value.kind is ConnectionFailure.REFUSED
    assert refused.value.server == url.removeprefix("http://")


async def test_requests_beyond_the_limit_wait_for_a_connection() -> None:
    seen: list[int] = []

    async def handler(peer: Peer) -> None:
        seen.append(peer.index)
        await answering(peer)

    async with (
        serving(handler) as (url, requests),
        HttpTransport(server=url, max_connections=1) as transport,
    ):
        answers = await asyncio.gather(
            *(transport.send(Request(method="GET", path=f"/{i}")) for i in range(4))
        )
    assert [a.status for a in answers] == [200] * 4
    assert seen == [1]
    assert sorted(requests) == [f"GET /{i} HTTP/1.1".encode() for i in range(4)]


async def test_a_waiter_cancelled_by_its_deadline_passes_its_turn_on() -> None:
    release = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await release.wait()
        peer.writer.write(OK)
        await answering(peer)

    async with (
        serving(handler) as (url, _),
        HttpTransport(server=url, max_connections=1) as transport,
    ):
        first = asyncio.ensure_future(transport.send(Request(method="GET", path="/first")))
        await asyncio.sleep(0)
        with pytest.raises(KubernetesConnectionError, match="client deadline"):
            await transport.send(Request(method="GET", path="/late", deadline=0.05))
        third = asyncio.ensure_future(transport.send(Request(method="GET", path="/third")))
        release.set()
        assert [(await first).status, (await third).status] == [200, 200]


async def test_an_interim_answer_on_the_wire_and_a_prefixed_server() -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
        await peer.reader.read()

    async with (
        serving(handler) as (url, requests),
        HttpTransport(server=url + "/k8s/clusters/c-1/") as transport,
    ):
        response = await transport.send(Request(method="DELETE", path="/api/v1/x", body=b"{}"))
    assert response.status == 200
    assert requests == [b"DELETE /k8s/clusters/c-1/api/v1/x HTTP/1.1"]


# --- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[ServingPair, Path, Path]:
    """A CA, a serving certificate for 127.0.0.1 and kubernetes.default.svc, and a client
    certificate (CN ``writer``) signed by the same CA."""
    directory = tmp_path_factory.mktemp("pki")
    pair = generate_serving_pair(directory)
    (directory / "client.ext").write_text("extendedKeyUsage = clientAuth\n")
    for argv in (
        ["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=writer", "-keyout", "client.key", "-out", "client.csr"],
        ["x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "2", "-extfile", "client.ext", "-out", "client.crt"],
    ):  # fmt: skip
        subprocess.run(["openssl", *argv], cwd=directory, check=True, capture_output=True)
    return pair, directory / "client.crt", directory / "client.key"


def server_context(pair: ServingPair, *, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.serving_cert, pair.serving_key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


async def test_tls_with_the_ca_a_server_name_and_a_client_certificate(
    pki: tuple[ServingPair, Path, Path],
) -> None:
    pair, cert, key = pki
    peers: list[object] = []

    async def handler(peer: Peer) -> None:
        peers.append(peer.writer.get_extra_info("peercert")["subject"])
        await answering(peer)

    client = ssl.create_default_context(cafile=pair.ca_cert)
    client.load_cert_chain(cert, key)
    tls = server_context(pair, client_ca=pair.ca_cert)
    async with serving(handler, tls=tls) as (url, _):
        named = HttpTransport(server=url, tls=client, tls_server_name="kubernetes.default.svc")
        async with named as transport:
            assert (await transport.send(Request(method="GET", path="/a"))).status == 200
    assert peers == [((("commonName", "writer"),),)]


async def test_a_server_name_the_certificate_lacks_fails_verification(
    pki: tuple[ServingPair, Path, Path],
) -> None:
    pair, _, _ = pki
    client = ssl.create_default_context(cafile=pair.ca_cert)
    async with (
        serving(answering, tls=server_context(pair)) as (url, _),
        HttpTransport(server=url, tls=client, tls_server_name="other.invalid") as transport,
    ):
        with pytest.raises(KubernetesConnectionError) as refused:
            await transport.send(Request(method="GET", path="/a"))
    assert refused.value.kind is ConnectionFailure.TLS_VERIFICATION
    assert "other.invalid" in (refused.value.reason or "")


async def test_the_configuration_gives_the_ca_client_certificate_server_name_and_token(
    pki: tuple[ServingPair, Path, Path],
) -> None:
    """``for_api_client`` reads what a kubeconfig resolved to: the CA file, the client certificate
    and key, ``tls_server_name``, the bearer token and the ``ApiClient``'s default headers."""
    from kubernetes_asyncio.client import ApiClient, Configuration

    pair, cert, key = pki
    seen: list[bytes] = []

    async def handler(peer: Peer) -> None:
        while True:
            seen.append(await peer.request())
            peer.writer.write(OK)

    configuration = Configuration(api_key={"BearerToken": "Bearer t0ken"})
    configuration.ssl_ca_cert = str(pair.ca_cert)
    configuration.cert_file, configuration.key_file = str(cert), str(key)
    configuration.tls_server_name = "kubernetes.default.svc"
    tls = server_context(pair, client_ca=pair.ca_cert)
    async with serving(handler, tls=tls) as (url, _):
        configuration.host = url
        async with (
            ApiClient(configuration=configuration) as api,
            HttpTransport.for_api_client(api) as transport,
        ):
            api.user_agent = "writer/1"
            response = await transport.send(Request(method="GET", path="/a"))
    assert response.status == 200
    head = seen[0].lower()
    assert b"\r\nauthorization: bearer t0ken\r\n" in head
    assert b"\r\nuser-agent: writer/1\r\n" in head
