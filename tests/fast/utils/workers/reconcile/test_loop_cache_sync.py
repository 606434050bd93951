"""Fast layer: ``ReconcileLoop(cache_sync_timeout=...)``, controller-runtime's ``CacheSyncTimeout``:
``start()`` fails with ``ReconcileLoopError`` naming the source's last error when the store has not
synced in time (record row ``loop.py`` "Cache sync timeout"), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_values import ListPage
from miles.utils.workers.reconcile.loop import (
    DEFAULT_CACHE_SYNC_TIMEOUT,
    ReconcileLoop,
    ReconcileLoopError,
)
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.fast.utils.workers.reconcile.test_k8s_reflector_any_kind import FakeResourceApi, obj


async def _nothing(_: ParentKey) -> None:
    return None


def _loop(api: FakeResourceApi, clock: FakeClock, **kwargs: object) -> ReconcileLoop:
    reflector = KubernetesReflector(api=api, namespace="ns", clock=clock)
    return ReconcileLoop(
        source=reflector.watch,
        reconcile=_nothing,
        clock=clock,
        **kwargs,  # type: ignore[arg-type]
    )


def _not_served(n: int) -> list[ListPage[object] | BaseException]:
    return [KubernetesApiError(404, "NotFound", "the server could not find it")] * n


async def test_a_resource_never_served_fails_start_after_the_default_two_minutes() -> None:
    clock = FakeClock()
    api = FakeResourceApi(lists=_not_served(20))  # type: ignore[arg-type]
    loop = _loop(api, clock)
    start = asyncio.create_task(loop.start())
    await clock.advance(DEFAULT_CACHE_SYNC_TIMEOUT - 1)
    assert not start.done()
    await clock.advance(1)
    with pytest.raises(ReconcileLoopError) as caught:
        await start
    message = str(caught.value)
    assert "timed out after 120s waiting for the store to sync (cache_sync_timeout)" in message
    assert 'list enginepools (group "miles.io", version v1alpha1): not served' in message
    assert "HTTP 404" in message
    assert 12 <= len(api.list_calls) <= 13, "one LIST every 10 s"


async def test_a_crd_installed_within_the_timeout_starts_the_loop() -> None:
    clock = FakeClock()
    api = FakeResourceApi(lists=[*_not_served(3), ListPage((obj("ns", "p"),), "10")])  # type: ignore[list-item]
    loop = _loop(api, clock, cache_sync_timeout=60.0)
    start = asyncio.create_task(loop.start())
    await clock.advance(30)
    await start
    assert len(api.list_calls) == 4
    assert loop.status().synced
    await loop.stop()


def test_the_timeout_is_settable_and_checked() -> None:
    async def build() -> None:
        with pytest.raises(ValueError, match="cache_sync_timeout"):
            _loop(FakeResourceApi(), FakeClock(), cache_sync_timeout=0)
        _loop(FakeResourceApi(), FakeClock(), cache_sync_timeout=None)

    asyncio.run(build())
