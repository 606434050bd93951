"""bench/watch_reads.py: the served LIST holds the objects its WATCH lines then modify, each line
one object a resourceVersion later, decoding as the contender decodes it. Layer: fast (no server is
started; the bodies are built here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.apiserver_objects import POOLS
from bench.objects import EnginePool
from bench.watch_reads import NAMESPACE, bodies
from miles.utils.workers.reconcile.k8s_wire import ObjectDecoder, decode_watch_line


@pytest.mark.parametrize("kind", ["pods", "pools"])
def test_the_watch_modifies_the_listed_objects_one_version_at_a_time(kind: str) -> None:
    listing, lines = bodies(kind, objects=3, events=7)
    items = json.loads(listing)["items"]
    assert [item["metadata"]["namespace"] for item in items] == [NAMESPACE] * 3
    decode: Any = (
        decode_watch_line
        if kind == "pods"
        else ObjectDecoder(EnginePool, kind=POOLS.kind).decode_watch_line
    )
    events = [decode(line.rstrip(b"\n")) for line in lines]
    assert [event.type for event in events] == ["MODIFIED"] * 7
    assert [event.resource_version for event in events] == [str(1001 + n) for n in range(7)]
    names = {item["metadata"]["name"] for item in items}
    assert {event.object.metadata.name for event in events} == names
