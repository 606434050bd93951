"""Layer: real apiserver (the cached kube-apiserver), no kubelet; the loop's clients go through an
`HttpFaultProxy`. A timestamp the apiserver accepts and the old model rejected: the pod
is written for real, not forged by the proxy, since the apiserver accepts it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles.utils.k8s_testenv.http_fault_proxy import WATCH, Respond
from tests.e2e.k8s_apiserver.fault_harness import MERGE_PATCH, faulted_cells, raw_json
from tests.e2e.k8s_apiserver.harness import eventually

pytestmark = [pytest.mark.k8s_apiserver, pytest.mark.usefixtures("behind_the_fault_proxy")]

OUT_OF_RANGE_TIME = "0000-01-01T00:00:00Z"


async def test_a_timestamp_the_apiserver_accepts_keeps_the_pod_under_its_parent_across_a_relist(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path
) -> None:
    """A condition's `lastTransitionTime` of year 0, which the apiserver accepts (Go's
    `time.Time` holds it) and Python's `datetime` cannot. The pod then moves to cell b: the
    MODIFIED frame must move it (today it is skipped and the pod stays under a), and a relist
    must keep it (today the LIST leaves it out: the pod is lost). The unreadable time becomes
    absent. Bound: 5 s after each write and after the relist."""
    async with faulted_cells(cached_kubeconfig, k8s_namespace, tmp_path) as faulted:
        await faulted.seed("a", "a-0", "a-1")
        stamp = {"type": "miles.test/Stamp", "status": "True"}
        stamp |= {"lastTransitionTime": OUT_OF_RANGE_TIME, "lastProbeTime": OUT_OF_RANGE_TIME}
        await raw_json(
            faulted.direct.patch_namespaced_pod_status(
                "a-0",
                k8s_namespace,
                {"status": {"conditions": [stamp]}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )
        stored = await raw_json(
            faulted.direct.read_namespaced_pod("a-0", k8s_namespace, _preload_content=False)
        )
        assert OUT_OF_RANGE_TIME in json.dumps(stored["status"]["conditions"])
        await faulted.move("a-0", cell="b")
        await faulted.store_equals_list(within=5.0, what="a pod with a year-0 time moved to b")
        lists = len(faulted.cells.api.lists)
        faulted.proxy.add(WATCH, Respond(410, in_band=True), count=1)
        await faulted.proxy.cut()
        await eventually(
            lambda: len(faulted.cells.api.lists) > lists,
            what="the relist after the 410",
            within=15.0,
            context=faulted.cells.api.describe,
        )
        await faulted.cells.converge("b", {"a-0"}, within=10.0)
        await faulted.store_equals_list(within=5.0, what="the relist after a 410")
        [pod] = faulted.cells.loop.get_by_parent("b")
    [condition] = [c for c in pod.status.conditions if c.type == "miles.test/Stamp"]
    assert condition.last_transition_time is None
