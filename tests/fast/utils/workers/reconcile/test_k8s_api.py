"""The transport (``k8s_api``), wire layer (no cluster, real sockets): ``KubernetesAsyncioPodApi``
through a real ``kubernetes_asyncio`` ``ApiClient`` against an aiohttp server on loopback. It serves
bytes recorded from a real kube-apiserver (``wire/``, re-recorded by ``wire/record.py``) and, for
what a healthy apiserver never sends, bytes shaped like them. Every timeout is a fraction of a
second. Also: the translation of the client's failures into our errors, and the in-cluster token
read again before the request after a 401.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.watch import Watch

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    bookmark,
    frame,
    list_body,
    pod_bytes,
    realistic_pod,
    status,
)
from miles.utils.workers.reconcile import k8s_wire
from miles.utils.workers.reconcile.clock import FakeClock, RealClock
from miles.utils.workers.reconcile.k8s_api import (
    KubernetesAsyncioPodApi,
    KubernetesAsyncioTransport,
    as_kubernetes_error,
    in_cluster_configuration,
    write_transport,
)
from miles.utils.workers.reconcile.k8s_errors import (
    ConnectionFailure,
    FrameDecodeError,
    KubernetesApiError,
    KubernetesConfigError,
    KubernetesConnectionError,
    exception_keeps_cursor,
    exception_rejects_cursor,
)
from miles.utils.workers.reconcile.k8s_http import HttpTransport
from miles.utils.workers.reconcile.k8s_http2 import Http2Transport
from miles.utils.workers.reconcile.k8s_interfaces import KubernetesPodApi
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_transport import RawResponse, Request, Transport
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import (
    INITIAL_EVENTS_END_ANNOTATION,
    ListOptions,
    PodListPage,
    PodWatchEvent,
)
from miles.utils.workers.reconcile.k8s_wire import decode_watch_line
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import ReplaceEvent, SourceEvent, UpsertEvent

TOKEN = "sekret-bearer-token-0123456789"
WIRE = Path(__file__).parent / "wire"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Apiserver:
    """Scripted pod endpoint: a LIST pops ``lists``, a ``watch=true`` request pops ``watches``."""

    lists: list[Handler] = field(default_factory=list)
    watches: list[Handler] = field(default_factory=list)
    requests: list[web.Request] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        queue = self.watches if request.query.get("watch", "").lower() == "true" else self.lists
        if not queue:
            await asyncio.Event().wait()
        return await queue.pop(0)(request)


def body(data: bytes, code: int = 200) -> Handler:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(body=data, status=code, content_type="application/json")

    return respond


async def chunked_response(request: web.Request) -> web.StreamResponse:
    """A JSON response to ``request``, chunked and prepared: what a watch is answered with."""
    resp = web.StreamResponse()
    resp.content_type = "application/json"
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    return resp


def stream(*chunks: bytes | float, cut: bool = False) -> Handler:
    """A chunked watch response: bytes are written and flushed, floats are pauses in seconds.

    ``cut`` drops the connection at the end instead of finishing the response.
    """

    async def respond(request: web.Request) -> web.StreamResponse:
        resp = await chunked_response(request)
        for chunk in chunks:
            if isinstance(chunk, float):
                await asyncio.sleep(chunk)
            else:
                await resp.write(chunk)
        if cut:
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp

    return respond


@asynccontextmanager
async def serving(server: Apiserver, **timeouts: Any) -> AsyncIterator[KubernetesAsyncioPodApi]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/pods", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = Configuration(
        host=f"http://127.0.0.1:{port}",
        api_key={"BearerToken": TOKEN},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    try:
        async with ApiClient(configuration=config) as client:
            timeouts.setdefault("watch_read_margin", 0.5)
            yield KubernetesAsyncioPodApi(core_v1_api=CoreV1Api(client), **timeouts)
    finally:
        await runner.cleanup()


async def collect(api: KubernetesAsyncioPodApi, rv: str = "100") -> list[PodWatchEvent]:
    return [
        event
        async for event in api.stream_pods(
            namespace="ns", label_selector="app=miles", resource_version=rv, timeout_seconds=0
        )
    ]


async def test_list_decodes_body_and_asks_for_a_consistent_list() -> None:
    """LIST body bytes -> ``PodListPage``; no resourceVersion is sent (a consistent read)."""
    server = Apiserver(lists=[body(list_body([realistic_pod("a"), realistic_pod("b")], "42"))])
    async with serving(server) as api:
        page = await api.list_pods(namespace="ns", label_selector="app=miles")
    assert [p.metadata.name for p in page.pods] == ["a", "b"]
    assert page.resource_version == "42"
    (request,) = server.requests
    assert request.match_info["namespace"] == "ns"
    assert request.query["labelSelector"] == "app=miles"
    assert "resourceVersion" not in request.query
    assert "resourceVersionMatch" not in request.query
    assert "limit" not in request.query
    assert "watch" not in request.query


async def test_cursor_probe_asks_for_one_pod_not_older_than_the_cursor() -> None:
    """The reflector's probe: ``resourceVersion``, ``resourceVersionMatch=NotOlderThan`` and
    ``limit=1`` on the query string, no watch; the page decodes as any LIST."""
    server = Apiserver(lists=[body(list_body([realistic_pod("a")], "57"))])
    async with serving(server) as api:
        page = await api.list_pods(
            namespace="ns", label_selector="app=miles", resource_version="42", limit=1
        )
    assert ([p.metadata.name for p in page.pods], page.resource_version) == (["a"], "57")
    (request,) = server.requests
    assert request.query["resourceVersion"] == "42"
    assert request.query["resourceVersionMatch"] == "NotOlderThan"
    assert request.query["limit"] == "1"
    assert request.query["labelSelector"] == "app=miles"
    assert "watch" not in request.query


async def test_continue_page_sends_limit_and_token_and_reads_metadata_continue() -> None:
    """A continuation: ``limit`` and ``continue`` on the query string, no resourceVersion; the
    page's ``metadata.continue`` is read into ``continue_token``, an empty one as the last page."""
    server = Apiserver(
        lists=[
            body(list_body([realistic_pod("a")], "42", continue_token="tok/1+=")),
            body(list_body([realistic_pod("b")], "42", continue_token="")),
        ]
    )
    async with serving(server) as api:
        first = await api.list_pods(namespace="ns", label_selector="app=miles", limit=500)
        last = await api.list_pods(
            namespace="ns", label_selector="app=miles", limit=500, continue_token="tok/1+="
        )
    assert (first.resource_version, first.continue_token) == ("42", "tok/1+=")
    assert (last.resource_version, last.continue_token) == ("42", None)
    assert [dict(r.query) for r in server.requests] == [
        {"labelSelector": "app=miles", "limit": "500"},
        {"labelSelector": "app=miles", "limit": "500", "continue": "tok/1+="},
    ]


async def test_a_page_read_announces_its_continue_token_before_the_rest_of_its_body() -> None:
    """Row pager prefetch on the wire: ``read_pod_page``'s ``on_head`` has the token from the
    body's first chunk while the rest is still unsent; the page then decodes whole."""
    data = list_body([realistic_pod("a"), realistic_pod("b")], "42", continue_token="tok/2")
    cut = data.index(b',"items":') + 20
    rest_may_go = asyncio.Event()

    async def respond(request: web.Request) -> web.StreamResponse:
        resp = await chunked_response(request)
        await resp.write(data[:cut])
        await rest_may_go.wait()
        await resp.write(data[cut:])
        await resp.write_eof()
        return resp

    heads: list[str | None] = []

    def on_head(hint: str | None) -> None:
        heads.append(hint)
        rest_may_go.set()

    async with serving(Apiserver(lists=[respond])) as api:
        undecoded = await api.read_pod_page(ListOptions("ns", limit=500), on_head=on_head)
    page = undecoded.decode()
    assert heads == ["tok/2"]
    assert undecoded.continue_hint == "tok/2"
    assert ([p.metadata.name for p in page.pods], page.continue_token) == (["a", "b"], "tok/2")


async def test_a_page_read_announces_its_request_written_before_the_server_answers() -> None:
    """Row pager overlap on the wire: ``on_sent`` is called once the request is written, while
    the server still holds its answer (as the apiserver does until it has built the page), on
    every read, through one hook on the client's session. A body whose ``metadata`` follows its
    items (a custom resource's list) gives its token as ``continue_hint``."""
    data = b'{"apiVersion":"v1","items":[],"kind":"PodList","metadata":{"continue":"tok/2"}}'
    sent = asyncio.Event()

    async def respond(request: web.Request) -> web.StreamResponse:
        await sent.wait()
        sent.clear()
        return web.Response(body=data, content_type="application/json")

    async with serving(Apiserver(lists=[respond, respond])) as api:
        for _ in range(2):
            read = api.read_pod_page(ListOptions("ns", limit=500), on_sent=sent.set)
            undecoded = await asyncio.wait_for(read, 2.0)
            assert undecoded.continue_hint == "tok/2"
        session = api._core.api_client.rest_client.pool_manager
        hooks = [h for c in session.trace_configs for h in c.on_request_headers_sent]
    assert len(hooks) == 1
    assert undecoded.decode().continue_token == "tok/2"


async def test_reflector_lists_in_pages_of_500_over_the_wire() -> None:
    """Row ``ListPager`` on the wire: the reflector's first page carries ``limit=500`` and no
    resourceVersion, the next ``limit=500`` and the token; both pages reach one ReplaceEvent."""
    server = Apiserver(
        lists=[
            body(list_body([realistic_pod("a")], "42", continue_token="next-page")),
            body(list_body([realistic_pod("b")], "42")),
        ]
    )
    async with serving(server) as api:
        reflector = KubernetesReflector(
            kube_client=api, namespace="ns", label_selector="", clock=RealClock()
        )
        source = reflector.watch()
        replace = await asyncio.wait_for(anext(source), 2.0)
        await source.aclose()  # type: ignore[attr-defined]
    assert isinstance(replace, ReplaceEvent)
    assert sorted(replace.objects) == ["a", "b"]
    assert [dict(r.query) for r in server.requests] == [
        {"labelSelector": "", "limit": "500"},
        {"labelSelector": "", "limit": "500", "continue": "next-page"},
    ]


async def test_recorded_too_large_resource_version_rejects_the_probe() -> None:
    """The 504 a real server answers a probe from beyond its head reads as a cursor rejection."""
    recorded = (WIRE / "http_504.json").read_bytes()
    server = Apiserver(lists=[body(recorded, 504)])
    async with serving(server) as api:
        with pytest.raises(KubernetesApiError) as err:
            await api.list_pods(namespace="ns", label_selector="", resource_version="9", limit=1)
    assert (err.value.code, err.value.reason, err.value.rejects_cursor) == (504, "Timeout", True)
    assert "Too large resource version" in err.value.message


async def test_recorded_list_decodes_every_pod() -> None:
    server = Apiserver(lists=[body((WIRE / "list.json").read_bytes())])
    async with serving(server) as api:
        page = await api.list_pods(namespace="wire", label_selector="")
    expected = json.loads((WIRE / "list.json").read_bytes())
    assert page.resource_version == expected["metadata"]["resourceVersion"]
    assert [p.metadata.name for p in page.pods] == ["engine-0", "engine-1"]
    assert all(p.spec.node_name == "gpu-node-17" for p in page.pods)
    assert all(p.status.container_statuses[0].name == "engine" for p in page.pods)


async def test_recorded_watch_yields_every_type_with_its_cursor() -> None:
    """ADDED, MODIFIED, DELETED and BOOKMARK as a real apiserver wrote them, one chunk each."""
    raw = (WIRE / "watch.jsonl").read_bytes()
    lines = raw.splitlines(keepends=True)
    server = Apiserver(watches=[stream(*lines)])
    async with serving(server) as api:
        events = await collect(api)
    expected = [json.loads(line) for line in lines]
    assert [(e.type, e.resource_version) for e in events] == [
        (f["type"], f["object"]["metadata"]["resourceVersion"]) for f in expected
    ]
    assert {e.type for e in events} == {"ADDED", "MODIFIED", "DELETED", "BOOKMARK"}
    deleted = next(e for e in events if e.type == "DELETED")
    assert deleted.pod is not None
    assert deleted.pod.metadata.name == "engine-0"
    assert deleted.pod.metadata.deletion_timestamp is not None
    restarted = next(e for e in events if e.pod and e.pod.metadata.name == "engine-1")
    assert restarted.pod is not None
    assert restarted.pod.status.container_statuses[0].restart_count == 1


async def test_recorded_in_band_error_410_rejects_the_cursor() -> None:
    server = Apiserver(watches=[stream((WIRE / "watch_error_410.jsonl").read_bytes())])
    async with serving(server) as api:
        (event,) = await collect(api)
    assert (event.type, event.rejects_cursor) == ("ERROR", True)
    assert "Expired" in event.reason


@pytest.mark.parametrize(("code", "reason"), [(410, "Expired"), (504, "Timeout")])
async def test_recorded_http_status_rejecting_the_cursor_raises(code: int, reason: str) -> None:
    recorded = body((WIRE / f"http_{code}.json").read_bytes(), code)
    server = Apiserver(lists=[recorded], watches=[recorded])
    async with serving(server) as api:
        with pytest.raises(KubernetesApiError) as on_list:
            await api.list_pods(namespace="wire", label_selector="")
        with pytest.raises(KubernetesApiError) as on_watch:
            await collect(api)
    for err in (on_list.value, on_watch.value):
        assert (err.code, err.reason, err.rejects_cursor) == (code, reason, True)


async def test_list_leaves_out_an_invalid_pod_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = realistic_pod("broken", resource_version="41")
    broken["metadata"]["labels"]["miles.io/cell"] = 3
    server = Apiserver(lists=[body(list_body([realistic_pod("a"), broken], "42"))])
    with caplog.at_level(logging.ERROR):
        async with serving(server) as api:
            page = await api.list_pods(namespace="ns", label_selector="")
    assert [p.metadata.name for p in page.pods] == ["a"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "pod=broken" in line
    assert "resourceVersion=41" in line
    assert "labels" in line


async def test_list_http_error_raises_with_the_status_reason() -> None:
    server = Apiserver(lists=[body(pod_bytes(status(500, "InternalError")), 500)])
    async with serving(server) as api:
        with pytest.raises(KubernetesApiError) as err:
            await api.list_pods(namespace="ns", label_selector="")
    assert (err.value.code, err.value.reason, err.value.rejects_cursor) == (
        500,
        "InternalError",
        False,
    )


async def test_list_that_goes_silent_ends_by_its_read_timeout() -> None:
    """Guard: a LIST on a half-open connection fails after ``list_read_timeout`` of silence."""
    server = Apiserver()  # never answers
    async with serving(server, list_read_timeout=0.2) as api:
        listing = await _ended(api.list_pods(namespace="ns", label_selector=""))
    with pytest.raises(KubernetesConnectionError, match="client deadline") as err:
        listing.result()
    assert not err.value.refused


async def test_watch_sends_cursor_bookmarks_and_timeout_and_reads_every_type() -> None:
    server = Apiserver(
        watches=[
            stream(
                frame("ADDED", realistic_pod("a", resource_version="101")),
                frame("MODIFIED", realistic_pod("a", resource_version="102")),
                bookmark("103"),
                frame("DELETED", realistic_pod("a", resource_version="104")),
            )
        ]
    )
    async with serving(server) as api:
        events = [
            e
            async for e in api.stream_pods(
                namespace="ns", label_selector="x=y", resource_version="100", timeout_seconds=7
            )
        ]
    assert [(e.type, e.resource_version) for e in events] == [
        ("ADDED", "101"),
        ("MODIFIED", "102"),
        ("BOOKMARK", "103"),
        ("DELETED", "104"),
    ]
    assert events[2].pod is None
    assert events[3].pod is not None
    assert events[3].pod.metadata.name == "a"
    query = server.requests[0].query
    assert query["watch"].lower() == "true"
    assert query["allowWatchBookmarks"].lower() == "true"
    assert query["timeoutSeconds"] == "7"
    assert query["resourceVersion"] == "100"
    assert query["labelSelector"] == "x=y"


@pytest.mark.parametrize(
    ("code", "reason", "rejects"),
    [(410, "Expired", True), (504, "Timeout", True), (500, "InternalError", False)],
)
async def test_error_frame_reaches_the_caller_in_band(
    code: int, reason: str, rejects: bool
) -> None:
    """KA would raise ``ApiException`` here; decoding ourselves yields the ERROR frame instead."""
    server = Apiserver(watches=[stream(frame("ERROR", status(code, reason)))])
    async with serving(server) as api:
        (event,) = await collect(api)
    assert (event.type, event.pod, event.rejects_cursor, event.code) == (
        "ERROR",
        None,
        rejects,
        code,
    )
    assert event.reason.startswith(f"{code} {reason}")


async def test_error_frame_whose_reason_alone_says_expired_rejects_the_cursor() -> None:
    """Row: apimachinery's ``IsResourceExpired`` keys on the reason; a Status with no code but
    reason Expired is a dead cursor too."""
    expired = {"kind": "Status", "status": "Failure", "reason": "Expired", "message": "too old"}
    server = Apiserver(watches=[stream(frame("ERROR", expired))])
    async with serving(server) as api:
        (event,) = await collect(api)
    assert (event.type, event.code, event.rejects_cursor) == ("ERROR", None, True)


@pytest.mark.parametrize("code", [410, 504])
async def test_http_status_rejecting_the_cursor_raises(code: int) -> None:
    server = Apiserver(watches=[body(pod_bytes(status(code, "Expired")), code)])
    async with serving(server) as api:
        with pytest.raises(KubernetesApiError) as err:
            await collect(api)
    assert err.value.code == code
    assert err.value.rejects_cursor


async def test_line_that_is_not_json_ends_the_stream_with_decode_error() -> None:
    server = Apiserver(
        watches=[stream(frame("ADDED", realistic_pod("a", resource_version="101")), b"<html>\n")]
    )
    seen: list[PodWatchEvent] = []

    async def consume(api: KubernetesAsyncioPodApi) -> None:
        async for event in api.stream_pods(
            namespace="ns", label_selector="", resource_version="100", timeout_seconds=0
        ):
            seen.append(event)

    async with serving(server) as api:
        with pytest.raises(FrameDecodeError) as err:
            await consume(api)
    assert [e.resource_version for e in seen] == ["101"]
    assert err.value.resource_version is None
    assert "Invalid JSON" in err.value.reason


async def test_bad_line_inside_one_read_ends_the_stream_after_the_lines_before_it() -> None:
    """One chunk carries three lines: the first arrives, the second ends the stream with its
    ``FrameDecodeError``, the third is never yielded."""
    first = frame("ADDED", realistic_pod("a", resource_version="101"))
    last = frame("ADDED", realistic_pod("b", resource_version="102"))
    server = Apiserver(watches=[stream(first + b"<html>\n" + last)])
    async with serving(server) as api:
        events, failure = await collect_until_failure(api)
    assert [e.resource_version for e in events] == ["101"]
    assert isinstance(failure, FrameDecodeError)


async def test_frame_without_metadata_is_unreadable() -> None:
    server = Apiserver(watches=[stream(frame("ADDED", {"kind": "Pod", "spec": {}}))])
    async with serving(server) as api:
        with pytest.raises(FrameDecodeError) as err:
            await collect(api)
    assert (err.value.name, err.value.resource_version) == (None, None)
    assert "metadata" in err.value.reason


async def test_pod_missing_a_required_field_names_pod_and_cursor() -> None:
    broken = realistic_pod("broken", resource_version="105")
    del broken["metadata"]["name"]
    broken["metadata"]["labels"] = ["not", "a", "map"]
    server = Apiserver(watches=[stream(frame("MODIFIED", broken))])
    async with serving(server) as api:
        with pytest.raises(FrameDecodeError) as err:
            await collect(api)
    assert (err.value.resource_version, err.value.event_type) == ("105", "MODIFIED")
    assert "name" in err.value.reason
    assert "labels" in err.value.reason


async def test_two_megabyte_pod_arrives_whole() -> None:
    big = frame("ADDED", realistic_pod("big", resource_version="101", padding=2 * 2**20))
    halves = (big[: len(big) // 2], big[len(big) // 2 :])
    server = Apiserver(watches=[stream(*halves)])
    async with serving(server) as api:
        (event,) = await collect(api)
    assert event.pod is not None
    assert len(event.pod.metadata.annotations["miles.io/padding"]) == 2 * 2**20


async def collect_until_failure(
    api: KubernetesAsyncioPodApi, *, timeout_seconds: int = 0
) -> tuple[list[PodWatchEvent], BaseException | None]:
    """The events a watch yielded before it ended, and the exception it ended with, if any."""
    events: list[PodWatchEvent] = []
    try:
        async for event in api.stream_pods(
            namespace="ns",
            label_selector="",
            resource_version="100",
            timeout_seconds=timeout_seconds,
        ):
            events.append(event)
    except Exception as err:
        return events, err
    return events, None


def broken_chunk(*frames: bytes, close: bool) -> Handler:
    """Writes ``frames`` as proper chunks, then a chunk whose size line promises more bytes than
    follow; then closes the socket, or (``close=False``) holds it open and silent, as a proxy or a
    peer gone without a FIN does."""
    return chunks_then_raw(*frames, raw=b'ffff\r\n{"type":"ADDED","obj', close=close)


def chunks_then_raw(*frames: bytes, raw: bytes, close: bool, half: bytes = b"") -> Handler:
    """Writes ``frames`` and then ``half`` as proper chunks (``half`` in a read of its own), then
    ``raw`` as it is; then closes the socket, or (``close=False``) holds it open and silent."""

    async def respond(request: web.Request) -> web.StreamResponse:
        resp = await chunked_response(request)
        for data in frames:
            await resp.write(data)
        if half:
            await resp.write(half)
            await asyncio.sleep(0.05)
        transport = request.transport
        assert transport is not None
        transport.write(raw)
        await asyncio.sleep(0.05 if close else 3600.0)
        transport.close()
        return resp

    return respond


ONE_FRAME = frame("ADDED", realistic_pod("a", resource_version="101"))


async def _failure_after_one_frame(
    watch: Handler, *, timeout_seconds: int = 0, **timeouts: Any
) -> KubernetesConnectionError:
    """The error a watch served by ``watch`` (which writes ``ONE_FRAME`` first) ends with,
    having checked that it ends, with that one frame yielded and a ``KubernetesConnectionError``."""
    async with serving(Apiserver(watches=[watch]), **timeouts) as api:
        watching = collect_until_failure(api, timeout_seconds=timeout_seconds)
        events, failure = (await _ended(watching)).result()
    assert [e.resource_version for e in events] == ["101"]
    assert isinstance(failure, KubernetesConnectionError)
    return failure


async def test_connection_that_stalls_mid_line_is_ended_by_the_client_deadline() -> None:
    """Guard: ``timeout_seconds`` + margin bounds every watch, so a half-open socket ends."""
    watch = stream(ONE_FRAME, ONE_FRAME[:100], 3600.0)
    failure = await _failure_after_one_frame(watch, watch_read_margin=0.3)
    assert "client deadline" in str(failure)


async def test_silent_watch_ends_at_the_read_idle_deadline_whatever_its_timeout() -> None:
    """Row "read-idle deadline": a watch asked for 300 s that goes silent after one frame ends
    ``watch_idle_timeout`` later, long before its ``timeout_seconds`` + margin."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    failure = await _failure_after_one_frame(
        stream(ONE_FRAME, 3600.0),
        timeout_seconds=300,
        watch_idle_timeout=0.3,
        watch_read_margin=60.0,
    )
    lasted = loop.time() - started
    assert failure.idle
    assert lasted < 10.0


async def test_idle_deadline_restarts_with_every_chunk() -> None:
    """The deadline is for silence, not for the whole watch: frames 0.2 s apart under a 0.3 s
    deadline all arrive, and the watch ends when the server ends it."""
    lines = [
        frame("ADDED", realistic_pod(f"p{i}", resource_version=str(101 + i))) for i in range(4)
    ]
    server = Apiserver(watches=[stream(lines[0], 0.2, lines[1], 0.2, lines[2], 0.2, lines[3])])
    async with serving(server, watch_idle_timeout=0.3) as api:
        events, failure = await collect_until_failure(api, timeout_seconds=300)
    assert [e.resource_version for e in events] == ["101", "102", "103", "104"]
    assert failure is None


class ParkingClock(FakeClock):
    """A ``FakeClock`` that says when something parks on it again."""

    def __init__(self) -> None:
        super().__init__()
        self.parked = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.parked.set()
        await super().sleep(seconds)

    async def parks(self) -> None:
        """Real time until the next sleeper parks (a probe's answer has arrived)."""
        async with asyncio.timeout(_HANG_GUARD_SECONDS):
            await self.parked.wait()
        self.parked.clear()


async def test_a_silent_watch_the_apiserver_had_an_event_for_ends_stalled() -> None:
    """Row "HTTP/2 health check": a watch silent for 30 s (a ``FakeClock``) after the frame at
    resourceVersion 101 is probed by a second watch from 101 (``timeoutSeconds=1``, bookmarks,
    the same selector); the probe delivers event 102, the watch still nothing 2 s later: it ends
    ``stalled``, after the frame it delivered, naming the server and both resourceVersions."""
    clock = ParkingClock()
    first = frame("ADDED", realistic_pod("a", resource_version="101"))
    missed = frame("MODIFIED", realistic_pod("a", resource_version="102"))
    server = Apiserver(watches=[stream(first, 3600.0), stream(missed)])
    async with serving(server, watch_read_margin=60.0, clock=clock) as api:
        watch = asyncio.ensure_future(collect_until_failure(api, timeout_seconds=300))
        await clock.parks()
        await clock.advance(30.0)
        await clock.parks()
        assert not watch.done()
        await clock.advance(2.0)
        events, failure = (await _ended(watch)).result()
    assert [e.resource_version for e in events] == ["101"]
    assert isinstance(failure, KubernetesConnectionError)
    assert failure.kind is ConnectionFailure.STALLED
    assert "resourceVersion=102 after resourceVersion=101" in str(failure)
    assert str(failure.server).startswith("127.0.0.1:")
    probe = server.requests[1].query
    assert (probe["watch"], probe["allowWatchBookmarks"], probe["labelSelector"]) == (
        "True",
    ) * 2 + ("",)
    assert (probe["resourceVersion"], probe["timeoutSeconds"]) == ("101", "1")


@pytest.mark.parametrize(
    "answer",
    [stream(bookmark("150")), body(pod_bytes(status(410, "Expired")), code=410)],
    ids=["nothing but a bookmark", "410 Expired"],
)
async def test_a_silent_watch_whose_probe_sees_no_event_is_kept(answer: Handler) -> None:
    """The probe finds no event (a bookmark only), or cannot tell (410): the watch is kept."""
    clock = ParkingClock()
    first = frame("ADDED", realistic_pod("a", resource_version="101"))
    server = Apiserver(watches=[stream(first, 3600.0), answer])
    async with serving(server, watch_read_margin=60.0, clock=clock) as api:
        watch = asyncio.ensure_future(collect_until_failure(api, timeout_seconds=300))
        await clock.parks()
        await clock.advance(30.0)
        await clock.parks()
        await clock.advance(2.0)
        assert not watch.done()
        watch.cancel()
    assert len(server.requests) == 2


async def _streaming_list(
    api: KubernetesAsyncioPodApi,
) -> tuple[list[str | None], Exception | None]:
    seen: list[str | None] = []
    try:
        async for event in api.stream_pod_list(
            namespace="ns", label_selector="", timeout_seconds=300
        ):
            seen.append(event.resource_version)
    except Exception as err:
        return seen, err
    return seen, None


def _initial_events_then_their_end() -> tuple[bytes, bytes]:
    """A streaming list's three ADDED frames at resourceVersion 7, and its initial-events-end
    bookmark at 8."""
    added = b"".join(frame("ADDED", realistic_pod(f"p{i}", resource_version="7")) for i in range(3))
    end = frame(
        "BOOKMARK",
        {
            "metadata": {
                "resourceVersion": "8",
                "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
            }
        },
    )
    return added, end


@pytest.mark.parametrize("ended", [True, False], ids=["initial events ended", "still listing"])
async def test_a_streaming_list_is_probed_only_from_its_initial_events_end(ended: bool) -> None:
    """A streaming list's initial events carry no cursor: silent before its initial-events-end
    bookmark, it is not probed and ends at the 90 s read-idle backstop; silent after it, it is
    probed from the bookmark's resourceVersion at 30 s and kept."""
    clock = ParkingClock()
    added, end = _initial_events_then_their_end()
    opened = stream(added + end if ended else added, 3600.0)
    server = Apiserver(watches=[opened, stream(bookmark("9"))])
    async with serving(server, watch_read_margin=60.0, clock=clock) as api:
        watch = asyncio.ensure_future(_streaming_list(api))
        await clock.parks()
        await clock.advance(30.0)
        if ended:
            await clock.parks()
        await clock.advance(60.0)
        done = watch.done()
        watch.cancel()
        seen, failure = await watch if done else ([], None)
    assert {r.query.get("resourceVersion") for r in server.requests[1:]} == (
        {"8"} if ended else set()
    )
    assert done is not ended
    if not ended:
        assert seen == ["7", "7", "7"]
        assert isinstance(failure, KubernetesConnectionError)
        assert failure.idle


def test_the_old_constructor_keywords_still_build_the_transport() -> None:
    """A public API is a promise: the keywords from before the probe, ``watch_idle_timeout`` as a
    number among them, are accepted; ``watch_probe_after`` is checked like the others, and
    ``None`` or 0 switch the probe off."""
    old = KubernetesAsyncioPodApi(
        core_v1_api=object(),
        connect_timeout=5.0,
        list_read_timeout=30.0,
        watch_read_margin=5.0,
        watch_idle_timeout=45.0,
    )
    assert isinstance(old, KubernetesAsyncioPodApi)
    for off in (None, 0):
        KubernetesAsyncioPodApi(core_v1_api=object(), watch_probe_after=off)
    for bad in ("30", float("nan"), True):
        with pytest.raises(ValueError, match="watch_probe_after"):
            KubernetesAsyncioPodApi(core_v1_api=object(), watch_probe_after=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="watch_idle_timeout"):
        KubernetesAsyncioPodApi(core_v1_api=object(), watch_idle_timeout=-1.0)


@pytest.mark.parametrize("close", [True, False], ids=["then closed", "then silent"])
async def test_broken_chunk_mid_watch_ends_within_the_idle_deadline(close: bool) -> None:
    """A chunk whose size line lies: if the socket then closes, aiohttp reports the short body;
    if it stays open and silent, aiohttp's body reader waits for the promised bytes forever, and
    the read-idle deadline ends the watch. Either way the frames that arrived whole stand and the
    watch ends with a ``KubernetesConnectionError``, long before ``timeout_seconds``."""
    failure = await _failure_after_one_frame(
        broken_chunk(ONE_FRAME, close=close),
        timeout_seconds=300,
        watch_idle_timeout=0.5,
        watch_read_margin=60.0,
    )
    assert failure.idle is not close


def malformed_chunk(*frames: bytes, breakage: bytes) -> Handler:
    """Writes ``frames`` as proper chunks, then half of one more as a proper chunk, then, in a
    later write, ``breakage`` (bytes that are no chunked framing); then holds the socket open
    and silent, as the HTTP fault proxy's ``CorruptChunk`` does."""
    return chunks_then_raw(*frames, half=b'{"type":"ADDED","obj', raw=breakage, close=False)


_MALFORMED = {
    "chunk-size-not-hex": b"zz-not-a-chunk-size\r\n",
    "chunk-data-past-its-size": b"2\r\n{}-and-more\r\n",
}


@pytest.fixture(params=["c", "python"], ids=["llhttp", "pure-python"])
def response_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """aiohttp's response parser for the test: its C one (llhttp) or its pure-Python one, which
    ``AIOHTTP_NO_EXTENSIONS`` selects (``client_proto`` reads the name when a request starts)."""
    if request.param == "python":
        from aiohttp import client_proto, http_parser

        monkeypatch.setattr(client_proto, "HttpResponseParser", http_parser.HttpResponseParserPy)
    return str(request.param)


@pytest.mark.parametrize("breakage", _MALFORMED.values(), ids=_MALFORMED.keys())
async def test_a_malformed_chunk_ends_the_watch_at_once(
    breakage: bytes, response_parser: str
) -> None:
    """llhttp drops a body whose chunked framing breaks without telling its reader,
    which used to wait out the read-idle deadline (here 60 s). The watch now ends as aiohttp
    closes the connection, with a ``KubernetesConnectionError`` naming the broken chunk (not
    ``idle``), after the frames that arrived whole; the pure-Python parser's own error (which it
    raises untranslated for a bad size line) reads the same."""
    failure = await _failure_after_one_frame(
        malformed_chunk(ONE_FRAME, breakage=breakage),
        timeout_seconds=300,
        watch_idle_timeout=60.0,
        watch_read_margin=60.0,
    )
    assert "chunk" in str(failure).lower()
    assert not failure.idle
    assert not failure.refused


@pytest.mark.parametrize("breakage", _MALFORMED.values(), ids=_MALFORMED.keys())
async def test_a_malformed_chunk_fails_the_list_at_once(
    breakage: bytes, response_parser: str
) -> None:
    """The same on a LIST, whose ``sock_read`` deadline (here 60 s) aiohttp drops with the body:
    it used to wait for ever."""
    server = Apiserver(lists=[malformed_chunk(breakage=breakage)])
    async with serving(server, list_read_timeout=60.0) as api:
        listing = await _ended(api.list_pods(namespace="ns", label_selector=""))
    with pytest.raises(KubernetesConnectionError, match=r"(?i)chunk") as err:
        listing.result()
    assert not err.value.refused


async def test_connection_closed_mid_frame_ends_the_stream_with_a_connection_error() -> None:
    """The frames before the cut stand; the cut itself is a ``KubernetesConnectionError`` (never
    an aiohttp exception), which the reflector reads as a broken connection and re-watches."""
    failure = await _failure_after_one_frame(stream(ONE_FRAME, ONE_FRAME[:100], cut=True))
    assert not failure.refused


async def test_connection_refused_is_a_connection_error_that_keeps_the_cursor() -> None:
    """Row ``isWatchErrorRetriable``: a refused connection is translated at the transport into
    ``KubernetesConnectionError(refused=True)``, which ``exception_keeps_cursor`` accepts."""
    config = Configuration(host="http://127.0.0.1:1")
    async with ApiClient(configuration=config) as client:
        api = KubernetesAsyncioPodApi(core_v1_api=CoreV1Api(client))
        events, failure = await collect_until_failure(api)
        with pytest.raises(KubernetesConnectionError) as on_list:
            await api.list_pods(namespace="ns", label_selector="")
    assert events == []
    assert isinstance(failure, KubernetesConnectionError)
    assert failure.refused
    assert on_list.value.refused
    assert exception_keeps_cursor(failure)
    assert not exception_rejects_cursor(failure)


async def test_retry_after_of_a_429_is_carried_on_the_error() -> None:
    async def throttled(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=pod_bytes(status(429, "TooManyRequests")),
            status=429,
            content_type="application/json",
            headers={"Retry-After": "5"},
        )

    server = Apiserver(watches=[throttled])
    async with serving(server) as api:
        _, failure = await collect_until_failure(api)
    assert isinstance(failure, KubernetesApiError)
    assert (failure.code, failure.retry_after) == (429, 5.0)
    assert exception_keeps_cursor(failure)


def _retrying_reflector(api: KubernetesPodApi, label_selector: str = "") -> KubernetesReflector:
    return KubernetesReflector(
        kube_client=api,
        namespace="ns",
        label_selector=label_selector,
        retry_delay=0.01,
        clock=RealClock(),
    )


async def _next_events(
    source: AsyncIterator[SourceEvent], count: int, *, each_within: float
) -> list[SourceEvent]:
    return [await asyncio.wait_for(anext(source), each_within) for _ in range(count)]


async def test_reflector_end_to_end_never_logs_the_bearer_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rows: TLS and credentials stay the kubeconfig's; no log line at any level holds the token."""
    server = Apiserver(
        lists=[
            body(pod_bytes(status(500, "InternalError")), 500),
            body(list_body([realistic_pod("a")], "100")),
            body(list_body([realistic_pod("b")], "200")),
            body(list_body([realistic_pod("d")], "300")),
        ],
        watches=[
            stream(frame("ADDED", realistic_pod("c", resource_version="101")), b"garbage\n"),
            stream(frame("ERROR", status(410, "Expired"))),
        ],
    )
    with caplog.at_level(logging.DEBUG):
        async with serving(server) as api:
            source = _retrying_reflector(api).watch()
            events = await _next_events(source, 4, each_within=2.0)
            await source.aclose()  # type: ignore[attr-defined]
            connector = api._core.api_client.rest_client.pool_manager.connector
            tls: ssl.SSLContext = connector._ssl
    assert [type(e) for e in events] == [ReplaceEvent, UpsertEvent, ReplaceEvent, ReplaceEvent]
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in server.requests)
    assert tls.verify_mode == ssl.CERT_REQUIRED
    assert tls.check_hostname
    assert caplog.records, "the failures above must have been logged"
    assert TOKEN not in caplog.text
    assert all(TOKEN not in json.dumps(r.__dict__, default=str) for r in caplog.records)


async def _ended(work: Awaitable[_T]) -> asyncio.Future[_T]:
    """``work`` once it has ended; a hang guard far beyond the read timeouts under test."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait([task], timeout=_HANG_GUARD_SECONDS)
    if not done:
        task.cancel()
        pytest.fail(f"still running after {_HANG_GUARD_SECONDS}s: the read timeout did not end it")
    return task


_T = TypeVar("_T")
_HANG_GUARD_SECONDS = 20.0


class WatchPodApi:
    """A contract-minimal ``KubernetesPodApi`` written the way a ``kubernetes_asyncio`` user
    would: its own models for the LIST, its own ``Watch`` for the stream, and
    ``PodWatchEvent.from_frame`` for each frame. ``Watch`` raises ``ApiException`` for an ERROR
    frame, which the reflector reads with ``exception_rejects_cursor``."""

    def __init__(self, core: CoreV1Api) -> None:
        self._core = core

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        pods = await self._core.list_namespaced_pod(namespace, label_selector=label_selector)
        return PodListPage(
            tuple(Pod.model_validate(p) for p in pods.items), pods.metadata.resource_version
        )

    async def stream_pods(
        self, *, namespace: str, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        async with Watch() as watch:
            async for frame in watch.stream(
                self._core.list_namespaced_pod,
                namespace,
                label_selector=label_selector,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
            ):
                yield PodWatchEvent.from_frame(event_type=frame["type"], obj=frame["object"])


async def test_a_pod_api_over_kubernetes_asyncio_watch_relists_on_a_410() -> None:
    """The reflector over ``WatchPodApi`` follows a watch, meets the ERROR 410 that
    ``Watch`` raises as ``ApiException(status=410)``, relists, and watches from the new cursor."""
    server = Apiserver(
        lists=[
            body(list_body([realistic_pod("a"), realistic_pod("b")], "100")),
            body(list_body([realistic_pod("b", resource_version="150")], "200")),
        ],
        watches=[
            stream(
                frame("ADDED", realistic_pod("c", resource_version="101")),
                bookmark("102"),
                frame("ERROR", status(410, "Expired", "too old resource version: 100 (150)")),
            )
        ],
    )
    async with serving(server) as built_in:
        api = WatchPodApi(built_in._core)
        reflector = _retrying_reflector(api, label_selector="app=miles")
        source = reflector.watch()
        events = await _next_events(source, 3, each_within=5.0)
        with pytest.raises(TimeoutError):  # the next watch opens, and waits for frames
            await asyncio.wait_for(anext(source), 0.5)
        await source.aclose()  # type: ignore[attr-defined]
    first, added, relisted = events
    assert isinstance(first, ReplaceEvent)
    assert sorted(first.objects) == ["a", "b"]
    assert isinstance(added, UpsertEvent)
    assert added.key == "c"
    assert isinstance(relisted, ReplaceEvent)
    assert list(relisted.objects) == ["b"]
    watches = [r.query for r in server.requests if r.query.get("watch", "").lower() == "true"]
    assert [w["resourceVersion"] for w in watches] == ["100", "200"]
    assert reflector.source_status().relists == {"cursor expired": 1}


async def test_a_steady_watch_leaves_no_collector_tracked_object_per_event() -> None:
    """Row "What the collector costs per WATCH event": once every pod has been replaced, a WATCH
    through the whole pipeline (this API, the reflector, the loop, a reconcile that reads its
    parent) leaves no more live objects that the cyclic collector tracks than it found, cyclic
    garbage included (the collector is off meanwhile). One kept per event would be a leak that
    every young collection then walks."""
    pods, warm_up, measured = 20, 200, 4000
    frames = [
        frame("MODIFIED", realistic_pod(f"p{i % pods}", f"cell-{i % 4}", resource_version=str(i)))
        for i in range(1000, 1000 + warm_up + measured)
    ]
    go_on = asyncio.Event()

    async def respond(request: web.Request) -> web.StreamResponse:
        resp = await chunked_response(request)
        for index, line in enumerate(frames):
            if index == warm_up:
                await go_on.wait()
            await resp.write(line)
        await asyncio.Event().wait()
        return resp

    listed = [realistic_pod(f"p{i}", f"cell-{i % 4}", resource_version="999") for i in range(pods)]
    server = Apiserver(lists=[body(list_body(listed, "999"))], watches=[respond])
    seen: dict[str, asyncio.Event] = {rv: asyncio.Event() for rv in ("1199", "5199")}

    async def reconcile(parent: str) -> None:
        for member in loop.get_by_parent(parent):
            if (reached := seen.get(member.metadata.resource_version)) is not None:
                reached.set()

    async with serving(server) as api:
        reflector = KubernetesReflector(
            kube_client=api, namespace="ns", label_selector="", clock=RealClock()
        )
        loop = ReconcileLoop(
            source=reflector.watch,
            reconcile=reconcile,
            key_map=lambda pod: pod.metadata.labels["miles.io/cell"],
        )
        async with loop:
            await asyncio.wait_for(seen["1199"].wait(), 5.0)
            gc.collect()
            gc.disable()
            try:
                before = len(gc.get_objects())
                go_on.set()
                await asyncio.wait_for(seen["5199"].wait(), 10.0)
                grown = len(gc.get_objects()) - before
            finally:
                gc.enable()
    # Not zero: the events of the last read, superseded copies of pods included, are alive until
    # the next read, which brings up to some twenty frames here (-656 to +1,000 objects measured).
    assert grown < measured / 2, f"{grown} tracked objects more after {measured} events"


async def test_a_steady_watch_of_many_frames_to_a_read_starts_no_young_collection() -> None:
    """Row "What the collector costs per WATCH event", over a socket: MODIFIED frames forty to a
    write, each pod replacing its copy in a dict as a store does, with the collector on. Decoded a
    read ahead, a read's pods (47 tracked objects each) pushed the collector's count past its
    threshold before any old copy was freed: 52 young collections (measured with that decode).
    Decoded as they are taken, the count falls back after every event; what still comes (16) is the
    drift of the client stack's own allocations."""
    pods, per_read, reads = 200, 40, 100
    store: dict[str, Pod | None] = {
        f"p{i}": decode_watch_line(frame("ADDED", realistic_pod(f"p{i}", resource_version="9"))).pod
        for i in range(pods)
    }
    chunks = [
        b"".join(
            frame("MODIFIED", realistic_pod(f"p{n % pods}", resource_version=str(1000 + n)))
            for n in range(read * per_read, (read + 1) * per_read)
        )
        for read in range(reads)
    ]
    # The 0.5 s margin the other tests use is the whole watch's deadline here (timeout_seconds=0):
    # 4,000 frames decoded on a loaded machine outlast it, and what is measured is the collector.
    async with serving(Apiserver(watches=[stream(*chunks)]), watch_read_margin=30.0) as api:
        gc.collect()
        before = gc.get_stats()[0]["collections"]
        async for event in api.stream_pods(
            namespace="ns", label_selector="", resource_version="9", timeout_seconds=0
        ):
            assert event.pod is not None
            store[event.pod.metadata.name] = event.pod
        young = gc.get_stats()[0]["collections"] - before
    last = store["p0"]
    assert last is not None
    assert last.metadata.resource_version == str(1000 + (reads * per_read - pods))
    assert young < reads / 4, f"{young} young collections in {reads} reads"


async def test_a_streaming_lists_initial_events_decode_paused_and_the_watch_after_them_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row "What the collector costs per WATCH event": the initial events of a streaming list,
    many ADDED to a read, are decoded a read at a time with the collector paused, as a LIST page is;
    from the initial-events-end bookmark on, one line at a time with the collector left alone."""
    decoding = k8s_wire.decode_watch_line
    collector_on: list[tuple[str | None, bool]] = []

    def spied(line: bytes) -> PodWatchEvent:
        event = decoding(line)
        collector_on.append((event.resource_version, gc.isenabled()))
        return event

    monkeypatch.setattr(k8s_wire, "decode_watch_line", spied)
    added, end = _initial_events_then_their_end()
    ended = asyncio.Event()

    async def respond(request: web.Request) -> web.StreamResponse:
        resp = await chunked_response(request)
        await resp.write(added + end)
        await ended.wait()
        await resp.write(frame("MODIFIED", realistic_pod("p0", resource_version="9")))
        await resp.write_eof()
        return resp

    seen: list[str | None] = []
    async with serving(Apiserver(watches=[respond])) as api:
        async for event in api.stream_pod_list(
            namespace="ns", label_selector="", timeout_seconds=0
        ):
            seen.append(event.resource_version)
            if event.initial_events_end:
                ended.set()
    assert seen == ["7", "7", "7", "8", "9"]
    assert collector_on == [("7", False), ("7", False), ("7", False), ("8", False), ("9", True)]


def test_a_clients_failure_becomes_our_error_with_its_kind_server_and_reason() -> None:
    """Row "Transport errors": what the command needs to describe a failure travels on our own
    error, so nothing above the transport reads aiohttp's or ``kubernetes_asyncio``'s types."""
    import ssl

    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config.config_exception import ConfigException

    key = ConnectionKey("10.0.0.9", 6443, True, True, None, None, None)
    refused = as_kubernetes_error(
        aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))
    )
    assert isinstance(refused, KubernetesConnectionError)
    assert (refused.kind, refused.server, refused.reason) == (
        ConnectionFailure.REFUSED,
        "10.0.0.9:6443",
        "Connection refused",
    )
    assert refused.refused
    assert exception_keeps_cursor(refused)
    unverified = ssl.SSLCertVerificationError(1, "certificate verify failed")
    unverified.verify_message = "self-signed certificate"
    verification = as_kubernetes_error(aiohttp.ClientConnectorCertificateError(key, unverified))
    assert isinstance(verification, KubernetesConnectionError)
    assert (verification.kind, verification.reason) == (
        ConnectionFailure.TLS_VERIFICATION,
        "self-signed certificate",
    )
    handshake = as_kubernetes_error(
        aiohttp.ClientConnectorSSLError(key, ssl.SSLError(1, "wrong version number"))
    )
    assert isinstance(handshake, KubernetesConnectionError)
    assert handshake.kind is ConnectionFailure.TLS_HANDSHAKE
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = b'{"kind": "Status", "message": "no list"}'
    api_error = as_kubernetes_error(forbidden)
    assert isinstance(api_error, KubernetesApiError)
    assert (api_error.code, api_error.reason, api_error.message) == (403, "Forbidden", "no list")
    assert isinstance(as_kubernetes_error(ConfigException("bad")), KubernetesConfigError)
    assert as_kubernetes_error(ValueError("a bug")) is None
    assert as_kubernetes_error(TimeoutError()) is None


async def test_a_connection_lost_with_an_error_after_a_body_leaves_no_unretrieved_future() -> None:
    """A body read whole, then a connection lost with an error (the TLS close_notify an apiserver
    sends after data): the ``closed`` future the cut-off hook made aiohttp create is retrieved, so
    the collector logs no "Future exception was never retrieved" later."""
    from miles.utils.workers.reconcile.k8s_api import _failing_when_cut_off

    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    closed: asyncio.Future[None] = loop.create_future()
    content = SimpleNamespace(is_eof=lambda: True, exception=lambda: None)
    protocol = SimpleNamespace(closed=closed, exception=lambda: None, is_connected=lambda: True)
    resp = SimpleNamespace(content=content, connection=SimpleNamespace(protocol=protocol))
    with _failing_when_cut_off(resp):
        pass
    closed.set_exception(ConnectionError("application data after close notify"))
    await asyncio.sleep(0)
    del closed, protocol, resp
    gc.collect()
    assert unretrieved == []


def rotate(path: Path, token: str) -> None:
    """As the kubelet updates a projected volume: the new file is renamed over the old."""
    fresh = path.with_name(".token.new")
    fresh.write_text(token)
    os.replace(fresh, path)


@asynccontextmanager
async def _accepting_only_the_second_token(
    tmp_path: Path, method: str, route: str, answer: Callable[[], web.Response]
) -> AsyncIterator[tuple[Any, Path, list[str]]]:
    """An apiserver on loopback that refuses every token but ``second`` with a 401 and gives
    ``answer()`` otherwise; yields the in-cluster configuration of a service account whose token
    file reads ``first``, the account's folder and the Authorization headers seen."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("first")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if seen[-1] != "Bearer second":
            return web.json_response({"kind": "Status", "reason": "Unauthorized"}, status=401)
        return answer()

    app = web.Application()
    app.router.add_route(method, route, handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    configuration = in_cluster_configuration(environ, account)
    configuration.host = f"http://127.0.0.1:{runner.addresses[0][1]}"
    configuration.ssl_ca_cert = None
    try:
        yield configuration, account, seen
    finally:
        await runner.cleanup()


async def test_after_a_401_the_next_request_carries_the_rotated_token(tmp_path: Path) -> None:
    """The apiserver accepts only ``second``: the LIST with ``first`` is refused 401, and the
    retry, well inside the 50 s cache, carries the file's new token."""
    pods = _accepting_only_the_second_token(
        tmp_path,
        "GET",
        "/api/v1/namespaces/{namespace}/pods",
        lambda: web.Response(body=list_body([realistic_pod("a")], "7")),
    )
    async with (
        pods as (configuration, account, seen),
        ApiClient(configuration=configuration) as client,
    ):
        api = KubernetesAsyncioPodApi(core_v1_api=CoreV1Api(client))
        options = ListOptions(namespace="ns", label_selector="")
        rotate(account / "token", "second")
        with pytest.raises(KubernetesApiError) as refused:
            await api.list_pod_page(options)
        assert refused.value.code == 401
        page = await api.list_pod_page(options)
    assert [p.metadata.name for p in page.pods] == ["a"]
    assert seen == ["Bearer first", "Bearer second"]


def _the_request_shape(client: Any) -> Transport:
    """``KubernetesAsyncioTransport`` called by ``request(method, path, ...)``, its shape before
    ``Request``."""
    transport = KubernetesAsyncioTransport(api_client=client)

    class Shaped:
        async def send(self, r: Request) -> RawResponse:
            return await transport.request(
                r.method, r.path, query=r.query, body=r.body, content_type=r.content_type
            )

    return Shaped()


@pytest.mark.parametrize(
    "make",
    [
        lambda client: KubernetesAsyncioTransport(api_client=client),
        _the_request_shape,
        HttpTransport.for_api_client,
        Http2Transport.for_api_client,
    ],
    ids=["aiohttp", "aiohttp-request-shape", "http11", "http2-to-an-http-server"],
)
async def test_the_write_transport_sends_the_rotated_token_after_a_401(
    tmp_path: Path, make: Callable[[Any], Transport]
) -> None:
    """Either write transport builds its headers once per credential, yet runs the token's
    refresh hook before every request: after a 401 the next write carries the file's new token,
    and the one after it keeps it."""
    configmap = _accepting_only_the_second_token(
        tmp_path,
        "PATCH",
        "/api/v1/namespaces/{namespace}/configmaps/{name}",
        lambda: web.json_response({"kind": "ConfigMap", "metadata": {"name": "c"}}),
    )
    async with (
        configmap as (configuration, account, seen),
        ApiClient(configuration=configuration) as client,
    ):
        transport = make(client)
        statuses: list[int] = []
        for value in ("1", "2", "3"):
            response = await transport.send(
                Request(
                    method="PATCH",
                    path="/api/v1/namespaces/ns/configmaps/c",
                    query=[("fieldManager", "m")],
                    body=b'{"data":{"v":"%s"}}' % value.encode(),
                    content_type="application/merge-patch+json",
                )
            )
            statuses.append(response.status)
            if value == "1":
                rotate(account / "token", "second")
        if isinstance(transport, HttpTransport | Http2Transport):
            await transport.aclose()
    assert statuses == [401, 200, 200]
    assert seen == ["Bearer first", "Bearer second", "Bearer second"]
    assert response.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize(
    ("proxy", "environ", "picked"),
    [
        (None, {}, Http2Transport),
        ("http://proxy.invalid:3128", {}, KubernetesAsyncioTransport),
        (None, {"HTTPS_PROXY": "http://proxy.invalid:3128"}, KubernetesAsyncioTransport),
        (
            None,
            {"HTTPS_PROXY": "http://proxy.invalid:3128", "NO_PROXY": "127.0.0.1"},
            Http2Transport,
        ),
    ],
)
async def test_write_transport_is_the_http2_one_unless_a_proxy_applies(
    proxy: str | None,
    environ: dict[str, str],
    picked: type,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The HTTP/2 transport (and its HTTP/1.1 fallback) speaks to no proxy: where the
    configuration or the environment names one for the server, the write client goes through
    aiohttp's, and one line says so."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    configuration = Configuration(host="https://127.0.0.1:6443")
    configuration.proxy = proxy
    caplog.set_level(logging.INFO, logger="miles.utils.workers.reconcile.k8s_api")
    async with ApiClient(configuration=configuration) as client, write_transport(client) as chosen:
        assert type(chosen) is picked
    told = [r.getMessage() for r in caplog.records if "go through aiohttp" in r.getMessage()]
    assert len(told) == (picked is KubernetesAsyncioTransport)
    assert all("proxy.invalid" not in line for line in told)
