"""A finalizer around a reconcile: added before the controller acts, removed once its cleanup has
run. Go: kube-rs ``runtime::finalizer::finalizer`` (controller-runtime's ``controllerutil``
``AddFinalizer`` / ``RemoveFinalizer`` only change an object in memory).

``Finalizer.reconcile(obj, apply=..., cleanup=...)`` does one step of kube-rs' flow for the object
as the cache holds it (finalizer present? deletion under way?):

- present, not deleting: ``apply(obj)``;
- present, deleting: ``cleanup(obj)``, then the finalizer removed; a cleanup that raises leaves it
  in place and the exception goes to the loop, which retries the parent with backoff;
- absent, not deleting: the finalizer added, nothing else (the write brings the object back);
- absent, deleting: nothing (the object is going and was never acted on).

Both writes are JSON patches whose ``test`` op fails (422) when the list is not what was read, so
no other controller's finalizer is ever removed or overwritten.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from miles.utils.workers.reconcile.client.patches import JsonPatch
from miles.utils.workers.reconcile.resource import Resource

R = TypeVar("R")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})
"""Go: ``helper.IsStandardFinalizerName`` (the system's own; a controller never holds one)."""


class PatchClient(Protocol):
    """The write the finalizer needs, as ``client.Client.patch`` does it: a JSON patch of one
    object, raising ``KubernetesApiError`` (422 for a failed ``test``)."""

    async def patch(
        self, resource: Resource, name: str, patch: JsonPatch, *, namespace: str | None = None
    ) -> Any: ...


def validate_finalizer_name(name: str) -> str:
    """``name`` if it is a qualified name with a domain prefix (``example.com/cleanup``), else
    ``ValueError`` saying why. Go: apimachinery ``IsQualifiedName`` and core validation's
    ``ValidateFinalizerName`` ("name is neither a standard finalizer name nor is it fully
    qualified"); the standard names are the system's."""
    if not isinstance(name, str):
        raise ValueError(f"finalizer name {name!r} is not a string")
    prefix, slash, short = name.rpartition("/")
    reason = None
    if not slash:
        reason = "it has no domain prefix (a qualified finalizer name is DOMAIN/NAME)"
    elif "/" in prefix:
        reason = "it has more than one '/'"
    elif not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        reason = f"its prefix {prefix!r} is not a DNS subdomain (lowercase, at most 253 characters)"
    elif len(short) > 63 or not _QUALIFIED_NAME.match(short):
        reason = (
            f"its name {short!r} is not 1-63 characters of alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    if reason is not None:
        raise ValueError(f"finalizer name {name!r} is not a qualified name: {reason}")
    return name


@dataclass(frozen=True, slots=True)
class _State:
    name: str
    namespace: str | None
    finalizers: list[str] | None
    deleting: bool


class Finalizer:
    """One finalizer of one resource, written through ``client``."""

    def __init__(self, *, name: str, client: PatchClient, resource: Resource) -> None:
        self.name = validate_finalizer_name(name)
        self._client = client
        self._resource = resource

    async def reconcile(
        self,
        obj: Mapping[str, Any],
        *,
        apply: Callable[[Mapping[str, Any]], Awaitable[R]],
        cleanup: Callable[[Mapping[str, Any]], Awaitable[R]],
    ) -> R | None:
        """One step of the flow (module docstring); ``None`` where no handler ran."""
        state = _state(obj, self._resource)
        held = state.finalizers is not None and self.name in state.finalizers
        if held and not state.deleting:
            return await apply(obj)
        if held:
            result = await cleanup(obj)
            await self._patch(state, _removal(state.finalizers or [], self.name))
            return result
        if not state.deleting:
            await self._patch(state, _addition(state.finalizers, self.name))
        return None

    async def _patch(self, state: _State, ops: list[dict[str, Any]]) -> None:
        await self._client.patch(
            self._resource, state.name, JsonPatch(ops), namespace=state.namespace
        )


def _removal(finalizers: list[str], name: str) -> list[dict[str, Any]]:
    index = finalizers.index(name)
    path = f"/metadata/finalizers/{index}"
    return [{"op": "test", "path": path, "value": name}, {"op": "remove", "path": path}]


def _addition(finalizers: list[str] | None, name: str) -> list[dict[str, Any]]:
    if not finalizers:
        # kube-rs tests an absent list as null; the apiserver omits an empty one, so it is absent
        # (a typed model reads it as [], which a test of [] against the absent list would fail).
        test: dict[str, Any] = {"op": "test", "path": "/metadata/finalizers", "value": None}
        return [test, {"op": "add", "path": "/metadata/finalizers", "value": [name]}]
    return [
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "add", "path": "/metadata/finalizers/-", "value": name},
    ]


def _state(obj: Mapping[str, Any], resource: Resource) -> _State:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        raise ValueError(f"{resource.kind} object without metadata.name: {str(obj)[:200]}")
    finalizers = metadata.get("finalizers")
    if finalizers is not None and not (
        isinstance(finalizers, list) and all(isinstance(f, str) for f in finalizers)
    ):
        raise ValueError(
            f"{resource.kind} {metadata['name']}: metadata.finalizers is not a list of strings"
        )
    namespace = metadata.get("namespace") if resource.namespaced else None
    return _State(
        name=metadata["name"],
        namespace=namespace if isinstance(namespace, str) else None,
        finalizers=None if finalizers is None else list(finalizers),
        deleting=metadata.get("deletionTimestamp") is not None,
    )
