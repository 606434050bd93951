"""``miles-reconcile status`` (``cli/status_command``): a loop synced over a fake pod API and its
snapshot."""

from __future__ import annotations

from miles.utils.workers.reconcile.cli.status_view import status_text


async def test_status_command_syncs_a_loop_and_returns_its_snapshot() -> None:
    """``miles-reconcile status``: the snapshot after the store synced."""
    from miles.utils.k8s_testenv.testing.k8s_fakes import PARENT_LABEL, FakePodApi
    from miles.utils.k8s_testenv.testing.k8s_fakes import pod as k8s_pod
    from miles.utils.workers.reconcile.cli.pool_loop import PoolOptions
    from miles.utils.workers.reconcile.cli.status_command import take_status
    from miles.utils.workers.reconcile.k8s_values import PodListPage

    page = PodListPage(pods=(k8s_pod("e-0", resource_version="10"),), resource_version="10")
    api = FakePodApi(lists=[page, page])
    options = PoolOptions(namespace="ns", selector="app=x", parent_label=PARENT_LABEL)
    status = await take_status(options, pod_api=api, drain_seconds=0.0)
    assert status.synced
    text = status_text(status)
    assert "Watch events:       0 received, 0 applied" in text, "the listing is no watch event"
    assert "Listings:           1 applied, 1 requested (relists: none)" in text
    assert "Objects:            1 in the store" in text
