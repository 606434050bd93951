"""Wire decoding (``k8s_wire``), properties: no bytes make the decoders raise anything but
``FrameDecodeError``, so no frame ends the reflector's stream; a LIST decode and a read's watch
lines run with the cyclic collector paused and leave it as they found it; cutting the managed
fields never changes what a line decodes to."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    frame,
    list_body,
    realistic_pod,
    status,
)
from miles.utils.workers.reconcile import k8s_wire, managed_fields
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_values import PodListPage, PodWatchEvent
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list, decode_watch_line
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def mutated_pods(draw: st.DrawFn) -> Any:
    """A realistic pod with one field replaced by arbitrary JSON, or deleted."""
    pod = realistic_pod(draw(st.text(max_size=5)) or "p", resource_version="7")
    section = draw(st.sampled_from(["metadata", "spec", "status"]))
    keys = sorted(pod[section])
    key = draw(st.sampled_from(keys))
    if draw(st.booleans()):
        del pod[section][key]
    else:
        pod[section][key] = draw(json_values)
    return pod


watch_objects = st.one_of(
    json_values,
    mutated_pods(),
    st.builds(realistic_pod, st.text(min_size=1, max_size=5)),
    st.builds(status, st.integers(), st.text(max_size=8)),
)
watch_types = st.one_of(
    st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "added", ""]),
    json_values,
)
structured_lines = st.builds(
    lambda t, o: json.dumps({"type": t, "object": o}).encode(), watch_types, watch_objects
)
any_lines = st.one_of(st.binary(max_size=200), structured_lines, st.builds(json.dumps, json_values))


def _decode_or_documented_error(line: bytes) -> PodWatchEvent | FrameDecodeError:
    try:
        return decode_watch_line(line)
    except FrameDecodeError as err:
        return err


@given(any_lines)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_watch_line_decoder_raises_only_frame_decode_error(line: bytes) -> None:
    result = _decode_or_documented_error(line)
    if isinstance(result, PodWatchEvent):
        assert result.type in {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}
        assert (result.pod is not None) == (result.type in {"ADDED", "MODIFIED", "DELETED"})


@given(
    st.one_of(
        st.binary(max_size=200),
        st.builds(
            lambda items, rv: json.dumps(
                {"metadata": {"resourceVersion": rv}, "items": items}
            ).encode(),
            st.lists(st.one_of(json_values, mutated_pods()), max_size=3),
            json_values,
        ),
    )
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_list_decoder_raises_only_frame_decode_error(body: bytes) -> None:
    try:
        page, rejects = decode_pod_list(body)
    except FrameDecodeError:
        return
    assert all(isinstance(r, FrameDecodeError) for r in rejects)
    assert isinstance(page.resource_version, str)


LIST_BODIES = {
    "valid": list_body([realistic_pod(f"p-{i}") for i in range(3)], "7", "next"),
    "bad item": list_body([realistic_pod("a"), {"metadata": {"name": "bad"}, "spec": 1}], "7"),
    "unreadable": b"{not json",
}


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("body", LIST_BODIES.values(), ids=LIST_BODIES.keys())
def test_list_decode_pauses_the_collector_and_restores_its_state(
    enabled: bool, body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row "GC paused during a LIST decode": every validation inside ``decode_pod_list`` runs with
    the cyclic collector off, and it is left enabled or disabled as it was, whether the body
    decodes, has a bad item, or raises."""
    seen: list[bool] = []
    for model in (k8s_wire._PodList, k8s_wire._RawPodList):
        validate = model.model_validate_json

        def spy(data: bytes, _validate: Any = validate) -> Any:
            seen.append(gc.isenabled())
            return _validate(data)

        monkeypatch.setattr(model, "model_validate_json", spy)
    was_enabled = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with contextlib.suppress(FrameDecodeError):
            decode_pod_list(body)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was_enabled else gc.disable)()
    assert seen
    assert not any(seen)


class DecodingFakeApi:
    """Serves each scripted watch's raw lines through the real decoder, as the real API does."""

    def __init__(self, watches: list[list[bytes]]) -> None:
        self.watches = watches
        self.opened = 0
        self.drained = asyncio.Event()

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        return PodListPage((), "1")

    async def stream_pods(
        self, *, namespace: str, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        if not self.watches:
            self.drained.set()
            await asyncio.Event().wait()
        self.opened += 1
        for line in self.watches.pop(0):
            yield decode_watch_line(line)


@given(st.lists(st.lists(any_lines, min_size=1, max_size=4), min_size=1, max_size=4))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_reflector_never_ends_its_stream_because_of_a_frame(watches: list[list[bytes]]) -> None:
    watches = [
        [*lines, frame("ADDED", realistic_pod("sentinel", resource_version="9"))]
        for lines in watches
    ]
    asyncio.run(_drive(watches))


async def _drive(watches: list[list[bytes]]) -> None:
    api = DecodingFakeApi([list(w) for w in watches])
    clock = FakeClock()
    reflector = KubernetesReflector(
        kube_client=api, namespace="ns", label_selector="", retry_delay=1.0, clock=clock
    )
    events: list[SourceEvent] = []

    async def pump() -> None:
        async for event in reflector.watch():
            events.append(event)

    task = asyncio.create_task(pump())
    for _ in range(4 * len(watches) + 4):
        await clock.advance(60.0)  # past any backoff step (capped at 30 s, jitter 1.0)
        if api.drained.is_set():
            break
    assert api.drained.is_set(), "every scripted watch was opened"
    assert not task.done(), "watch() ended because of a frame"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert isinstance(events[0], ReplaceEvent)
    assert all(isinstance(e, ReplaceEvent | UpsertEvent | DeleteEvent) for e in events)


@pytest.mark.parametrize("enabled", [True, False])
def test_watch_lines_decode_with_the_collector_paused_up_to_the_first_bad_line(
    enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row "GC paused while a read's watch lines decode": every line of a batch validates with
    the collector off, the events before an undecodable line come back beside its error, the
    lines after it are not read, and the collector is left as it was."""
    seen: list[bool] = []
    frames = k8s_wire._FRAME

    class Spy:
        def validate_json(self, data: bytes) -> Any:
            seen.append(gc.isenabled())
            return frames.validate_json(data)

    monkeypatch.setattr(k8s_wire, "_FRAME", Spy())
    good = [frame("ADDED", realistic_pod(f"p-{i}", resource_version=str(i))) for i in (1, 2, 3)]
    batch = [good[0].strip(), good[1].strip(), b"<html>", good[2].strip()]
    was_enabled = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        events, failure = k8s_wire.decode_watch_lines(batch)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was_enabled else gc.disable)()
    assert [e.resource_version for e in events] == ["1", "2"]
    assert isinstance(failure, FrameDecodeError)
    assert len(seen) == 3
    assert not any(seen)


STEADY_PODS, STEADY_PER_READ, STEADY_READS = 200, 40, 100


def steady_watch() -> tuple[dict[str, PodWatchEvent], list[list[bytes]]]:
    """A store of 200 decoded pods, and 100 reads of 40 MODIFIED lines that replace them in turn."""
    store = {
        f"p{i}": decode_watch_line(frame("ADDED", realistic_pod(f"p{i}", resource_version="9")))
        for i in range(STEADY_PODS)
    }
    reads = [
        [
            frame("MODIFIED", realistic_pod(f"p{n % STEADY_PODS}", resource_version=str(n))).strip()
            for n in range(read * STEADY_PER_READ, (read + 1) * STEADY_PER_READ)
        ]
        for read in range(STEADY_READS)
    ]
    return store, reads


@pytest.mark.parametrize(("listing", "least", "most"), [(False, 0, 1), (True, 50, 100)])
def test_a_steady_watch_decoded_as_taken_keeps_the_collectors_count_down(
    listing: bool, least: int, most: int
) -> None:
    """Row "What the collector costs per WATCH event": 100 reads of 40 MODIFIED frames over 200
    stored pods, each event's pod replacing its old copy as a store does, with the collector on.
    Decoded as they are taken, each pod's 47 tracked objects are matched by its old copy's, freed
    before the next line decodes: no young collection. Decoded a read ahead (``listing``, the path
    of a streaming list's initial events), the count rises by 40 pods' worth before any copy is
    freed, past the threshold (700): a young collection for nearly every read (0 against 92,
    measured)."""
    store, batches = steady_watch()
    assert gc.isenabled()
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    for batch in batches:
        for event in k8s_wire.decode_watch_read(batch, listing=listing):
            assert event.pod is not None
            store[event.pod.metadata.name] = event
    young = gc.get_stats()[0]["collections"] - before
    assert least <= young <= most, f"{young} young collections in {len(batches)} reads"


def test_cyclic_garbage_made_beside_a_steady_watch_is_still_collected() -> None:
    """Row "What the collector costs per WATCH event": the watch's pods add nothing to the
    collector's count net, but they take nothing from it either, so a caller's own cyclic garbage
    still starts young collections, which free it, without anyone calling ``gc.collect``."""

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    store, batches = steady_watch()
    made: list[weakref.ref[Cycle]] = []
    assert gc.isenabled()
    gc.collect()
    for batch in batches:
        for event in k8s_wire.decode_watch_read(batch, listing=False):
            assert event.pod is not None
            store[event.pod.metadata.name] = event
            made.append(weakref.ref(Cycle()))
    alive = sum(ref() is not None for ref in made)
    # At most the cycles made since the last young collection (700 tracked objects) are left.
    assert alive < len(made) / 4, f"{alive} of {len(made)} cycles alive"


awkward_text = st.lists(
    st.sampled_from(['"', "\\", "]", "[", "}", "{", ",", ":", "a", "é", ',"managedFields":[']),
    max_size=8,
).map("".join)


@st.composite
def pods_with_awkward_strings(draw: st.DrawFn) -> Any:
    """A realistic pod whose annotation, label and managed-fields trie key hold brackets, quotes,
    backslashes and the cut's own opening; sometimes with no managed fields at all."""
    pod = realistic_pod("p", resource_version="7")
    meta = pod["metadata"]
    meta["annotations"]["miles.io/awkward"] = draw(awkward_text)
    meta["labels"]["miles.io/awkward"] = draw(awkward_text)
    entry = meta["managedFields"][0]["fieldsV1"]["f:metadata"]
    entry[f"v:{json.dumps(draw(awkward_text))}"] = {}
    if draw(st.booleans()):
        del meta["managedFields"]
    return pod


def _uncut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(managed_fields, "without_managed_fields", lambda data, **_: data)


@given(st.one_of(pods_with_awkward_strings(), mutated_pods()))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_cutting_managed_fields_never_changes_what_a_line_decodes_to(pod: Any) -> None:
    """Row "Decode only what is read": whatever a pod's strings hold, and whatever
    replaced its managed fields, its watch line decodes to what the whole line decodes to."""
    line = frame("MODIFIED", pod).strip()
    cut = _decode_or_documented_error(line)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _uncut(monkeypatch)
        whole = _decode_or_documented_error(line)
    assert repr(cut) == repr(whole)


def test_a_cut_inside_a_string_falls_back_to_the_whole_line() -> None:
    """A trie key that quotes a value holding ``]`` ends the cut inside that string; the cut data
    does not parse, and the line decodes whole."""
    pod = realistic_pod("p", resource_version="7")
    pod["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]['v:"x]y"'] = {}
    line = frame("ADDED", pod).strip()
    with pytest.raises(json.JSONDecodeError):
        json.loads(managed_fields.without_managed_fields(line))
    event = decode_watch_line(line)
    assert event.pod is not None
    assert event.pod.metadata.labels == pod["metadata"]["labels"]


def test_a_list_of_pods_with_and_without_managed_fields_decodes_as_uncut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each item of a page is cut on its own: one without managed fields, and one whose annotation
    holds the cut's opening (escaped in the JSON), leave their neighbours' cuts exact."""
    pods = [realistic_pod(f"p-{i}", resource_version=str(i)) for i in range(4)]
    del pods[1]["metadata"]["managedFields"]
    pods[2]["metadata"]["annotations"]["note"] = ',"managedFields":[]'
    body = list_body(pods, "9")
    assert managed_fields.without_managed_fields(body) != body
    cut = decode_pod_list(body)
    _uncut(monkeypatch)
    assert decode_pod_list(body) == cut
