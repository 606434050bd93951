"""Layer: real apiserver (cached), no kubelet, behind `HttpFaultProxy` where a fault is injected.
The write client under faults, through each transport (`harness.WRITE_TRANSPORTS`): a second
writer's conflicts (retry_on_conflict converges, nothing lost), a 429 with Retry-After (waited,
then sent again), a 500 with Retry-After (sent again) and a 503 without (the caller's), a
connection cut after the apiserver took the request (a GET is sent again; a create is not, and the
caller's next create by name reads AlreadyExists; a PUT is made once; an apply sent again changes
nothing) and an apiserver restart under a stream of writes (each retried by its
caller until done, none twice; not behind the proxy). Every failure is one log line naming verb,
kind, object and reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from miles.utils.k8s_testenv import LocalControlPlane
from miles.utils.k8s_testenv.http_fault_proxy import (
    CutAfterForward,
    HttpFaultProxy,
    Match,
    Respond,
)
from miles.utils.workers.reconcile.client import Client, MergePatch, retry_on_conflict
from miles.utils.workers.reconcile.k8s_errors import (
    AlreadyExistsError,
    ConflictError,
    KubernetesApiError,
    KubernetesConnectionError,
)
from miles.utils.workers.reconcile.resource import CONFIG_MAPS
from tests.e2e.k8s_apiserver.harness import writer_on

pytestmark = pytest.mark.k8s_apiserver
proxied = pytest.mark.usefixtures("behind_the_fault_proxy")

T = TypeVar("T")
CLIENT_LOGGER = "miles.utils.workers.reconcile.client.client"
CONFIG_MAPS_PATH = r"/configmaps(/[^/]+)?$"
FAILURE_LINE = re.compile(
    r"^(create|get|update|patch|apply|delete) ConfigMap t-[0-9a-f]+/[a-z0-9-]+"
    r"( failed: |: .+; retry \d+ of 10 in \d+s$)"
)


@pytest.fixture(autouse=True)
def _client_lines(caplog: pytest.LogCaptureFixture) -> None:
    """The client's INFO lines (retries, outcomes such as AlreadyExists) are captured too."""
    caplog.set_level(logging.INFO, logger=CLIENT_LOGGER)


@asynccontextmanager
async def clients(
    kubeconfig: Path, tmp_path: Path, transport: str
) -> AsyncIterator[tuple[HttpFaultProxy, Client]]:
    """The proxy in front of the apiserver and a write client through it over ``transport``."""
    async with HttpFaultProxy(kubeconfig=kubeconfig) as proxy:
        proxied = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig")
        async with writer_on(proxied, transport, field_manager="faults-e2e") as client:
            yield proxy, client


Opener = Callable[[], AbstractAsyncContextManager[tuple[HttpFaultProxy, Client]]]


@pytest.fixture
def through_the_proxy(cached_kubeconfig: Path, tmp_path: Path, write_transport_name: str) -> Opener:
    """Opens the proxy in front of the cached apiserver and this test's write client through it."""
    return partial(clients, cached_kubeconfig, tmp_path, write_transport_name)


def direct(kubeconfig: Path, transport: str) -> AbstractAsyncContextManager[Client]:
    """A second writer, straight to the apiserver."""
    return writer_on(kubeconfig, transport, field_manager="other")


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == CLIENT_LOGGER]
    assert all(FAILURE_LINE.match(line) for line in lines), lines
    return lines


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": data}


async def counter(c: Client, namespace: str) -> int:
    return int((await c.get(CONFIG_MAPS, "counter", namespace=namespace))["data"]["n"])


@proxied
async def test_a_second_writers_conflicts_are_retried_until_every_increment_lands(
    cached_kubeconfig: Path,
    tmp_path: Path,
    k8s_namespace: str,
    caplog: pytest.LogCaptureFixture,
    write_transport_name: str,
) -> None:
    conflicts = 0
    async with (
        clients(cached_kubeconfig, tmp_path, write_transport_name) as (_, ours),
        direct(cached_kubeconfig, write_transport_name) as two,
    ):
        await ours.create(CONFIG_MAPS, configmap("counter", n="0"), namespace=k8s_namespace)

        def increment(c: Client) -> Callable[[], Awaitable[dict[str, Any]]]:
            async def once() -> dict[str, Any]:
                nonlocal conflicts
                read = await c.get(CONFIG_MAPS, "counter", namespace=k8s_namespace)
                read["data"]["n"] = str(int(read["data"]["n"]) + 1)
                await asyncio.sleep(0)
                try:
                    return await c.replace(CONFIG_MAPS, read)
                except ConflictError:
                    conflicts += 1
                    raise

            return once

        # One conflict for certain: the second writer writes between our read and our write.
        read = await ours.get(CONFIG_MAPS, "counter", namespace=k8s_namespace)
        await retry_on_conflict(increment(two))
        read["data"]["n"] = "100"
        with pytest.raises(ConflictError):
            await ours.replace(CONFIG_MAPS, read)
        await retry_on_conflict(increment(ours))
        assert await counter(ours, k8s_namespace) == 2

        async def writer(c: Client) -> None:
            for _ in range(10):
                await retry_on_conflict(increment(c))

        await asyncio.gather(writer(ours), writer(two))
        assert await counter(ours, k8s_namespace) == 22
    assert conflicts >= 1
    assert failure_lines(caplog)[0].startswith(f"update ConfigMap {k8s_namespace}/counter failed: ")


@proxied
async def test_429_with_retry_after_is_waited_for_and_sent_again(
    through_the_proxy: Opener, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with through_the_proxy() as (proxy, ours):
        throttle = Respond(429, headers={"Retry-After": "1"})
        proxy.add(Match(method="POST", path=CONFIG_MAPS_PATH), throttle, count=2)
        started = time.monotonic()
        made = await ours.create(CONFIG_MAPS, configmap("throttled"), namespace=k8s_namespace)
        assert time.monotonic() - started >= 2.0
        assert made["metadata"]["name"] == "throttled"
        posts = [s.outcome for s in proxy.seen(lambda s: s.method == "POST")]
        assert posts == ["answered 429", "answered 429", "forwarded"]
    lines = failure_lines(caplog)
    assert len(lines) == 2
    assert "429 TooManyRequests" in lines[0]


@proxied
async def test_500_with_retry_after_is_sent_again_and_503_without_is_the_callers(
    through_the_proxy: Opener, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with through_the_proxy() as (proxy, ours):
        await ours.create(CONFIG_MAPS, configmap("flaky", v="0"), namespace=k8s_namespace)
        patches = Match(method="PATCH", path=CONFIG_MAPS_PATH)
        proxy.add(patches, Respond(500, headers={"Retry-After": "1"}), count=1)
        patched = await ours.patch(
            CONFIG_MAPS, "flaky", MergePatch({"data": {"v": "1"}}), namespace=k8s_namespace
        )
        assert patched["data"] == {"v": "1"}
        proxy.add(patches, Respond(503), count=1)
        with pytest.raises(KubernetesApiError) as unavailable:
            await ours.patch(
                CONFIG_MAPS, "flaky", MergePatch({"data": {"v": "2"}}), namespace=k8s_namespace
            )
        assert unavailable.value.code == 503
        outcomes = [s.outcome for s in proxy.seen(lambda s: s.method == "PATCH")]
        assert outcomes == ["answered 500", "forwarded", "answered 503"]
    assert failure_lines(caplog) == [
        f"patch ConfigMap {k8s_namespace}/flaky: 500 InternalError: "
        "injected by the HTTP fault proxy; retry 1 of 10 in 1s",
        f"patch ConfigMap {k8s_namespace}/flaky failed: 503 ServiceUnavailable: "
        "injected by the HTTP fault proxy",
    ]


@proxied
async def test_a_cut_create_is_never_sent_again_and_an_apply_sent_again_changes_nothing(
    through_the_proxy: Opener,
    k8s_namespace: str,
    caplog: pytest.LogCaptureFixture,
    write_transport_name: str,
) -> None:
    async with through_the_proxy() as (proxy, ours):
        proxy.add(Match(method="POST", path=CONFIG_MAPS_PATH), CutAfterForward(), count=1)
        with pytest.raises(KubernetesConnectionError):
            await ours.create(CONFIG_MAPS, configmap("cut", a="1"), namespace=k8s_namespace)
        assert len(proxy.seen(lambda s: s.method == "POST")) == 1
        # The caller's retry (the loop's next reconcile) reads the outcome of the first.
        with pytest.raises(AlreadyExistsError):
            await ours.create(CONFIG_MAPS, configmap("cut", a="1"), namespace=k8s_namespace)
        made = await ours.get(CONFIG_MAPS, "cut", namespace=k8s_namespace)
        assert made["data"] == {"a": "1"}

        # Both transports send a GET cut on a kept-alive connection again once themselves
        # (aiohttp: RFC 9112 9.3.1.1; ours: Go's shouldRetryRequest); the second cut, on a fresh
        # connection, reaches the client's own retry.
        proxy.add(Match(method="GET", path=CONFIG_MAPS_PATH), CutAfterForward(), count=2)
        again = await ours.get(CONFIG_MAPS, "cut", namespace=k8s_namespace)
        assert again["metadata"]["uid"] == made["metadata"]["uid"]
        assert len(proxy.seen(lambda s: s.method == "GET")) == 4

        # A replace is guarded by its resourceVersion: aiohttp resends a PUT after the cut, which
        # is answered Conflict; ours, as Go, does not resend a PUT. Either way it is made once.
        proxy.add(Match(method="PUT", path=CONFIG_MAPS_PATH), CutAfterForward(), count=1)
        resent = write_transport_name == "aiohttp"
        with pytest.raises(ConflictError if resent else KubernetesConnectionError):
            await ours.replace(CONFIG_MAPS, {**again, "data": {"a": "put"}})
        assert len(proxy.seen(lambda s: s.method == "PUT")) == (2 if resent else 1)
        put = await ours.get(CONFIG_MAPS, "cut", namespace=k8s_namespace)
        assert put["data"] == {"a": "put"}
        assert int(put["metadata"]["resourceVersion"]) > int(again["metadata"]["resourceVersion"])

        desired = {"metadata": {"name": "cut", "namespace": k8s_namespace}, "data": {"a": "2"}}
        proxy.add(Match(method="PATCH", path=CONFIG_MAPS_PATH), CutAfterForward(), count=1)
        with pytest.raises(KubernetesConnectionError):
            await ours.apply(CONFIG_MAPS, desired, field_manager="applier", force=True)
        after_cut = await ours.get(CONFIG_MAPS, "cut", namespace=k8s_namespace)
        assert after_cut["data"] == {"a": "2"}
        reapplied = await ours.apply(CONFIG_MAPS, desired, field_manager="applier", force=True)
        assert reapplied["metadata"]["resourceVersion"] == after_cut["metadata"]["resourceVersion"]
    lines = failure_lines(caplog)
    final = [re.match(r"^(\w+ ConfigMap \S+) failed: ", line) for line in lines]
    assert [m.group(1) for m in final if m] == [
        f"create ConfigMap {k8s_namespace}/cut",
        f"create ConfigMap {k8s_namespace}/cut",
        f"update ConfigMap {k8s_namespace}/cut",
        f"apply ConfigMap {k8s_namespace}/cut",
    ]
    assert "retry 1 of 10 in 1s" in next(line for line in lines if line.startswith("get "))


async def until_done(what: Callable[[], Awaitable[T]], *, within: float = 120.0) -> T:
    """The caller's retry (a reconcile retried by the loop): again after a transport failure or
    a 5xx, 0.2 s apart; an AlreadyExists is the outcome of an earlier try."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await what()
        except (KubernetesConnectionError, KubernetesApiError) as err:
            if isinstance(err, KubernetesApiError) and err.code < 500:
                raise
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def test_writes_across_an_apiserver_restart_land_once_each(
    cached_kubeconfig: Path,
    k8s_local_control_plane: LocalControlPlane,
    k8s_namespace: str,
    caplog: pytest.LogCaptureFixture,
    write_transport_name: str,
) -> None:
    async with direct(cached_kubeconfig, write_transport_name) as ours:

        async def create(name: str) -> None:
            with suppress(AlreadyExistsError):
                await ours.create(CONFIG_MAPS, configmap(name, v="1"), namespace=k8s_namespace)

        async def apply(name: str) -> dict[str, Any]:
            desired = {"metadata": {"name": name, "namespace": k8s_namespace}, "data": {"v": "2"}}
            return await ours.apply(CONFIG_MAPS, desired, field_manager="restart", force=True)

        async def writes() -> list[str]:
            names = []
            for i in range(40):
                name = f"r-{i}"
                await until_done(partial(create, name))
                await until_done(partial(apply, name))
                names.append(name)
                await asyncio.sleep(0.05)
            return names

        writing = asyncio.ensure_future(writes())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(k8s_local_control_plane.restart_apiserver, "cached")
        names = await writing
        for name in names:
            got = await ours.get(CONFIG_MAPS, name, namespace=k8s_namespace)
            assert got["data"] == {"v": "2"}
    lines = failure_lines(caplog)
    assert lines, "the restart failed no write: the test did not test it"
