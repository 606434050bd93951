"""The key map of owned children: an object's parents are its owners of one kind.
Go: controller-runtime ``handler.EnqueueRequestForOwner`` (``pkg/handler/enqueue_owner.go``).

``owner_key_map(ENGINE_POOLS)`` maps a child to the key of its controller owner when that owner
is of the given group and kind; ``every_owner=True`` (controller-runtime's ``MatchEveryOwner``)
maps it to every owner of that group and kind, several parents at once. As controller-runtime
does, the version of an owner reference is ignored (``apps/v1`` and ``apps/v1beta1`` match alike),
and so is its uid; the owner's name comes from the reference and its namespace is the child's,
unless the owner's resource is cluster-scoped. A child that moves to another owner wakes the old
owner and the new: the store holds each child under the parents it was mapped to, so an update
affects the parents it left as well as those it has (``object_store.ObjectStore``).

Keys are ``namespace/name`` by default, matching a reflector across namespaces; ``key="name"``
matches a reflector within one namespace. A cluster-scoped owner is keyed by its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from miles.utils.workers.reconcile.resource import Resource
from miles.utils.workers.reconcile.source_event import ParentKey

KeyStyle = Literal["namespace/name", "name"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerKeyMap:
    """A ``KeyMapFn``: see ``owner_key_map``."""

    owner: Resource
    every_owner: bool = False
    key: KeyStyle = "namespace/name"

    def __call__(self, obj: Any) -> ParentKey | frozenset[ParentKey] | None:
        meta = _field(obj, "metadata")
        refs = _field(meta, "owner_references", "ownerReferences") or ()
        if not self.every_owner:
            refs = [ref for ref in refs if _field(ref, "controller") is True][:1]
        names = [name for ref in refs if (name := self._owner_name(ref))]
        if not names:
            return None
        namespace = _field(meta, "namespace") if self.owner.namespaced else None
        keys = [self._key(namespace, name) for name in names]
        return keys[0] if len(keys) == 1 else frozenset(keys)

    def _owner_name(self, ref: Any) -> str | None:
        if _field(ref, "kind") != self.owner.kind:
            return None
        api_version = _field(ref, "api_version", "apiVersion")
        if not isinstance(api_version, str):
            return None
        group = api_version.rpartition("/")[0]
        if group != self.owner.group:
            return None
        name = _field(ref, "name")
        return name if isinstance(name, str) and name else None

    def _key(self, namespace: object, name: str) -> ParentKey:
        if self.key == "namespace/name" and isinstance(namespace, str) and namespace:
            return f"{namespace}/{name}"
        return name


def owner_key_map(
    owner: Resource, *, every_owner: bool = False, key: KeyStyle = "namespace/name"
) -> OwnerKeyMap:
    """A key map naming a child's owner of ``owner``'s group and kind: the controller owner only
    (the first reference with ``controller: true``, as ``metav1.GetControllerOf``), or with
    ``every_owner`` each owner of that kind. ``key`` says how parents are keyed (see the module).
    Reads typed objects (``metadata.owner_references``) and plain mappings alike."""
    if key not in ("namespace/name", "name"):
        raise ValueError(f"key must be 'namespace/name' or 'name', got {key!r}")
    if not isinstance(owner, Resource):
        raise TypeError(f"owner must be a Resource, got {type(owner).__name__}")
    return OwnerKeyMap(owner=owner, every_owner=every_owner, key=key)


def _field(value: Any, name: str, wire_name: str | None = None) -> Any:
    """A field of a model or a mapping (by its Python or its wire name); absent is ``None``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        found = value.get(name)
        return value.get(wire_name) if found is None and wire_name is not None else found
    return getattr(value, name, None)
