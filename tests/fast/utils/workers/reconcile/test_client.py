"""Fast layer: the write client over a fake transport and a FakeClock. Which answers are sent again
and after how long (client-go's policy), the errors each answer becomes, what is refused before any
request, what goes on the wire, and retry_on_conflict's DefaultRetry."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from miles.utils.workers.reconcile.client import (
    DEFAULT_RETRY,
    Client,
    JsonPatch,
    MergePatch,
    Preconditions,
    RawResponse,
    StrategicMergePatch,
    retry_on_conflict,
)
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import (
    AlreadyExistsError,
    ConflictError,
    ConnectionFailure,
    ForbiddenError,
    InvalidError,
    KubernetesApiError,
    KubernetesConnectionError,
    NotFoundError,
    is_already_exists,
    is_conflict,
    is_forbidden,
    is_invalid,
    is_not_found,
)
from miles.utils.workers.reconcile.k8s_objects import DynamicObject
from miles.utils.workers.reconcile.resource import CONFIG_MAPS, NODES, PODS, Resource
from tests.fast.utils.workers.reconcile.fake_transport import RecordingTransport, Sent

POOLS = Resource.custom(group="miles.dev", version="v1", plural="pools", kind="Pool")


Answer = RawResponse | Exception


@dataclass
class FakeTransport(RecordingTransport):
    """Answers requests in order from `answers` (the last one repeats)."""

    answers: list[Answer]

    def answer(self, sent: Sent) -> Answer:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def ok(obj: dict[str, Any]) -> RawResponse:
    return RawResponse(200, json.dumps(obj).encode())


def status(
    code: int, reason: str, message: str = "m", *, retry_after: str | None = None, **details: Any
) -> RawResponse:
    body = {"kind": "Status", "code": code, "reason": reason, "message": message}
    if details:
        body["details"] = details
    headers = {} if retry_after is None else {"retry-after": retry_after}
    return RawResponse(code, json.dumps(body).encode(), headers)


CM: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "a", "namespace": "ns"},
}
BROKEN = KubernetesConnectionError("cut", kind=ConnectionFailure.BROKEN)


def client_of(*answers: Answer, **options: Any) -> tuple[Client, FakeTransport, FakeClock]:
    transport, clock = FakeTransport(list(answers)), FakeClock()
    return Client(transport=transport, clock=clock, **options), transport, clock


async def run_with_clock(
    clock: FakeClock, call: Any, *, step: float = 1.0, limit: int = 100
) -> Any:
    """Runs `call` to its end, moving the fake clock by `step` until it does."""
    task = asyncio.ensure_future(call)
    for _ in range(100):
        await clock.advance(0)
        if task.done():
            break
        await clock.advance(step)
    return await task


async def test_429_with_retry_after_is_retried_after_that_long() -> None:
    c, transport, clock = client_of(status(429, "TooManyRequests", retry_after="3"), ok(CM))
    task = asyncio.ensure_future(c.get(CONFIG_MAPS, "a", namespace="ns"))
    await clock.advance(2.9)
    assert len(transport.sent) == 1
    assert not task.done()
    await clock.advance(0.1)
    assert (await task)["metadata"]["name"] == "a"
    assert len(transport.sent) == 2


@pytest.mark.parametrize("code", [500, 503, 504])
async def test_5xx_is_retried_only_with_an_integer_retry_after(code: int) -> None:
    c, transport, clock = client_of(status(code, "InternalError", retry_after="1"), ok(CM))
    assert (await run_with_clock(clock, c.create(CONFIG_MAPS, CM)))["kind"] == "ConfigMap"
    assert [s.method for s in transport.sent] == ["POST", "POST"]
    for header in (None, "1.5", "Fri, 04 Dec 2026 22:00:00 GMT"):
        c, transport, clock = client_of(status(code, "InternalError", retry_after=header), ok(CM))
        with pytest.raises(KubernetesApiError) as failed:
            await run_with_clock(clock, c.create(CONFIG_MAPS, CM))
        assert failed.value.code == code
        assert len(transport.sent) == 1


async def test_retries_stop_after_ten() -> None:
    c, transport, clock = client_of(status(429, "TooManyRequests", retry_after="1"))
    with pytest.raises(KubernetesApiError) as failed:
        await run_with_clock(clock, c.get(CONFIG_MAPS, "a", namespace="ns"))
    assert failed.value.code == 429
    assert failed.value.retry_after == 1.0
    assert len(transport.sent) == 11
    assert clock.time() >= 10


async def test_a_broken_connection_is_retried_for_get_only() -> None:
    c, transport, clock = client_of(BROKEN, ok(CM))
    task = asyncio.ensure_future(c.get(CONFIG_MAPS, "a", namespace="ns"))
    await clock.advance(0.99)
    assert not task.done()
    await clock.advance(0.01)
    assert (await task)["metadata"]["name"] == "a"
    writes: list[Callable[[Client], Awaitable[object]]] = [
        lambda c: c.create(CONFIG_MAPS, CM),
        lambda c: c.patch(CONFIG_MAPS, "a", MergePatch({"data": {}}), namespace="ns"),
        lambda c: c.apply(CONFIG_MAPS, CM, field_manager="m"),
        lambda c: c.delete(CONFIG_MAPS, "a", namespace="ns"),
    ]
    for write in writes:
        c, transport, clock = client_of(BROKEN, ok(CM))
        with pytest.raises(KubernetesConnectionError):
            await run_with_clock(clock, write(c))
        assert len(transport.sent) == 1


@pytest.mark.parametrize("kind", [ConnectionFailure.REFUSED, ConnectionFailure.TIMEOUT])
async def test_a_refused_or_timed_out_get_is_the_callers_to_retry(kind: ConnectionFailure) -> None:
    c, transport, clock = client_of(KubernetesConnectionError("x", kind=kind), ok(CM))
    with pytest.raises(KubernetesConnectionError):
        await run_with_clock(clock, c.get(CONFIG_MAPS, "a", namespace="ns"))
    assert len(transport.sent) == 1


@pytest.mark.parametrize(
    ("answer", "error", "predicate"),
    [
        (status(404, "NotFound"), NotFoundError, is_not_found),
        (status(409, "AlreadyExists"), AlreadyExistsError, is_already_exists),
        (status(409, "Conflict"), ConflictError, is_conflict),
        (status(422, "Invalid"), InvalidError, is_invalid),
        (status(403, "Forbidden"), ForbiddenError, is_forbidden),
        (status(409, ""), ConflictError, is_conflict),
        (RawResponse(404, b"404 page not found"), NotFoundError, is_not_found),
    ],
)
async def test_each_answer_is_its_own_error(
    answer: RawResponse, error: type[Exception], predicate: Callable[[BaseException], bool]
) -> None:
    c, _, _ = client_of(answer)
    with pytest.raises(error) as failed:
        await c.create(CONFIG_MAPS, CM)
    assert predicate(failed.value)
    assert isinstance(failed.value, KubernetesApiError)
    others = [is_not_found, is_already_exists, is_conflict, is_invalid, is_forbidden]
    assert [p for p in others if p(failed.value)] == [predicate]


async def test_causes_and_the_failure_line(caplog: pytest.LogCaptureFixture) -> None:
    cause = {"reason": "FieldValueInvalid", "message": "bad", "field": "metadata.labels"}
    c, _, _ = client_of(status(422, "Invalid", 'Pod "p" is invalid', causes=[cause]))
    with caplog.at_level(logging.INFO), pytest.raises(InvalidError) as failed:
        await c.patch(PODS, "p", MergePatch({"metadata": {}}), namespace="ns")
    assert failed.value.causes[0].field == "metadata.labels"
    assert failed.value.causes[0].type == "FieldValueInvalid"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        'patch Pod ns/p failed: 422 Invalid: Pod "p" is invalid (metadata.labels: bad)'
    ]
    assert caplog.records[0].levelno == logging.WARNING


async def test_expected_outcomes_log_at_info(caplog: pytest.LogCaptureFixture) -> None:
    c, _, _ = client_of(status(404, "NotFound"))
    with caplog.at_level(logging.INFO), pytest.raises(NotFoundError):
        await c.get(NODES, "n1")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "get Node n1 failed: 404 NotFound: m")
    ]


class Meta(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str
    namespace: str | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    labels: dict[str, str] | None = None


class ConfigMapModel(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    api_version: str = Field(default="v1", alias="apiVersion")
    kind: str = "ConfigMap"
    metadata: Meta
    data: dict[str, str] | None = None
    binary: Any = None


async def test_a_model_is_written_by_alias_and_answered_as_its_class() -> None:
    answer = {**CM, "metadata": {**CM["metadata"], "resourceVersion": "5"}, "data": {"k": "v"}}
    c, transport, _ = client_of(ok(answer))
    made = await c.create(CONFIG_MAPS, ConfigMapModel(metadata=Meta(name="a", namespace="ns")))
    assert isinstance(made, ConfigMapModel)
    assert made.metadata.resource_version == "5"
    assert transport.sent[0].body == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a", "namespace": "ns"},
    }
    assert transport.sent[0].path == "/api/v1/namespaces/ns/configmaps"
    as_dict = await c.create(CONFIG_MAPS, CM)
    assert type(as_dict) is dict
    typed = await c.get(CONFIG_MAPS, "a", namespace="ns", into=ConfigMapModel)
    assert typed.data == {"k": "v"}


async def test_apply_sends_only_the_fields_set_with_its_manager_and_force() -> None:
    c, transport, _ = client_of(ok(CM), field_manager="default-mgr")
    obj = ConfigMapModel(metadata=Meta(name="a", namespace="ns"), data={"k": "v"})
    await c.apply(CONFIG_MAPS, obj, force=True)
    sent = transport.sent[0]
    assert sent.method == "PATCH"
    assert sent.content_type == "application/apply-patch+yaml"
    assert sent.query == [("fieldManager", "default-mgr"), ("force", "true")]
    assert sent.body == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a", "namespace": "ns"},
        "data": {"k": "v"},
    }
    await c.apply(
        PODS,
        {"metadata": {"name": "p", "namespace": "ns"}},
        field_manager="other",
        subresource="status",
    )
    assert transport.sent[1].path == "/api/v1/namespaces/ns/pods/p/status"
    assert transport.sent[1].query == [("fieldManager", "other")]


async def test_a_mapping_written_is_left_as_the_caller_gave_it() -> None:
    """The client sets ``apiVersion`` and ``kind`` on its own copy of a mapping's top level and
    encodes the body once from it; the caller's mapping and its nested values stay unchanged."""
    c, transport, _ = client_of(ok(CM), field_manager="m")
    given: dict[str, Any] = {"metadata": {"name": "a"}, "data": {"k": "v"}}
    await c.create(CONFIG_MAPS, given, namespace="ns")
    await c.apply(CONFIG_MAPS, given, namespace="ns")
    assert given == {"metadata": {"name": "a"}, "data": {"k": "v"}}
    for sent in transport.sent:
        assert sent.body == {"apiVersion": "v1", "kind": "ConfigMap", **given}
    with pytest.raises(ValueError, match=r"field data\.1"):
        await c.create(CONFIG_MAPS, {"metadata": {"name": "b"}, "data": {1: "v"}}, namespace="ns")
    with pytest.raises(ValueError, match=r"field data\.x\[1\]"):
        await c.create(CONFIG_MAPS, {"metadata": {"name": "b"}, "data": {"x": [1.0, math.nan]}})
    assert len(transport.sent) == 2


async def test_every_write_answered_with_an_object_is_observed_once_read() -> None:
    """``on_write`` hears the resourceVersion of each write's answer, whether read as a ``dict``
    or into a model, and nothing of a ``Status`` answer or a read."""
    heard: list[tuple[str, str]] = []
    answers = [
        ok({**CM, "metadata": {**CM["metadata"], "resourceVersion": str(v)}}) for v in (1, 2)
    ]
    c, _, _ = client_of(
        *answers, ok({"kind": "Status", "status": "Success"}), ok(CM),
        on_write=lambda resource, version: heard.append((resource.kind, version)),
    )  # fmt: skip
    model = ConfigMapModel(metadata=Meta(name="a", namespace="ns"))
    created = await c.create(CONFIG_MAPS, model)
    patched = await c.patch(CONFIG_MAPS, "a", MergePatch({"data": {}}), namespace="ns")
    await c.delete(CONFIG_MAPS, "a", namespace="ns")
    await c.get(CONFIG_MAPS, "a", namespace="ns")
    assert (created.metadata.resource_version, patched["metadata"]["resourceVersion"]) == ("1", "2")
    assert heard == [("ConfigMap", "1"), ("ConfigMap", "2")]


async def test_refused_before_any_request() -> None:
    c, transport, _ = client_of(ok(CM))
    with pytest.raises(ValueError, match="field manager is required"):
        await c.apply(CONFIG_MAPS, CM)
    with pytest.raises(ValueError, match="128"):
        await c.apply(CONFIG_MAPS, CM, field_manager="m" * 129)
    read_back = {**CM, "metadata": {**CM["metadata"], "managedFields": [{"manager": "x"}]}}
    with pytest.raises(ValueError, match="managedFields"):
        await c.apply(CONFIG_MAPS, read_back, field_manager="m")
    with pytest.raises(ValueError, match="strategic merge patch needs a built-in kind"):
        await c.patch(POOLS, "p", StrategicMergePatch({"spec": {}}), namespace="ns")
    with pytest.raises(ValueError, match="resourceVersion is not set"):
        await c.replace(CONFIG_MAPS, CM)
    with pytest.raises(ValueError, match="field binary"):
        await c.create(
            CONFIG_MAPS, ConfigMapModel(metadata=Meta(name="a", namespace="ns"), binary=object())
        )
    with pytest.raises(ValueError, match=r"field data\.k"):
        await c.create(CONFIG_MAPS, {**CM, "data": {"k": object()}})
    with pytest.raises(ValueError, match="namespaced"):
        await c.get(PODS, "p")
    with pytest.raises(ValueError, match="cluster-scoped"):
        await c.get(NODES, "n", namespace="ns")
    with pytest.raises(ValueError, match="'Pod'"):
        await c.create(CONFIG_MAPS, {**CM, "kind": "Pod"})
    with pytest.raises(ValueError, match="grace_period_seconds"):
        await c.delete(CONFIG_MAPS, "a", namespace="ns", grace_period_seconds=-1)
    assert transport.sent == []


async def test_strategic_merge_goes_to_a_built_in_kind() -> None:
    c, transport, _ = client_of(ok(CM))
    await c.patch(PODS, "p", StrategicMergePatch({"spec": {}}, resource_version="7"), namespace="n")
    assert transport.sent[0].content_type == "application/strategic-merge-patch+json"
    assert transport.sent[0].body == {"spec": {}, "metadata": {"resourceVersion": "7"}}


async def test_a_guarded_json_patch_whose_test_fails_is_a_conflict() -> None:
    c, transport, _ = client_of(status(422, "Invalid", "rejected"))
    patch = JsonPatch.guarded("41", [{"op": "remove", "path": "/spec/schedulingGates"}])
    with pytest.raises(ConflictError) as failed:
        await c.patch(PODS, "p", patch, namespace="ns")
    assert failed.value.code == 422
    assert "resourceVersion 41" in failed.value.message
    assert transport.sent[0].body[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "41",
    }
    cause = {"reason": "FieldValueInvalid", "message": "bad", "field": "spec"}
    c, _, _ = client_of(status(422, "Invalid", causes=[cause]))
    with pytest.raises(InvalidError):
        await c.patch(PODS, "p", patch, namespace="ns")
    c, _, _ = client_of(status(422, "Invalid"))
    with pytest.raises(InvalidError):
        await c.patch(PODS, "p", JsonPatch([{"op": "remove", "path": "/x"}]), namespace="ns")


async def test_delete_sends_its_options() -> None:
    c, transport, _ = client_of(ok({"kind": "Status", "status": "Success"}))
    await c.delete(
        PODS,
        "p",
        namespace="ns",
        preconditions=Preconditions(uid="u1", resource_version="9"),
        propagation_policy="Foreground",
        grace_period_seconds=0,
    )
    assert transport.sent[0].method == "DELETE"
    assert transport.sent[0].body == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": "u1", "resourceVersion": "9"},
        "propagationPolicy": "Foreground",
        "gracePeriodSeconds": 0,
    }


async def test_retry_on_conflict_is_default_retry() -> None:
    clock = FakeClock()
    calls: list[float] = []

    async def always_conflict() -> None:
        calls.append(clock.time())
        raise ConflictError(409, "Conflict", "stale")

    task = asyncio.ensure_future(retry_on_conflict(always_conflict, clock=clock, draw=lambda: 1.0))
    for _ in range(10):
        await clock.advance(0.011)
    with pytest.raises(ConflictError):
        await task
    assert len(calls) == DEFAULT_RETRY.steps == 5
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(calls)]
    assert gaps == [0.011] * 4


async def test_retry_on_conflict_converges_and_passes_other_errors() -> None:
    clock = FakeClock()
    attempts: list[int] = []

    async def second_time_lucky() -> str:
        attempts.append(1)
        if len(attempts) < 2:
            raise ConflictError(409, "Conflict")
        return "done"

    task = asyncio.ensure_future(retry_on_conflict(second_time_lucky, clock=clock, draw=lambda: 0))
    await clock.advance(0.010)
    assert await task == "done"

    async def not_found() -> None:
        attempts.append(1)
        raise NotFoundError(404, "NotFound")

    attempts.clear()
    with pytest.raises(NotFoundError):
        await retry_on_conflict(not_found, clock=clock)
    assert len(attempts) == 1


async def test_a_dynamic_object_is_written_by_its_wire_names_and_answered_as_one() -> None:
    read = DynamicObject.model_validate(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "5"},
            "data": {"k": "v"},
        }
    )
    answer = {**CM, "metadata": {**CM["metadata"], "resourceVersion": "6"}, "data": {"k": "w"}}
    c, transport, _ = client_of(ok(answer))
    replaced = await c.replace(CONFIG_MAPS, read)
    assert isinstance(replaced, DynamicObject)
    assert replaced["data"] == {"k": "w"}
    assert replaced.metadata.resource_version == "6"
    sent = transport.sent[0].body
    assert sent["apiVersion"] == "v1"
    assert sent["metadata"]["resourceVersion"] == "5"
    assert "resource_version" not in sent["metadata"]
    assert sent["data"] == {"k": "v"}
    desired = DynamicObject.model_validate(
        {"metadata": {"name": "a", "namespace": "ns", "labels": {"x": "y"}}, "data": {"k": "v"}}
    )
    await c.apply(CONFIG_MAPS, desired, field_manager="m")
    assert transport.sent[1].body == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a", "namespace": "ns", "labels": {"x": "y"}},
        "data": {"k": "v"},
    }
