"""Fast layer, properties: no field but the name and the labels can make a pod unreadable
(row ``k8s_types.py`` "Lenient where Go is lenient").

Every path of real pods (the two recorded from a 1.36 apiserver in ``wire/list.json``, plus the
fakes' pods that carry every field the model reads) is fed an out-of-range or wrong-typed value, or
deleted. The pod must still come out of the LIST decoder (and so be stored), with every model field
but the one holding the path unchanged, and that field either validated or absent with one DEBUG
line naming it.
"""

from __future__ import annotations

import copy
import json
import logging
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from miles.utils.k8s_testenv.testing.k8s_fakes import (
    PARENT_LABEL,
    ContractPodApi,
    every_field_pod,
    frame,
    gated_pod,
    list_body,
    pod,
    realistic_pod,
    status,
)
from miles.utils.workers.reconcile import k8s_types
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import PodListPage
from miles.utils.workers.reconcile.k8s_wire import decode_pod_list, decode_watch_line
from miles.utils.workers.reconcile.loop import ReconcileLoop

Path_ = tuple[str | int, ...]
DELETE = object()

RECORDED = json.loads((Path(__file__).parent / "wire" / "list.json").read_bytes())["items"]
PODS: list[dict[str, Any]] = [*RECORDED, every_field_pod(), gated_pod()]
REJECTABLE = {("metadata",), ("metadata", "name"), ("metadata", "labels")}

OUT_OF_RANGE = [
    "0000-01-01T00:00:00Z",
    "10000-01-01T00:00:00Z",
    "2026-02-30T25:61:00Z",
    "",
    2**64,
    -(2**63) - 1,
    1e308,
    -0.5,
    True,
    None,
    [],
    {},
    [None],
    [{"x": [1]}],
    {"x": [1]},
    "x" * 300,
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
values = st.one_of(st.just(DELETE), st.sampled_from(OUT_OF_RANGE), json_values)


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        yield (*prefix, key)
        if isinstance(child, dict | list):
            yield from _paths(child, (*prefix, key))


PATHS = [(i, path) for i, pod in enumerate(PODS) for path in _paths(pod)]


def _field_type(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        (kept,) = [arg for arg in get_args(annotation) if arg is not type(None)]
        return kept
    return annotation


def _field_named(model: type[BaseModel], key: str | int) -> str | None:
    for name, info in model.model_fields.items():
        aliases = getattr(info.validation_alias, "choices", ())
        if key == name or key in aliases:
            return name
    return None


def _empty(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _model_unit(wire_path: Path_) -> tuple[Path_, str, Any] | None:
    """The model field holding a wire path: its path in ``model_dump()``, the name its DEBUG line
    gives, and its empty value; ``None`` when the model ignores the path. A map is one unit, a
    list item its own."""
    model: type[BaseModel] = Pod
    unit: list[str | int] = []
    at = 0
    while True:
        name = _field_named(model, wire_path[at])
        if name is None:
            return None
        unit.append(name)
        info = model.model_fields[name]
        kind = _field_type(info.annotation)
        rest = len(wire_path) - at - 1
        if get_origin(kind) is list and rest:
            (item,) = get_args(kind)
            unit.append(wire_path[at + 1])
            if rest == 1:
                return tuple(unit), f"{model.__name__}.{name}[]", item().model_dump()
            model, at = item, at + 2
        elif isinstance(kind, type) and issubclass(kind, BaseModel) and rest:
            model, at = kind, at + 1
        else:
            default = info.get_default(call_default_factory=True)
            return tuple(unit), f"{model.__name__}.{name}", _empty(default)


def _get(value: Any, path: Path_) -> Any:
    for segment in path:
        value = value[segment]
    return value


def _blanked(value: Any, path: Path_) -> Any:
    value = copy.deepcopy(value)
    _get(value, path[:-1])[path[-1]] = "<the mutated unit>"
    return value


def _mutated(pod: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    parent = _get(pod, path[:-1])
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return pod


def _check(index: int, path: Path_, value: Any, caplog: pytest.LogCaptureFixture) -> str | None:
    """Feeds one value at one path; returns the model field it landed in (``Model.field``)."""
    if value is DELETE and isinstance(path[-1], int):
        value = None  # deleting a list item shifts its neighbours; the item reads as null instead
    wire = _mutated(PODS[index], path, value)
    unit = _model_unit(path)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=k8s_types.__name__):
        page, rejects = decode_pod_list(list_body([wire], "9"))
    if unit is not None and unit[0][:2] in REJECTABLE:
        assert len(page.pods) + len(rejects) == 1
        return unit[1]
    assert rejects == [], f"{path} = {value!r} made the pod unreadable"
    (pod,) = page.pods
    assert decode_watch_line(frame("MODIFIED", wire)).pod == pod
    assert Pod.model_validate(wire) == pod
    before = Pod.model_validate(PODS[index]).model_dump()
    after = pod.model_dump()
    lines = [r for r in caplog.records if r.name == k8s_types.__name__]
    if unit is None:
        assert after == before, f"{path} is ignored by the model but changed it"
        assert lines == []
        return None
    dump_path, logged_as, empty = unit
    assert _blanked(after, dump_path) == _blanked(before, dump_path), f"{path} leaked"
    got = _get(after, dump_path)
    if empty == [] and isinstance(value, list) and len(path) == len(dump_path) and got:
        # a list fed as a whole: each bad item reads as an empty item, with its own line
        assert len(got) == len(value)
        assert len(lines) <= len(value)
        logged_as += "[]"
    else:
        assert len(lines) <= 1
        if lines or (value is DELETE and len(path) == len(dump_path)):
            assert got == empty
    for line in lines:
        assert line.levelno == logging.DEBUG
        assert f" {logged_as}: " in line.getMessage()
    return logged_as.removesuffix("[]")


def _model_fields(model: type[BaseModel]) -> Iterator[str]:
    for name, info in model.model_fields.items():
        yield f"{model.__name__}.{name}"
        kind = _field_type(info.annotation)
        kind = get_args(kind)[0] if get_origin(kind) is list else kind
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _model_fields(kind)


def test_every_path_of_real_pods_fed_a_wrong_value_leaves_the_pod_readable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every path of every pod, every canned out-of-range value; and every model field is hit."""
    hit: set[str] = set()
    for index, path in PATHS:
        for value in (*OUT_OF_RANGE[:4], 2**64, [{"x": [1]}], {"x": [1]}, DELETE):
            hit.add(_check(index, path, value, caplog) or "")
    assert set(_model_fields(Pod)) <= hit


@given(at=st.sampled_from(PATHS), value=values)
@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_any_value_at_any_path_leaves_the_pod_readable(
    at: tuple[int, Path_], value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _check(*at, value, caplog)


async def _settle(clock: FakeClock) -> None:
    for _ in range(50):
        await clock.advance(0)


async def test_a_pod_moved_by_a_frame_with_a_year_zero_time_is_not_lost() -> None:
    """The year-0 case through the reflector and the loop: the MODIFIED frame that moves a pod to
    another parent carries a condition's ``lastTransitionTime: "0000-01-01T00:00:00Z"``. It used to
    be skipped (the pod stayed under its old parent) and the relist after it left the pod out. Now
    the frame moves the pod, and the relist keeps it."""
    clock = FakeClock()
    moved = realistic_pod("a", "cell-1", resource_version="11")
    moved["status"]["conditions"][0]["lastTransitionTime"] = "0000-01-01T00:00:00Z"
    relisted, rejects = decode_pod_list(list_body([moved], "12"))
    assert rejects == []
    api = ContractPodApi(
        lists=[PodListPage((pod("a", "cell-0", "10"),), "10"), relisted],
        watches=[
            [
                decode_watch_line(frame("MODIFIED", moved)),
                decode_watch_line(frame("ERROR", status(410, "Expired"))),
            ]
        ],
    )
    reflector = KubernetesReflector(
        kube_client=api, namespace="ns", label_selector="", retry_delay=1.0, clock=clock
    )
    reconciled: list[str] = []

    async def reconcile(parent: str) -> None:
        reconciled.append(parent)

    loop = ReconcileLoop(
        source=reflector.watch,
        reconcile=reconcile,
        key_map=lambda p: p.metadata.labels.get(PARENT_LABEL),
        clock=clock,
    )
    async with loop:
        await _settle(clock)
        assert [p.metadata.resource_version for p in loop.get_by_parent("cell-1")] == ["11"]
        assert loop.get_by_parent("cell-0") == []
        assert len(api.list_calls) == 1
        await clock.advance(5.0)
        await _settle(clock)
        assert len(api.list_calls) == 2, "the 410 relisted"
        (stored,) = loop.get_by_parent("cell-1")
        assert stored is relisted.pods[0]
        assert stored.status.conditions[0].last_transition_time is None
        assert loop.parent_keys() == {"cell-1"}
        assert "cell-0" in reconciled
