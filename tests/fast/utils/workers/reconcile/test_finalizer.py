"""Fast layer: ``controllerutil/finalizer.py``, kube-rs' ``finalizer()`` flow against a fake
apiserver that applies JSON patches as the real one does (all or none, a failed ``test`` is 422)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from miles.utils.workers.reconcile.controllerutil import Finalizer, validate_finalizer_name
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.resource import Resource

POOLS = Resource.custom(
    group="miles.example.com", version="v1", plural="enginepools", kind="EnginePool"
)
NAME = "miles.example.com/drain"


@dataclass
class _FakeApi:
    """One object; JSON patches of ``/metadata/finalizers`` applied all or none."""

    obj: dict[str, Any]
    patches: list[list[dict[str, Any]]] = field(default_factory=list)

    async def patch(
        self, resource: Resource, name: str, patch: Any, *, namespace: str | None = None
    ) -> Any:
        assert (resource, name, namespace) == (POOLS, "pool-a", "ns")
        assert patch.content_type == "application/json-patch+json"
        ops = patch.wire()
        self.patches.append(ops)
        finalizers = copy.deepcopy(self.obj["metadata"].get("finalizers"))
        for op in ops:
            finalizers = _apply(finalizers, op)
        if finalizers:
            self.obj["metadata"]["finalizers"] = finalizers
        else:
            self.obj["metadata"].pop("finalizers", None)
        return self.obj

    def view(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)


def _apply(finalizers: list[str] | None, op: dict[str, Any]) -> list[str] | None:
    path = op["path"]
    if op["op"] == "test":
        actual = finalizers if path == "/metadata/finalizers" else _at(finalizers, path)
        if actual != op["value"]:
            raise KubernetesApiError(422, "Invalid", f"testing value {path} failed")
        return finalizers
    if op["op"] == "add" and path == "/metadata/finalizers":
        return list(op["value"])
    if op["op"] == "add" and path == "/metadata/finalizers/-":
        return [*(finalizers or []), op["value"]]
    assert op["op"] == "remove"
    index = int(path.rsplit("/", 1)[1])
    assert finalizers is not None
    return finalizers[:index] + finalizers[index + 1 :]


def _at(finalizers: list[str] | None, path: str) -> str | None:
    index = int(path.rsplit("/", 1)[1])
    return finalizers[index] if finalizers and index < len(finalizers) else None


def _pool(*finalizers: str, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "pool-a", "namespace": "ns"}
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-04T22:00:00Z"
    return {"apiVersion": "miles.example.com/v1", "kind": "EnginePool", "metadata": metadata}


@dataclass
class _Handlers:
    applied: int = 0
    cleaned: int = 0
    failing: BaseException | None = None

    async def apply(self, obj: Any) -> str:
        self.applied += 1
        return "applied"

    async def cleanup(self, obj: Any) -> str:
        self.cleaned += 1
        if self.failing is not None:
            raise self.failing
        return "cleaned"


async def test_the_finalizer_is_added_before_the_controller_acts() -> None:
    api, handlers = _FakeApi(_pool("other.example.com/keep")), _Handlers()
    finalizer = Finalizer(name=NAME, client=api, resource=POOLS)
    assert await finalizer.reconcile(api.view(), **_both(handlers)) is None
    assert handlers.applied == 0
    assert api.obj["metadata"]["finalizers"] == ["other.example.com/keep", NAME]
    assert await finalizer.reconcile(api.view(), **_both(handlers)) == "applied"
    assert (handlers.applied, handlers.cleaned, len(api.patches)) == (1, 0, 1)


async def test_an_absent_list_is_tested_as_absent() -> None:
    api = _FakeApi(_pool())
    await Finalizer(name=NAME, client=api, resource=POOLS).reconcile(
        api.view(), **_both(_Handlers())
    )
    assert api.patches == [
        [
            {"op": "test", "path": "/metadata/finalizers", "value": None},
            {"op": "add", "path": "/metadata/finalizers", "value": [NAME]},
        ]
    ]


async def test_an_empty_list_read_from_a_typed_model_is_tested_as_absent() -> None:
    """A typed model's ``finalizers`` reads ``[]`` where the apiserver sent none; a test of ``[]``
    against the absent list fails (422), so it is tested as absent."""
    api = _FakeApi(_pool())
    typed = api.view()
    typed["metadata"]["finalizers"] = []
    await Finalizer(name=NAME, client=api, resource=POOLS).reconcile(typed, **_both(_Handlers()))
    assert api.patches[0][0] == {"op": "test", "path": "/metadata/finalizers", "value": None}
    assert api.obj["metadata"]["finalizers"] == [NAME]


async def test_deletion_runs_cleanup_then_removes_only_this_finalizer() -> None:
    api, handlers = (
        _FakeApi(_pool("a.example.com/x", NAME, "b.example.com/y", deleting=True)),
        _Handlers(),
    )
    finalizer = Finalizer(name=NAME, client=api, resource=POOLS)
    assert await finalizer.reconcile(api.view(), **_both(handlers)) == "cleaned"
    assert api.obj["metadata"]["finalizers"] == ["a.example.com/x", "b.example.com/y"]
    assert await finalizer.reconcile(api.view(), **_both(handlers)) is None
    assert (handlers.applied, handlers.cleaned) == (0, 1)


async def test_a_failing_cleanup_keeps_the_finalizer_and_raises_for_the_loop_to_retry() -> None:
    api, handlers = _FakeApi(_pool(NAME, deleting=True)), _Handlers(failing=RuntimeError("drain"))
    finalizer = Finalizer(name=NAME, client=api, resource=POOLS)
    with pytest.raises(RuntimeError, match="drain"):
        await finalizer.reconcile(api.view(), **_both(handlers))
    assert api.obj["metadata"]["finalizers"] == [NAME]
    assert api.patches == []
    handlers.failing = None
    assert await finalizer.reconcile(api.view(), **_both(handlers)) == "cleaned"
    assert "finalizers" not in api.obj["metadata"]


async def test_a_list_changed_since_it_was_read_fails_the_patch_and_removes_nothing() -> None:
    api, handlers = _FakeApi(_pool("a.example.com/x", NAME, deleting=True)), _Handlers()
    stale = api.view()
    api.obj["metadata"]["finalizers"] = [NAME]  # another controller removed its own meanwhile
    with pytest.raises(KubernetesApiError) as raised:
        await Finalizer(name=NAME, client=api, resource=POOLS).reconcile(stale, **_both(handlers))
    assert raised.value.code == 422
    assert api.obj["metadata"]["finalizers"] == [NAME]


async def test_an_object_going_that_never_had_the_finalizer_is_left_alone() -> None:
    api, handlers = _FakeApi(_pool("a.example.com/x", deleting=True)), _Handlers()
    result = await Finalizer(name=NAME, client=api, resource=POOLS).reconcile(
        api.view(), **_both(handlers)
    )
    assert result is None
    assert (handlers.applied, handlers.cleaned, api.patches) == (0, 0, [])


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("drain", "no domain prefix"),
        ("orphan", "no domain prefix"),
        ("Example.com/drain", "not a DNS subdomain"),
        ("/drain", "not a DNS subdomain"),
        ("a.example.com/b/drain", "more than one '/'"),
        ("example.com/", "is not 1-63 characters"),
        ("example.com/-drain", "is not 1-63 characters"),
        (f"example.com/{'d' * 64}", "is not 1-63 characters"),
        (f"{'a' * 254}/drain", "not a DNS subdomain"),
    ],
)
def test_a_finalizer_name_that_is_not_qualified_is_refused_at_construction(
    name: str, reason: str
) -> None:
    with pytest.raises(ValueError, match="is not a qualified name") as raised:
        Finalizer(name=name, client=_FakeApi(_pool()), resource=POOLS)
    assert reason in str(raised.value)
    assert repr(name) in str(raised.value)


@pytest.mark.parametrize("name", [NAME, "example.com/Drain_1.x", "a-b.c/d"])
def test_qualified_names_are_accepted(name: str) -> None:
    assert validate_finalizer_name(name) == name


def _both(handlers: _Handlers) -> dict[str, Any]:
    return {"apply": handlers.apply, "cleanup": handlers.cleanup}
