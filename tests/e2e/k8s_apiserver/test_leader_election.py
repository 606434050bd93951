"""Layer: real apiserver, no kubelet (the cached kube-apiserver). Two of our ``LeaderElector``s on
one coordination.k8s.io/v1 Lease, through ``KubernetesAsyncioLeaseApi``: one leads; the other takes
over at its next poll when the leader exits and releases, and only once the lease expired when the
leader is cancelled without releasing. Every assertion on the election reads the Lease back from
the apiserver. Also: what the apiserver refuses of a Lease, a Lease edited to hold values no
candidate writes, and the order of the log lines against what leadership allows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioLeaseApi
from miles.utils.workers.reconcile.leaderelection.leader_election import (
    JITTER_FACTOR,
    LeaderElector,
)
from miles.utils.workers.reconcile.leaderelection.lease_lock import (
    INT32_MAX,
    LeaseLock,
    LeaseNotFoundError,
)
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.source_event import ParentKey, ReplaceEvent, SourceEvent

pytestmark = pytest.mark.k8s_apiserver

LEASE, RENEW, RETRY = 3, 2.0, 0.5
POLL = RETRY * (1 + JITTER_FACTOR)
SLACK = 1.0
"""Scheduling and request time on a loaded two-core machine."""
NAME = "leader"


def _elector(api: Any, namespace: str, identity: str, **kwargs: Any) -> LeaderElector:
    lease_api = KubernetesAsyncioLeaseApi(coordination_v1_api=client.CoordinationV1Api(api))
    lock = LeaseLock(lease_api=lease_api, namespace=namespace, name=NAME, identity=identity)
    return LeaderElector(
        lock=lock, lease_duration=LEASE, renew_deadline=RENEW, retry_period=RETRY, **kwargs
    )


@asynccontextmanager
async def _coordination(factory: ApiClientFactory) -> AsyncIterator[Any]:
    async with factory("cached") as api:
        yield client.CoordinationV1Api(api)


async def _spec(coordination: Any, namespace: str) -> dict[str, Any]:
    lease = await coordination.read_namespaced_lease(NAME, namespace)
    return dict(lease.spec.to_dict())


async def _eventually(
    condition: Callable[[], Awaitable[bool] | bool], within: float, what: str
) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        result = condition()
        if result if isinstance(result, bool) else await result:
            return loop.time() - start
        if loop.time() - start > within:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(0.05)


async def test_the_leader_s_release_hands_over_at_the_next_poll(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    namespace = k8s_namespace
    async with (
        k8s_api_client("cached") as api_a,
        k8s_api_client("cached") as api_b,
        _coordination(k8s_api_client) as coordination,
    ):
        a = _elector(api_a, namespace, "a")
        async with a:
            await asyncio.wait_for(a.wait_until_leading(), 10)
            async with _elector(api_b, namespace, "b") as b:
                await _eventually(lambda: b.leader == "a", 5, "b sees a lead")
                await asyncio.sleep(LEASE + 1)
                spec = await _spec(coordination, namespace)
                assert spec["holder_identity"] == "a"
                assert not b.is_leader()
                assert spec["lease_duration_seconds"] == LEASE
                transitions = spec["lease_transitions"]
                await a.__aexit__(None, None, None)
                released = await _spec(coordination, namespace)
                assert released["holder_identity"] in ("", "b")
                if released["holder_identity"] == "":
                    assert released["lease_duration_seconds"] == 1
                    assert released["lease_transitions"] == transitions
                took = await _eventually(b.is_leader, POLL + SLACK, "b takes the released lease")
                spec = await _spec(coordination, namespace)
                assert spec["holder_identity"] == "b"
                assert spec["lease_transitions"] == transitions + 1
                assert took < LEASE, "a release is taken without waiting for expiry"


async def test_a_leader_gone_without_release_is_replaced_only_after_expiry(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """The Lease's own times say when: b's acquireTime is at least leaseDurationSeconds after a's
    last renewTime (b started its acquire after it saw that renewal, and waited the lease out from
    then), and at most two polls later."""
    namespace = k8s_namespace
    async with (
        k8s_api_client("cached") as api_a,
        k8s_api_client("cached") as api_b,
        _coordination(k8s_api_client) as coordination,
    ):
        a = _elector(api_a, namespace, "a", release_on_cancel=False)
        async with a:
            await asyncio.wait_for(a.wait_until_leading(), 10)
            async with _elector(api_b, namespace, "b") as b:
                await _eventually(lambda: b.leader == "a", 5, "b sees a lead")
                await a.__aexit__(None, None, None)
                last = await _spec(coordination, namespace)
                assert last["holder_identity"] == "a"
                await _eventually(b.is_leader, LEASE + 2 * POLL + SLACK, "b takes over")
                spec = await _spec(coordination, namespace)
        assert spec["holder_identity"] == "b"
        assert spec["lease_transitions"] == last["lease_transitions"] + 1
        waited = spec["acquire_time"] - last["renew_time"]
        assert waited >= timedelta(seconds=LEASE), waited
        assert waited <= timedelta(seconds=LEASE + 2 * POLL + SLACK), waited


@pytest.mark.parametrize(
    ("field", "value"),
    [("leaseDurationSeconds", 0), ("leaseDurationSeconds", -5), ("leaseTransitions", -1)],
)
async def test_the_apiserver_refuses_a_lease_no_candidate_could_read(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, field: str, value: int
) -> None:
    """What a Lease can hold: a duration of zero or less and negative transitions are refused
    (422), so only fakes send them; the elector reads them anyway (fast tests)."""
    async with _coordination(k8s_api_client) as coordination:
        body = {
            "metadata": {"name": NAME},
            "spec": {"holderIdentity": "ghost", field: value},
        }
        with pytest.raises(ApiException) as refused:
            await coordination.create_namespaced_lease(k8s_namespace, body)
        assert refused.value.status == 422


async def test_a_lease_edited_to_odd_values_is_taken_after_expiry_never_before(
    k8s_api_client: ApiClientFactory, k8s_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A foreign holder that never renews, a renewTime of year 0 (Go's MicroTime takes it, Python
    cannot hold it) and transitions at the int32 limit: one log line, taken after the lease
    expired, and the write keeps the transitions inside int32 where Go's would overflow."""
    caplog.set_level(logging.WARNING)
    async with (
        k8s_api_client("cached") as api,
        _coordination(k8s_api_client) as coordination,
    ):
        body = {
            "metadata": {"name": NAME},
            "spec": {
                "holderIdentity": "ghost",
                "leaseDurationSeconds": LEASE,
                "renewTime": "0000-01-01T00:00:00.000000Z",
                "leaseTransitions": INT32_MAX,
            },
        }
        # kubernetes_asyncio's own models cannot read the answer back: year 0 is no datetime.
        created = await coordination.create_namespaced_lease(
            k8s_namespace, body, _preload_content=False
        )
        assert created.status == 201
        created.release()
        async with _elector(api, k8s_namespace, "b") as b:
            took = await _eventually(b.is_leader, LEASE + 2 * POLL + SLACK, "b takes over")
            assert took >= LEASE
            spec = await _spec(coordination, k8s_namespace)
            assert spec["holder_identity"] == "b"
            assert spec["lease_transitions"] == INT32_MAX
    lines = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(lines) == 1
    assert "spec.renewTime" in lines[0]


async def test_the_lease_api_speaks_404_and_409(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseConflictError

    async with k8s_api_client("cached") as api:
        lease_api = KubernetesAsyncioLeaseApi(coordination_v1_api=client.CoordinationV1Api(api))
        with pytest.raises(LeaseNotFoundError):
            await lease_api.get_lease(namespace=k8s_namespace, name=NAME)
        lease = {"metadata": {"name": NAME}, "spec": {"holderIdentity": "a"}}
        created = await lease_api.create_lease(namespace=k8s_namespace, lease=lease)
        with pytest.raises(LeaseConflictError):
            await lease_api.create_lease(namespace=k8s_namespace, lease=lease)
        newer = await lease_api.replace_lease(
            namespace=k8s_namespace, name=NAME, lease={**created, "spec": {"holderIdentity": "b"}}
        )
        assert newer["spec"]["holderIdentity"] == "b"
        with pytest.raises(LeaseConflictError):
            await lease_api.replace_lease(namespace=k8s_namespace, name=NAME, lease=created)
        read = await lease_api.get_lease(namespace=k8s_namespace, name=NAME)
        assert read["metadata"]["resourceVersion"] == newer["metadata"]["resourceVersion"]


async def test_the_log_says_leadership_began_before_the_first_reconcile_and_ended_before_it_stopped(
    k8s_api_client: ApiClientFactory, k8s_namespace: str
) -> None:
    """A leadership-gated loop started with its elector, as ``pod_counter --leader-elect`` does:
    in one timeline, "successfully acquired lease" comes before ``is_leader()`` first reads true
    (an observer reads it on every turn of the event loop) and before the first reconcile; on
    leaving, "stopped leading" comes before it reads false, and "released lease" after."""
    entries: list[str] = []

    class Timeline(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            entries.append(f"log: {record.getMessage()}")

    async def listing() -> AsyncIterator[SourceEvent]:
        yield ReplaceEvent({"p-0": "cell-0"})
        await asyncio.Event().wait()

    async def reconcile(parent: ParentKey) -> None:
        entries.append("reconcile")

    async def observe(elector: LeaderElector) -> None:
        seen = None
        while True:
            if elector.is_leader() != seen:
                seen = elector.is_leader()
                entries.append(f"leading: {seen}")
            await asyncio.sleep(0)

    logger = logging.getLogger(LeaderElector.__module__)
    handler, level = Timeline(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        async with k8s_api_client("cached") as api:
            elector = _elector(api, k8s_namespace, "a")
            observer = asyncio.create_task(observe(elector))
            loop = ReconcileLoop(
                source=listing, reconcile=reconcile, key_map=str, leadership=elector
            )
            async with elector, loop:
                await _eventually(lambda: "reconcile" in entries, 10, "the first reconcile")
            await asyncio.sleep(0.1)
            observer.cancel()
            await asyncio.gather(observer, return_exceptions=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

    def first(fragment: str) -> int:
        return next(i for i, entry in enumerate(entries) if fragment in entry)

    acquired, stopped = first("successfully acquired lease"), first("stopped leading lease")
    assert acquired < entries.index("leading: True") < entries.index("reconcile"), entries
    assert stopped < entries.index("leading: False", acquired) < first("released lease"), entries
