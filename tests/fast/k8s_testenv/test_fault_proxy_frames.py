"""The HTTP fault proxy's choice of client and frame (`Match.user_agent`, a fault's `pod`), its
two frame rewrites, and the differential report of a client-go that kept a ghost. No cluster."""

from __future__ import annotations

import json

import pytest

from miles.utils.k8s_testenv.http_fault_proxy import (
    PODS,
    Match,
    RequestHead,
    cut_in_name,
    frame_about,
    without_name,
)
from miles.utils.k8s_testenv.testing.differential.scenario import FaultKind
from miles.utils.k8s_testenv.testing.differential.stats import Convergence, Stats

FRAME = (
    json.dumps(
        {
            "type": "MODIFIED",
            "object": {
                "kind": "Pod",
                "metadata": {"name": "p-00001", "namespace": "ns", "resourceVersion": "7"},
                "spec": {"containers": [{"name": "main"}]},
            },
        },
        separators=(",", ":"),
    ).encode()
    + b"\n"
)


def _watch(user_agent: str) -> RequestHead:
    return RequestHead(
        method="GET",
        target="/api/v1/namespaces/ns/pods?watch=true",
        headers={"user-agent": user_agent},
    )


def test_a_match_picks_one_client_by_how_its_user_agent_begins() -> None:
    oracle = Match(watch=True, path=PODS, user_agent="oracle/")
    assert oracle(_watch("oracle/v0.0.0 (linux/amd64) kubernetes/$Format"))
    assert not oracle(_watch("OpenAPI-Generator/35.0.0/python"))
    assert Match(watch=True, path=PODS)(_watch(""))


def test_a_frame_is_about_the_pod_its_object_names() -> None:
    assert frame_about(FRAME, "p-00001")
    assert not frame_about(FRAME, "main")
    assert not frame_about(b'{"type":"BOOKMARK","object":{"metadata":{}}}\n', "p-00001")
    assert not frame_about(b"not json", "p-00001")


def test_without_name_takes_out_the_name_alone() -> None:
    rewritten = json.loads(without_name(FRAME))
    original = json.loads(FRAME)
    del original["object"]["metadata"]["name"]
    assert rewritten == original


def test_cut_in_name_leaves_a_line_no_json_reader_can_read() -> None:
    cut = cut_in_name(FRAME)
    assert cut.endswith(b'"metadata":{"name":"p\n')
    with pytest.raises(json.JSONDecodeError, match="control character"):
        json.loads(cut)


def test_the_report_says_client_go_never_converged_and_why_apart_from_divergences() -> None:
    stats = Stats()
    fault = FaultKind.FRAME_WITHOUT_NAME
    stats.convergence[fault] = [
        Convergence(ours=0.8, client_go=None, reconciled=0.9, client_go_diverged="a ghost")
    ]
    stats.client_go_diverged[fault] += 1
    report = stats.report()
    assert "divergences: 0" in report
    row = next(line for line in report.splitlines() if line.strip().startswith(fault.value))
    assert "0.80 / 0.80" in row
    assert "never x1" in row
    assert f"client-go did not converge after {fault.value} 1 time(s)" in report
