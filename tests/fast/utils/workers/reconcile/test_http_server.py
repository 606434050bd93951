"""Fast layer: ``manager/http_server.py`` and ``manager/metrics_server.py`` rows, over a real
socket on 127.0.0.1: bad requests answered with a status code and no traceback, ``/metrics`` from a
registry."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.manager.http_server import (
    MAX_REQUEST_HEAD,
    HttpServer,
    Request,
    Response,
    parse_address,
    text,
)
from miles.utils.workers.reconcile.manager.metrics_server import metrics_server
from tests.fast.utils.workers.reconcile.fakes import FakeSource, Pod, Recorder, parent_of, replace
from tests.fast.utils.workers.reconcile.http_probe import exchange, get


async def _echo(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    return text(200, f"{request.path} {sorted(request.query.items())}")


def _server() -> HttpServer:
    return HttpServer(_echo, host="127.0.0.1", port=0, name="test")


async def test_get_is_answered_with_length_and_close() -> None:
    async with _server() as server:
        answer = await get(server.port, "/a%20b?x=1&flag")
    assert answer.status == 200
    assert answer.body == "/a b [('flag', ['']), ('x', ['1'])]"
    assert answer.headers["content-length"] == str(len(answer.body))
    assert answer.headers["connection"] == "close"


async def test_head_has_the_headers_and_no_body() -> None:
    async with _server() as server:
        answer = await get(server.port, "/x", method="HEAD")
    assert answer.status == 200
    assert answer.body == ""
    assert int(answer.headers["content-length"]) > 0


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /x HTTP/1.1\r\n\r\n", 405),
        (b"garbage\r\n\r\n", 400),
        (b"GET x HTTP/1.1\r\n\r\n", 400),
        (b"GET /x SPDY/3\r\n\r\n", 400),
        (b"GET /" + b"a" * MAX_REQUEST_HEAD + b" HTTP/1.1\r\n\r\n", 431),
    ],
)
async def test_a_bad_request_gets_a_status_and_no_traceback(
    raw: bytes, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with _server() as server:
        answer = await exchange(server.port, raw)
        assert (await get(server.port, "/still")).status == 200
    assert answer.status == status
    assert all(record.exc_info is None for record in caplog.records)
    if status == 405:
        assert answer.headers["allow"] == "GET, HEAD"


async def test_a_client_that_hangs_up_early_leaves_the_server_serving() -> None:
    async with _server() as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /x HTT")
        writer.close()
        await writer.wait_closed()
        assert (await get(server.port, "/x")).status == 200


async def test_a_handler_that_raises_gets_a_500_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _server() as server:
        answer = await get(server.port, "/boom")
    assert (answer.status, answer.body) == (500, "internal server error\n")
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "handler bug" in record.getMessage()


async def test_a_port_taken_is_one_oserror_naming_the_server() -> None:
    async with _server() as first:
        taken = HttpServer(_echo, host="127.0.0.1", port=first.port, name="health probe")
        with pytest.raises(OSError, match=r"health probe server cannot listen on 127.0.0.1:\d+"):
            await taken.__aenter__()


def test_go_bind_addresses() -> None:
    assert parse_address(":8080") == (None, 8080)
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:9") == ("::1", 9)
    assert parse_address("0") is None
    assert parse_address("") is None
    for bad in ("8080", "host:http", ":70000"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)


async def test_metrics_are_the_registry_in_the_text_format() -> None:
    registry = CollectorRegistry()
    source = FakeSource()
    source.push(replace(Pod("p", "a")))
    loop = ReconcileLoop(
        source=source,
        reconcile=Recorder(),
        key_map=parent_of,
        clock=FakeClock(),
        name="pods",
        metrics=registry,
    )
    async with loop, metrics_server("127.0.0.1", 0, registry) as server:
        answer = await get(server.port, "/metrics")
        missing = await get(server.port, "/metric")
        open_metrics = await get(
            server.port, "/metrics", Accept="application/openmetrics-text; version=1.0.0"
        )
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'controller_runtime_reconcile_total{controller="pods",result="success"}' in answer.body
    assert missing.status == 404
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.body.endswith("# EOF\n")
