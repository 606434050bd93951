"""Owner references: the controller of an object, and its other owners, as the garbage collector
reads them. Go: controller-runtime ``controllerutil.SetControllerReference`` /
``SetOwnerReference``.

Both take the owner and the owned object as their JSON objects (``apiVersion``, ``kind``,
``metadata``) and change the owned object's ``metadata.ownerReferences`` in place, as Go changes
the object it is given; the caller writes the object.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerReference:
    """Go: ``metav1.OwnerReference``; ``None`` flags are left out of the wire form."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None

    @classmethod
    def of(cls, owner: Mapping[str, Any]) -> OwnerReference:
        """A reference to ``owner`` without flags; ``ValueError`` names what it lacks."""
        metadata = owner.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        fields = {
            "apiVersion": owner.get("apiVersion"),
            "kind": owner.get("kind"),
            "metadata.name": metadata.get("name"),
            "metadata.uid": metadata.get("uid"),
        }
        missing = [
            field for field, value in fields.items() if not isinstance(value, str) or not value
        ]
        if missing:
            raise ValueError(f"owner {_describe(owner)} has no {', '.join(missing)}: it cannot own")
        return cls(
            api_version=owner["apiVersion"],
            kind=owner["kind"],
            name=metadata["name"],
            uid=metadata["uid"],
        )

    @classmethod
    def from_wire(cls, ref: Mapping[str, Any]) -> OwnerReference:
        return cls(
            api_version=str(ref.get("apiVersion", "")),
            kind=str(ref.get("kind", "")),
            name=str(ref.get("name", "")),
            uid=str(ref.get("uid", "")),
            controller=ref.get("controller"),
            block_owner_deletion=ref.get("blockOwnerDeletion"),
        )

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def refers_to_same_object(self, other: OwnerReference) -> bool:
        """Go's ``referSameObject``: group, kind and name; the version and the uid are not
        compared."""
        return (self.group, self.kind, self.name) == (other.group, other.kind, other.name)

    def wire(self) -> dict[str, Any]:
        ref: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }
        if self.controller is not None:
            ref["controller"] = self.controller
        if self.block_owner_deletion is not None:
            ref["blockOwnerDeletion"] = self.block_owner_deletion
        return ref


class AlreadyOwnedError(ValueError):
    """The object already has another controller. Go: ``controllerutil.AlreadyOwnedError``."""

    def __init__(self, obj: Mapping[str, Any], owner: OwnerReference) -> None:
        super().__init__(
            f"Object {_describe(obj)} is already owned by another {owner.kind} controller "
            f"{owner.name}"
        )
        self.owner = owner


def controller_of(obj: Mapping[str, Any]) -> OwnerReference | None:
    """The reference with ``controller: true``, if any. Go: ``metav1.GetControllerOf``."""
    for ref in _references(obj):
        if ref.get("controller") is True:
            return OwnerReference.from_wire(ref)
    return None


def set_controller_reference(
    owner: Mapping[str, Any], obj: MutableMapping[str, Any], *, block_owner_deletion: bool = True
) -> None:
    """Makes ``owner`` the controller of ``obj`` (``controller`` and ``blockOwnerDeletion`` true),
    replacing a reference to the same owner. Raises ``AlreadyOwnedError`` when another object is
    its controller, and ``ValueError`` for an owner in another namespace or a namespaced owner of a
    cluster-scoped object (Go's ``validateOwner``)."""
    ref = OwnerReference.of(owner)
    ref = OwnerReference(
        api_version=ref.api_version,
        kind=ref.kind,
        name=ref.name,
        uid=ref.uid,
        controller=True,
        block_owner_deletion=block_owner_deletion,
    )
    _validate_owner(owner, obj)
    existing = controller_of(obj)
    if existing is not None and not existing.refers_to_same_object(ref):
        raise AlreadyOwnedError(obj, existing)
    _upsert(obj, ref)


def set_owner_reference(owner: Mapping[str, Any], obj: MutableMapping[str, Any]) -> None:
    """Adds ``owner`` to the owners of ``obj`` without the controller flags, replacing a reference
    to the same owner; the namespace checks of ``set_controller_reference``. Go:
    ``controllerutil.SetOwnerReference``."""
    ref = OwnerReference.of(owner)
    _validate_owner(owner, obj)
    _upsert(obj, ref)


def _validate_owner(owner: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
    owner_namespace, namespace = _namespace(owner), _namespace(obj)
    if not owner_namespace:
        return
    if not namespace:
        raise ValueError(
            f"cluster-scoped resource must not have a namespace-scoped owner, owner's namespace "
            f"{owner_namespace} ({_describe(obj)})"
        )
    if owner_namespace != namespace:
        raise ValueError(
            f"cross-namespace owner references are disallowed, owner's namespace "
            f"{owner_namespace}, obj's namespace {namespace} ({_describe(obj)})"
        )


def _upsert(obj: MutableMapping[str, Any], ref: OwnerReference) -> None:
    metadata = obj.setdefault("metadata", {})
    refs = [dict(r) for r in _references(obj)]
    for i, existing in enumerate(refs):
        if OwnerReference.from_wire(existing).refers_to_same_object(ref):
            refs[i] = ref.wire()
            break
    else:
        refs.append(ref.wire())
    metadata["ownerReferences"] = refs


def _references(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    metadata = obj.get("metadata")
    refs = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def _namespace(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    value = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return value if isinstance(value, str) else ""


def _describe(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"
