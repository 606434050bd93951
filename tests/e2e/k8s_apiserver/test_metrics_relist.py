"""Layer: real apiserver, no kubelet (the cache-less apiserver). The loop's Prometheus series
after a real 410: a cursor made stale and compacted away is rejected by the next re-watch, the
reflector relists once, and the scrape says so by controller-runtime's and the reflector's
names; ``status()`` and its text count the listings, watch events and objects by name."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from miles.utils.k8s_testenv import ApiClientFactory, LocalControlPlane
from miles.utils.workers.reconcile.cli.status_view import status_text
from tests.e2e.k8s_apiserver.harness import Cells, eventually, make_cursor_stale_then_compact

pytestmark = pytest.mark.k8s_apiserver

WATCH_TIMEOUT = 2
"""The server ends each watch this soon, so the re-watch from the compacted cursor comes at once
(the probe before it accepts any cursor the server has passed; the watch then gets the 410)."""


async def test_metrics_after_a_real_410_relist(
    k8s_api_client: ApiClientFactory, k8s_local_control_plane: LocalControlPlane, k8s_namespace: str
) -> None:
    registry = CollectorRegistry()
    plane, namespace = k8s_local_control_plane, k8s_namespace
    async with (
        k8s_api_client("cached") as other,
        Cells.on(
            k8s_api_client,
            "uncached",
            namespace=namespace,
            metrics=registry,
            watch_timeout_seconds=WATCH_TIMEOUT,
        ) as cells,
    ):
        name = cells.loop.name

        def sample(metric: str, **labels: str) -> float | None:
            return registry.get_sample_value(metric, {"name": name, **labels})

        await cells.seed("a", "a-0")
        assert sample("reflector_lists_total") == 1
        synced = cells.loop.status()
        assert (synced.listings_applied, synced.source.lists, synced.objects_stored) == (1, 1, 1)
        assert synced.watch_events_applied == synced.source.events >= 1, "a-0's ADDED"
        assert sample("reflector_relists_total", reason="cursor expired") is None
        stale = cells.api.watches[-1].last_cursor

        await make_cursor_stale_then_compact(client.CoreV1Api(other), plane, namespace, stale)

        await eventually(
            lambda: sample("reflector_relists_total", reason="cursor expired") == 1,
            what="the relist after the expired cursor, as a metric",
            context=cells.api.describe,
        )
        await cells.create("a-1", cell="a")
        await cells.converge("a", {"a-0", "a-1"})
        assert sample("reflector_lists_total") == 2
        status = cells.loop.status()
        assert (status.listings_applied, status.objects_stored) == (2, 2)
        assert status.watch_events_applied == status.source.events
        assert status.events_applied == status.listings_applied + status.watch_events_applied
        text = status_text(status)
        assert "Listings:           2 applied, 2 requested (relists: cursor expired=1)" in text
        received = status.source.events
        assert f"Watch events:       {received} received, {received} applied" in text
        assert "Objects:            2 in the store" in text
        last_rv = sample("reflector_last_resource_version")
        assert last_rv is not None
        assert last_rv >= int(cells.api.lists[1].resource_version)
        succeeded = registry.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": name, "result": "success"}
        )
        assert succeeded is not None
        assert succeeded >= 2, "a-0's and a-1's (a relist that changes nothing wakes no cell)"
        assert sample("workqueue_adds_total", controller=name) == succeeded
        print(
            f"layer k8s_apiserver, uncached apiserver: relist after a real 410 counted;"
            f" last_resource_version={last_rv:.0f}, reconciles={succeeded:.0f}"
        )
