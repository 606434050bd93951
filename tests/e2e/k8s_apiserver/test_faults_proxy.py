"""Layer: real apiserver (cached), no kubelet, no reconcile code. `HttpFaultProxy` does what its
faults say, against the real kube-apiserver: it forwards LIST and WATCH unchanged over verified
TLS; it answers a chosen status to LIST or WATCH for a count or a duration (a 429 with its
Retry-After, a 410 in-band as an ERROR event, a 410 to a paged LIST's continuation only); it cuts a
watch's chunked body mid-frame with a bad chunk-size line and keeps the connection open; it
black-holes a watch without closing it and later resets it on request; it freezes the watch open
now while new ones are served; a frame fault goes to a watch whose client is there, never to one
whose client went away. Waits are bounded reads.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import api_client
from miles.utils.k8s_testenv.http_fault_proxy import (
    LIST,
    PAGED_LIST_CONTINUATION,
    WATCH,
    BlackHole,
    CorruptChunk,
    HttpFaultProxy,
    Respond,
    RewriteFrame,
    without_name,
)
from tests.e2e.k8s_apiserver.harness import create_pod

_READ = 5.0
_QUIET = 1.5
"""How long a read must stay empty to count as "nothing more arrives"."""


@asynccontextmanager
async def _through_proxy(
    kubeconfig: Path, tmp_path: Path
) -> AsyncIterator[tuple[HttpFaultProxy, Any, Any]]:
    """The proxy, a CoreV1Api through it, and one straight to the apiserver (for writes)."""
    async with HttpFaultProxy(kubeconfig=kubeconfig) as proxy:
        proxied = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        async with api_client(proxied) as through, api_client(kubeconfig) as direct:
            yield proxy, client.CoreV1Api(through), client.CoreV1Api(direct)


async def _list(core: Any, namespace: str, **query: Any) -> tuple[int, Any, Any]:
    resp = await core.list_namespaced_pod(namespace, _preload_content=False, **query)
    try:
        return resp.status, resp.headers, json.loads(await resp.read())
    finally:
        resp.release()


async def _watch(core: Any, namespace: str, resource_version: str) -> Any:
    return await core.list_namespaced_pod(
        namespace,
        watch=True,
        resource_version=resource_version,
        timeout_seconds=30,
        _preload_content=False,
    )


async def _read_nothing_more(resp: Any) -> None:
    """The body delivers nothing for `_QUIET` seconds and has not ended."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(resp.content.readany(), _QUIET)
    assert not resp.content.at_eof()


async def test_forwards_list_and_watch_unchanged_over_verified_tls(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, direct):
        await create_pod(direct, k8s_namespace, "a-0", cell="a")
        status, _, body = await _list(core, k8s_namespace)
        assert status == 200
        assert [item["metadata"]["name"] for item in body["items"]] == ["a-0"]
        resp = await _watch(core, k8s_namespace, body["metadata"]["resourceVersion"])
        await create_pod(direct, k8s_namespace, "a-1", cell="a")
        line = await asyncio.wait_for(resp.content.readline(), _READ)
        resp.release()
    event = json.loads(line)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "a-1")
    assert proxy.url.startswith("https://127.0.0.1:")
    assert [r.outcome for r in proxy.seen()] == ["forwarded", "forwarded"]
    assert [r.is_watch for r in proxy.seen()] == [False, True]


async def test_answers_a_chosen_status_to_lists_for_a_count_and_leaves_watches_alone(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, _):
        proxy.add(LIST, Respond(500), count=2)
        answers = [(await _list(core, k8s_namespace))[0] for _ in range(3)]
        _, _, body = await _list(core, k8s_namespace)
        resp = await _watch(core, k8s_namespace, body["metadata"]["resourceVersion"])
        watch_status = resp.status
        resp.release()
    assert answers == [500, 500, 200]
    assert watch_status == 200
    assert [r.outcome for r in proxy.seen()] == [
        "answered 500",
        "answered 500",
        "forwarded",
        "forwarded",
        "forwarded",
    ]


async def test_answers_429_with_retry_after_to_watches_for_a_duration(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, _):
        _, _, body = await _list(core, k8s_namespace)
        cursor = body["metadata"]["resourceVersion"]
        fault = proxy.add(WATCH, Respond(429, headers={"Retry-After": "5"}), seconds=60)
        resp = await _watch(core, k8s_namespace, cursor)
        throttled = resp.status, resp.headers.get("Retry-After"), json.loads(await resp.read())
        resp.release()
        proxy.remove(fault)
        resp = await _watch(core, k8s_namespace, cursor)
        after = resp.status
        resp.release()
    status, retry_after, status_object = throttled
    assert (status, retry_after) == (429, "5")
    assert (status_object["kind"], status_object["code"]) == ("Status", 429)
    assert status_object["reason"] == "TooManyRequests"
    assert after == 200


async def test_answers_410_in_band_as_an_error_event_ending_the_watch(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, _):
        _, _, body = await _list(core, k8s_namespace)
        proxy.add(WATCH, Respond(410, in_band=True), count=1)
        resp = await _watch(core, k8s_namespace, body["metadata"]["resourceVersion"])
        status, lines = resp.status, (await asyncio.wait_for(resp.read(), _READ)).splitlines()
        resp.release()
    assert status == 200
    [event] = [json.loads(line) for line in lines]
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


async def test_answers_410_to_the_continuation_of_a_paged_list_only(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, direct):
        for name in ("a-0", "a-1"):
            await create_pod(direct, k8s_namespace, name, cell="a")
        proxy.add(PAGED_LIST_CONTINUATION, Respond(410))
        first_status, _, first = await _list(core, k8s_namespace, limit=1)
        token = first["metadata"]["continue"]
        second_status, _, second = await _list(core, k8s_namespace, limit=1, _continue=token)
    assert first_status == 200
    assert len(first["items"]) == 1
    assert (second_status, second["reason"]) == (410, "Expired")


@pytest.mark.xfail(
    strict=False,
    raises=RuntimeError,
    reason="the proxy's own test: under load aiohttp sometimes sees the upstream close first and "
    "reports 'Connection closed' before the corrupted chunk; the reflector-level test "
    "test_a_stalled_watch_ends_within_the_read_idle_bound[chunk-broken-mid-frame] stands",
)
async def test_corrupts_an_open_watch_mid_frame_and_keeps_the_connection_open(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """The fault is added after the watch opened: the next event arrives as half a frame, then
    a chunk-size line that is not hex, and then nothing, on a connection that stays open."""
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, direct):
        _, _, body = await _list(core, k8s_namespace)
        resp = await _watch(core, k8s_namespace, body["metadata"]["resourceVersion"])
        proxy.add(WATCH, CorruptChunk(), count=1)
        await create_pod(direct, k8s_namespace, "a-0", cell="a")
        half = await asyncio.wait_for(resp.content.readany(), _READ)
        await _read_nothing_more(resp)
        open_connections = proxy.open_connections
        resp.release()
    assert half.startswith(b'{"type":"ADDED"')
    assert not half.endswith(b"\n")
    assert open_connections >= 1  # the LIST may have left a keep-alive connection beside it
    assert proxy.seen()[-1].outcome == "response chunk corrupted"


async def test_black_holes_an_open_watch_without_closing_it_until_reset(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """A black-holed watch receives no further event and is not closed, while a new LIST on a
    new connection is answered; `reset_held()` then resets it."""
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, direct):
        _, _, body = await _list(core, k8s_namespace)
        resp = await _watch(core, k8s_namespace, body["metadata"]["resourceVersion"])
        proxy.add(WATCH, BlackHole())
        await create_pod(direct, k8s_namespace, "a-0", cell="a")
        await _read_nothing_more(resp)
        status, _, listed = await _list(core, k8s_namespace)
        reset = await proxy.reset_held()
        # aiohttp reports the reset as a broken payload, or, when it saw it first, as a closed
        # connection.
        with pytest.raises((aiohttp.ClientPayloadError, RuntimeError)):
            await asyncio.wait_for(resp.content.read(), _READ)
        resp.release()
    assert status == 200
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a-0"]
    assert reset == 1


async def test_a_watch_whose_client_went_away_takes_no_frame_fault(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """A watch whose client reset its connection stays open upstream until its next frame; that
    frame must not take the fault meant for the client's next watch (as when the differential
    restarts client-go and then breaks a frame)."""
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, direct):
        _, _, body = await _list(core, k8s_namespace)
        version = body["metadata"]["resourceVersion"]
        gone = await _watch(core, k8s_namespace, version)
        gone.connection.transport.abort()
        gone.release()
        await asyncio.sleep(0.5)
        fault = proxy.add(WATCH, RewriteFrame(without_name, "without a name"), count=1)
        live = await _watch(core, k8s_namespace, version)
        await create_pod(direct, k8s_namespace, "a-0", cell="a")
        line = await asyncio.wait_for(live.content.readline(), _READ)
        live.release()
    event = json.loads(line)
    assert event["type"] == "ADDED"
    assert "name" not in event["object"]["metadata"]
    assert fault.applied == 1


async def test_freezes_the_open_watch_while_a_new_watch_is_served(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """`freeze()` stops the watch streaming now where it is, its connection open and silent, and
    returns the time it last sent a byte; a new watch from the same resourceVersion, on another
    connection, gets the event the frozen one never receives; `reset_held()` then resets it."""
    async with _through_proxy(cached_kubeconfig, tmp_path) as (proxy, core, direct):
        _, _, body = await _list(core, k8s_namespace)
        version = body["metadata"]["resourceVersion"]
        frozen = await _watch(core, k8s_namespace, version)
        last_bytes = await proxy.freeze(WATCH)
        frozen_at = time.monotonic()
        await create_pod(direct, k8s_namespace, "a-0", cell="a")
        fresh = await _watch(core, k8s_namespace, version)
        line = await asyncio.wait_for(fresh.content.readline(), _READ)
        fresh.release()
        await _read_nothing_more(frozen)
        reset = await proxy.reset_held()
        frozen.release()
    assert len(last_bytes) == 1
    assert last_bytes[0] <= frozen_at
    assert json.loads(line)["type"] == "ADDED"
    assert reset == 1
