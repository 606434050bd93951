"""bench/apiserver_wire.py: the wire contender stamps each pod event's resourceVersion once, and
skips bookmarks and ERROR frames (a Status has no resourceVersion) without failing; its decoding
levels decode and keep as ours does. Layer: fast (no cluster; the lines are built here)."""

from __future__ import annotations

import json

import pytest

from bench.apiserver_wire import WIRE_LEVELS, WireReader


def pod_line(event_type: str, name: str, rv: int) -> bytes:
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "resourceVersion": str(rv), "labels": {"miles.io/cell": "c"}},
    }
    return json.dumps({"type": event_type, "object": pod}, separators=(",", ":")).encode()


BOOKMARK = b'{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"90"}}}'
ERROR = b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}'


@pytest.mark.parametrize("contender", list(WIRE_LEVELS))
def test_pod_events_are_stamped_and_other_frames_are_skipped(contender: str) -> None:
    reader = WireReader(None, "ns", WIRE_LEVELS[contender])
    for line in (pod_line("ADDED", "a", 7), BOOKMARK, ERROR, pod_line("MODIFIED", "a", 9)):
        reader._note(line)
    assert [rv for rv, _ in reader.applied] == [7, 9]
    assert reader.max_rv == 9


def test_keep_holds_the_last_decoded_pod_per_name_and_decode_alone_holds_none() -> None:
    kept, decoded = WireReader(None, "ns", "keep"), WireReader(None, "ns", "decode")
    for reader in (kept, decoded):
        reader._note(pod_line("ADDED", "a", 7))
        reader._note(pod_line("MODIFIED", "a", 9))
    assert {name: pod.metadata.resource_version for name, pod in kept._kept.items()} == {"a": "9"}
    assert decoded._kept == {}
