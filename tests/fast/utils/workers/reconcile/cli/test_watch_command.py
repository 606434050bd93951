"""``miles-reconcile watch`` (``cli/watch_command``) over a fake pod API: the pool drawn and marked,
JSON records following the watch, an empty selection said once, a refused LIST before the loop
starts."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import PARENT_LABEL, FakePodApi
from miles.utils.k8s_testenv.testing.k8s_fakes import pod as k8s_pod
from miles.utils.workers.reconcile.cli.failures import describe_failure
from miles.utils.workers.reconcile.cli.live_view import LiveView
from miles.utils.workers.reconcile.cli.pool_loop import (
    PoolOptions,
)
from miles.utils.workers.reconcile.cli.watch_command import watch_pool
from miles.utils.workers.reconcile.k8s_errors import (
    KubernetesApiError,
)
from miles.utils.workers.reconcile.k8s_values import PodListPage, PodWatchEvent
from tests.fast.utils.workers.reconcile.cli.view_fakes import (
    Clock,
)
from tests.fast.utils.workers.reconcile.fakes import run_until


async def _watch_until(
    api: FakePodApi, condition: Any, *, options: PoolOptions, output: str = "table"
) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    view = LiveView(stream=out, output=output, tty=False, title="t", now=Clock())  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(
        watch_pool(options, pod_api=api, view=view, stop=stop, err=err, tick=False)
    )
    await run_until(lambda: condition(out.getvalue(), err.getvalue()) or task.done())
    stop.set()
    await task
    return out.getvalue(), err.getvalue()


async def test_watch_says_once_when_the_selector_matches_nothing_and_keeps_watching() -> None:
    """An empty selection is reported on stderr, and the loop keeps running."""
    empty = PodListPage(pods=(), resource_version="5")
    api = FakePodApi(lists=[empty, empty])
    options = PoolOptions(namespace="ns", selector="app=none", parent_label=PARENT_LABEL)
    out, err = await _watch_until(api, lambda out, err: "watching" in err, options=options)
    assert err.splitlines()[0] == (
        "miles-reconcile: no pods in namespace 'ns' match selector 'app=none'; watching for them"
    )
    assert "(no pods)" in out
    assert len(api.watch_calls) == 1


async def test_watch_draws_the_pool_and_marks_a_pod_the_watch_changed() -> None:
    """The reconcile reads ``loop.get_by_parent`` and the view marks what the event changed."""
    first = k8s_pod("e-0", resource_version="10")
    page = PodListPage(pods=(first, k8s_pod("e-1", resource_version="11")), resource_version="11")
    restarted = k8s_pod("e-0", resource_version="12", restart_count=1)
    drawn = asyncio.Event()
    api = FakePodApi(
        lists=[page, page], watches=[[drawn.wait, PodWatchEvent("MODIFIED", restarted, "12")]]
    )
    options = PoolOptions(namespace="default", selector="app=x", parent_label=PARENT_LABEL)

    def marked(out: str, err: str) -> bool:
        if "cell-0" in out:
            drawn.set()
        return "* cell-0" in out

    out, err = await _watch_until(api, marked, options=options)
    first_draw, changes = out.split("* cell-0", 1)
    assert "cell-0  (2 members)" in first_draw
    assert "* " not in first_draw
    assert changes.split()[:4] == ["e-0", "1/1", "Running", "1"]
    assert err == ""


async def test_watch_jsonl_records_follow_the_watch() -> None:
    """``--output jsonl``: one object per reconcile, carrying what the store holds then."""
    page = PodListPage(pods=(k8s_pod("e-0", resource_version="10"),), resource_version="10")
    gone = k8s_pod("e-0", resource_version="13")
    synced = asyncio.Event()
    api = FakePodApi(
        lists=[page, page], watches=[[synced.wait, PodWatchEvent("DELETED", gone, "13")]]
    )
    options = PoolOptions(namespace="default", selector="app=x", parent_label=PARENT_LABEL)

    def two_records(out: str, err: str) -> bool:
        if out.count("\n") == 1:
            synced.set()
        return out.count("\n") >= 2

    out, _ = await _watch_until(api, two_records, options=options, output="jsonl")
    records = [json.loads(line) for line in out.splitlines()]
    assert [[m["resourceVersion"] for m in r["members"]] for r in records] == [["10"], []]


async def test_watch_forbidden_list_fails_before_the_loop_starts() -> None:
    api = FakePodApi(lists=[KubernetesApiError(403, "Forbidden", "pods is forbidden")])
    options = PoolOptions(namespace="ns", selector="app=x", parent_label=PARENT_LABEL)
    with pytest.raises(KubernetesApiError) as caught:
        await _watch_until(api, lambda out, err: False, options=options)
    assert describe_failure(caught.value) == "forbidden by RBAC: pods is forbidden"
    assert api.watch_calls == []
