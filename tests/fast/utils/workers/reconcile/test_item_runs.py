"""Fast layer: a long list document validated a run of items at a time (``item_runs``) reads as
the same object as the document validated whole, for any document, and is cut where the
apiserver's and kubectl's prints separate their items (row "A long list document validated in
runs" in docs/reconcile-loop.md)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from miles.utils.k8s_testenv.testing.k8s_fakes import list_body, realistic_pod
from miles.utils.workers.reconcile import item_runs, k8s_types, managed_fields
from miles.utils.workers.reconcile.k8s_types import EventList, PodList

TRICKY = [
    "},{",
    '},{"kind"',
    '"items":[',
    "]",
    "[",
    "}",
    "{",
    '"',
    "\\",
    ",",
    ":",
    "\n",
    "é",
    "\x7f",
]
strings = st.one_of(st.sampled_from(TRICKY), st.text(alphabet='ab{}[],:"\\ \n', max_size=6))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | strings,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.one_of(strings, st.sampled_from(["kind", "items"])), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def items(draw: st.DrawFn) -> Any:
    """A pod, an event, an item of either with a field of arbitrary JSON, or arbitrary JSON."""
    kind = draw(st.sampled_from(["Pod", "Pod", "Pod", "Event", None, 5]))
    item: dict[str, Any] = {"metadata": {"name": draw(strings)}}
    if draw(st.booleans()):
        item["metadata"]["managedFields"] = draw(st.lists(json_values, max_size=2))
    if kind is not None:
        item = {"kind": kind} | item
    for key in draw(
        st.lists(st.sampled_from(["status", "spec", "kind", "items", "x"]), max_size=2)
    ):
        item[key] = draw(json_values)
    odd = draw(st.sampled_from(["none", "other", "object", "object", "object", "object"]))
    return {"none": None, "other": draw(json_values)}.get(odd, item)


def _text(value: Any, indent: int | None) -> str:
    compact = (",", ":") if indent is None else None
    return json.dumps(value, indent=indent, separators=compact, ensure_ascii=False)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """A list document as text: its top-level keys in any order, duplicates and extra arrays of
    item-like objects included, printed compact or indented."""
    indent = draw(st.sampled_from([None, 0, 1, 4]))
    listed = draw(st.lists(items(), min_size=2, max_size=8))
    pairs: list[tuple[str, Any]] = [("items", listed)]
    for key in draw(st.lists(st.sampled_from(["kind", "metadata", "items", "extra"]), max_size=3)):
        pairs.append((key, draw(st.one_of(json_values, st.lists(items(), max_size=3)))))
    order = draw(st.permutations(pairs))
    gap = "\n" + " " * (indent or 0) if indent is not None else ""
    inner = ("," + gap).join(f"{_text(k, None)}: {_text(v, indent)}" for k, v in order)
    return ("{" + gap + inner + gap[:1] + "}").encode()


def _read_whole(model: type[PodList] | type[EventList], document: bytes) -> Any:
    """What ``model_validate_json`` reads of a document too short to be read in runs."""
    try:
        return model.model_validate_json(document)
    except ValidationError:
        return ValidationError


def _read_in_runs(model: type[PodList] | type[EventList], document: bytes, run_bytes: int) -> Any:
    """The document read in runs of ``run_bytes``, checked against ``_read_whole``; ``None``
    where it is not read in runs."""
    read = model._validated_in_runs(document, run_bytes=run_bytes)
    if read is not None:
        _same(read, _read_whole(model, document))
    return read


def _same(read: Any, whole: Any) -> None:
    if isinstance(whole, type):
        assert read is whole
        return
    assert read == whole
    assert (read.item_kinds, read.skipped) == (whole.item_kinds, whole.skipped)
    assert read.model_fields_set == whole.model_fields_set


@given(documents(), st.integers(min_value=1, max_value=60), st.sampled_from([PodList, EventList]))
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_document_read_in_runs_is_the_document_read_whole(
    document: bytes, run_bytes: int, model: type[PodList] | type[EventList]
) -> None:
    """Whatever the document: a string holding the separators, an ``items`` key nested before the
    top-level one or repeated after it, another array after the items, items that are not
    objects."""
    read = _read_in_runs(model, document, run_bytes)
    event(f"cut: {item_runs._split(document, run_bytes) is not None}, read: {read is not None}")


def _kubectl_print(pods: list[dict[str, Any]]) -> bytes:
    printed = [{"apiVersion": "v1", "kind": "Pod"} | pod for pod in pods]
    return json.dumps({"apiVersion": "v1", "items": printed, "kind": "List"}, indent=4).encode()


PODS = [realistic_pod(f"engine-{i}", f"cell-{i % 3}") for i in range(12)]
PRINTS = {
    "LIST body": list_body([{k: v for k, v in p.items() if k != "kind"} for p in PODS], "9"),
    "kubectl print": _kubectl_print(PODS),
}


@pytest.mark.parametrize("document", PRINTS.values(), ids=PRINTS.keys())
def test_both_printers_documents_are_cut_between_their_items(document: bytes) -> None:
    split = item_runs._split(document, 4000)
    assert split is not None
    _, spans = split
    assert 4 <= len(spans) <= 12
    runs = [json.loads(b"[" + document[start:end] + b"]") for start, end in spans]
    assert [pod["metadata"]["name"] for run in runs for pod in run] == [
        pod["metadata"]["name"] for pod in PODS
    ]
    assert _read_in_runs(PodList, document, 4000) is not None


def test_a_long_document_is_read_in_runs_through_the_public_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bool] = []
    validate = item_runs.validated_in_runs

    def spy(*args: Any, **kwargs: Any) -> Any:
        result = validate(*args, **kwargs)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(k8s_types, "validated_in_runs", spy)
    many = list_body([realistic_pod(f"engine-{i}", f"cell-{i % 10}") for i in range(400)], "9")
    pods = PodList.model_validate_json(many)
    assert calls == [True]
    assert [p.metadata.name for p in pods.items] == [f"engine-{i}" for i in range(400)]
    assert pods.items == PodList.__pydantic_validator__.validate_json(many).items


def test_managed_fields_only_past_the_first_runs_are_read_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first two runs decide whether runs are cut of managed fields (a kubectl print has none):
    a document whose later items carry them is read as whole, only without the saving."""
    edits: list[Any] = []
    validate = item_runs.validated_in_runs

    def spy(*args: Any, **kwargs: Any) -> Any:
        edits.append(kwargs["kept"])
        return validate(*args, **kwargs)

    monkeypatch.setattr(k8s_types, "validated_in_runs", spy)
    pods = [realistic_pod(f"engine-{i}", f"cell-{i % 3}") for i in range(24)]
    for pod in pods[:20]:
        del pod["metadata"]["managedFields"]
    document = list_body(pods, "9")
    assert b'"managedFields"' in document[-len(document) // 8 :]
    assert _read_in_runs(PodList, document, 3000) is not None
    assert edits == [item_runs.kept_whole]
    edits.clear()
    assert _read_in_runs(PodList, list_body(pods[::-1], "9"), 3000) is not None
    assert edits == [managed_fields.kept_spans]


def test_items_left_out_across_runs_are_named_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    printed = json.loads(PRINTS["kubectl print"])
    printed["items"][1] = None
    printed["items"][7]["kind"] = "Event"
    printed["items"][10]["metadata"].pop("name")
    document = json.dumps(printed, indent=4).encode()
    with caplog.at_level(logging.WARNING, logger=k8s_types.__name__):
        pods = PodList._validated_in_runs(document, run_bytes=4000)
    assert pods is not None
    assert [s.index for s in pods.skipped] == [1, 7, 10]
    assert len(pods.items) == 9
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("k8s_types: PodList: 3 of 12 items skipped: items[1] (no name): null")
    _same(pods, _read_whole(PodList, document))


@pytest.mark.parametrize(
    "document",
    [
        b'{"metadata": {"items": [{"kind": "Pod"}, {"kind": "Pod"}]}, "items": []}',
        b'{"items": [{"kind": "Pod"}, {"kind": "Pod"}], "items": []}',
        b'{"items": [{"kind": "Pod"}], "more": [{"kind": "Pod"}, {"kind": "Pod"}]}',
        b'{"items": [{"kind": "Pod", "x": [{"kind": "Pod"}, {"kind": "Pod"}]}]}',
        b'{"items": [{"kind": "Pod"}], "\x7f": [{"kind": "Pod"}, {"kind": "Pod"}]}',
        b'{"items": [{"kind": "Pod"}], "\\u007F": [{"kind": "Pod"}, {"kind": "Pod"}]}',
    ],
    ids=[
        "nested items first",
        "items repeated",
        "another array after",
        "separator inside",
        "the run key after",
        "the run key escaped after",
    ],
)
def test_a_document_whose_bytes_mislead_the_cut_is_read_whole(document: bytes) -> None:
    """Each holds the first item's opening where no two top-level items meet: the cut is refused
    or a run does not parse, and the document reads as pydantic reads it whole."""
    assert _read_in_runs(PodList, document, 1) is None


def test_a_run_holds_its_one_key_only() -> None:
    """What keeps a run from closing the array early: any other key is refused."""
    run = k8s_types._RUN_MODELS[PodList]
    assert run.model_validate_json(bytearray(b'{"\x7f": [null]}')).items != []
    with pytest.raises(ValidationError, match="extra_forbidden"):
        run.model_validate_json(bytearray(b'{"\x7f": [], "items": []}'))


@given(
    st.lists(
        st.one_of(st.sampled_from([b',"managedFields":[', b"]", b"x", b'"']), st.binary(max_size=4))
    )
)
def test_managed_fields_kept_run_by_run_are_the_whole_cut(chunks: list[bytes]) -> None:
    """``kept_spans`` keeps what ``without_managed_fields`` keeps, or says it cannot tell."""
    data = b"".join(chunks)
    spans = managed_fields.kept_spans(data, 0, len(data))
    if spans is not None:
        assert b"".join(data[a:b] for a, b in spans) == managed_fields.without_managed_fields(data)
    else:
        assert data.rfind(b"]") < data.rfind(b',"managedFields":[')


@given(documents())
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_items_cut_one_by_one_are_the_documents_items_when_each_reads_as_one_value(
    document: bytes,
) -> None:
    """``item_spans``' proof: where the skeleton and every span read as one JSON value, the spans
    are the top-level items, whatever strings, nested lists or repeated openings they hold."""
    split = item_runs.item_spans(document)
    if split is None:
        event("not cut")
        return
    skeleton, spans = split
    try:
        items = [json.loads(document[start:end]) for start, end in spans]
        json.loads(skeleton)
    except ValueError:
        event("a span is not one value")
        return
    event(f"cut into {len(spans)}")
    assert items == json.loads(document)["items"]


@pytest.mark.parametrize("document", PRINTS.values(), ids=PRINTS.keys())
def test_both_printers_documents_are_cut_at_every_item(document: bytes) -> None:
    split = item_runs.item_spans(document)
    assert split is not None
    _, spans = split
    assert [json.loads(document[start:end])["metadata"]["name"] for start, end in spans] == [
        pod["metadata"]["name"] for pod in PODS
    ]
