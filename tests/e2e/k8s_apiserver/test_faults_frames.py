"""Layer: real apiserver (the cached kube-apiserver), no kubelet; the loop's clients go through an
`HttpFaultProxy` that rewrites one watch frame on its way. The pod is written for real
and moves from cell a to cell b; the proxy rewrites the MODIFIED frame that says so. A frame that
cannot be read or keyed (no name, a label that is not a string, cut JSON, bytes that are not a
frame) ends the watch, and the relist one backoff step later brings the pod correct; a frame whose
field values are odd but readable moves the pod at once, with no relist.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from miles.utils.k8s_testenv.http_fault_proxy import WATCH, RewriteFrame
from tests.e2e.k8s_apiserver.fault_harness import faulted_cells
from tests.e2e.k8s_apiserver.harness import CELL_LABEL

pytestmark = [pytest.mark.k8s_apiserver, pytest.mark.usefixtures("behind_the_fault_proxy")]

RETRY = 0.5
"""`retry_delay`: the first backoff step lies in [0.5, 1.0) s."""
LIST_SLACK = 2.0
"""What a relist and the loop's apply may take on top of the step, on two shared cores."""


def _edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def rewrite(chunk: bytes) -> bytes:
        frame = json.loads(chunk)
        edit(frame["object"])
        return json.dumps(frame, separators=(",", ":")).encode() + b"\n"

    return rewrite


def _no_name(pod: dict[str, Any]) -> None:
    del pod["metadata"]["name"]


def _bad_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"][CELL_LABEL] = 7


def _odd_values(pod: dict[str, Any]) -> None:
    pod["metadata"]["creationTimestamp"] = "0000-01-01T00:00:00Z"
    pod["status"]["phase"] = "Exploded"


UNREADABLE = {
    "no name": _edited(_no_name),
    "bad label": _edited(_bad_label),
    "cut JSON": lambda chunk: chunk[: len(chunk) // 2] + b"\n",
    "not a frame": lambda chunk: b"\x00\x17not a watch frame\n",
}


async def _move_under_a_rewrite(
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    rewrite: Callable[[bytes], bytes],
    what: str,
) -> tuple[float, int]:
    """Moves a-0 to cell b with `rewrite` applied to the frame that says so; returns the seconds
    until the store equals a fresh LIST and how many LISTs that took beyond the first."""
    async with faulted_cells(kubeconfig, namespace, tmp_path, retry_delay=RETRY) as faulted:
        await faulted.seed("a", "a-0", "a-1")
        await faulted.store_equals_list(within=5.0, what="before the fault")
        lists = len(faulted.cells.api.lists)
        fault = faulted.proxy.add(WATCH, RewriteFrame(rewrite, what), count=1)
        moved = time.monotonic()
        await faulted.move("a-0", cell="b")
        await faulted.store_equals_list(within=2 * RETRY + LIST_SLACK, what=what)
        took = time.monotonic() - moved
        assert fault.applied == 1, f"the proxy never met the frame to rewrite ({what})"
        [pod] = faulted.cells.loop.get_by_parent("b")
        assert pod.metadata.name == "a-0"
        return took, len(faulted.cells.api.lists) - lists


@pytest.mark.parametrize("what", UNREADABLE)
async def test_an_unreadable_frame_relists_and_the_pod_is_correct_within_one_backoff_step(
    what: str,
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It used to be skipped (or, cut or not a frame, relisted) with the store keeping
    a-0 under a until something else relisted. One ERROR line names the frame; one relist."""
    with caplog.at_level(logging.ERROR, logger="miles.utils.workers.reconcile.k8s_reflector"):
        took, relists = await _move_under_a_rewrite(
            cached_kubeconfig, k8s_namespace, tmp_path, UNREADABLE[what], what
        )
    print(f"{what}: the store equalled a fresh LIST {took:.2f}s after the write")
    assert relists == 1
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and "frame unreadable" in r.getMessage()
    ]
    assert len(lines) == 1, lines
    assert "pod watch frame unreadable after resourceVersion=" in lines[0]
    if what != "not a frame":
        assert "type=MODIFIED resourceVersion=" in lines[0]
    assert "relisting by LIST (frame unreadable) in " in lines[0]


async def test_a_frame_with_odd_field_values_moves_the_pod_at_once(
    cached_kubeconfig: Path, k8s_namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The lenient side: a year-0 creationTimestamp and an unknown phase read as
    absent or as they are; the frame moves the pod, no relist, no error line."""
    with caplog.at_level(logging.ERROR):
        took, relists = await _move_under_a_rewrite(
            cached_kubeconfig, k8s_namespace, tmp_path, _edited(_odd_values), "odd values"
        )
    print(f"odd values: the store equalled a fresh LIST {took:.2f}s after the write")
    assert relists == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
