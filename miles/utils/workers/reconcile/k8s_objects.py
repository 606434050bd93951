"""Any Kubernetes object, typed by the user's pydantic model or dynamic where none exists.
Go: apimachinery ``metav1.Object`` + ``unstructured.Unstructured`` (kube-rs ``DynamicObject``,
``PartialObjectMetadata``).

A model the reflector can hold is any pydantic model with an object ``metadata`` carrying ``name``
(and ``namespace`` for a namespaced resource): ``KubernetesObject`` is a ready base for one, in
``k8s_types``' style (partial, frozen, ``extra="ignore"``, both wire spellings, absent is empty),
its ``metadata`` an ``ObjectMeta``. ``DynamicObject`` types ``apiVersion``, ``kind`` and
``metadata`` and keeps every other top-level field as parsed JSON, read through ``data`` (a
read-only view) or ``obj["spec"]``. ``PartialObjectMetadata`` holds the metadata alone.

All three validate straight from bytes (``model_validate_json``), as ``Pod`` does; the wire
decoders (``k8s_wire.ObjectDecoder``) cut ``managedFields`` out first, which no model holds. A
``DynamicObject`` decoded from a LIST or a watch line (``deferred_validator``) keeps its object's
JSON bytes in place of the rest until that is first read (row "``DynamicObject``: the rest parsed
on first read" in docs/reconcile-loop.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import AliasChoices, AliasGenerator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from miles.utils.workers.reconcile.k8s_types import ObjectMeta, OrEmpty

__all__ = [
    "DynamicObject",
    "KubernetesModel",
    "KubernetesObject",
    "ObjectMeta",
    "ObjectModel",
    "PartialObjectMetadata",
    "deferred_validator",
]


ObjectModel = TypeVar("ObjectModel", bound=BaseModel)
"""The model a transport decodes into and a reflector stores: any pydantic model whose
``metadata`` has ``name`` and ``namespace`` (``KubernetesObject``, ``DynamicObject``, ``Pod``)."""


def _both_spellings(field: str) -> AliasChoices:
    return AliasChoices(field, to_camel(field))


_BOTH_SPELLINGS = AliasGenerator(validation_alias=_both_spellings)


def _api_version() -> Any:
    return Field(default=None, validation_alias=AliasChoices("api_version", "apiVersion"))


class KubernetesModel(BaseModel):
    """A base for any part of the user's model (a ``spec``, a ``status``, a condition): frozen,
    ``extra="ignore"``, and every field read in both spellings, its own snake_case name and the
    camelCase the apiserver writes (``ready_replicas``, ``readyReplicas``); a name camelCase does
    not spell (``podIP``) takes an explicit ``validation_alias``."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", from_attributes=True, alias_generator=_BOTH_SPELLINGS
    )


class KubernetesObject(KubernetesModel):
    """A base for the user's model of one kind: ``api_version``, ``kind`` and ``metadata`` (an
    ``ObjectMeta``, empty when absent); a subclass adds ``spec``, ``status`` or whatever it reads,
    as ``KubernetesModel`` parts (``Lenient``/``OrEmpty`` from ``k8s_types`` where a bad value
    should read as absent)."""

    api_version: str | None = _api_version()
    kind: str | None = None
    metadata: OrEmpty[ObjectMeta] = Field(default_factory=ObjectMeta)


class PartialObjectMetadata(KubernetesObject):
    """An object's metadata alone (metav1 ``PartialObjectMetadata``): every other field of the
    object is ignored when it is read."""


class DynamicObject(KubernetesObject):
    """An object of any kind without a model (kube-rs ``DynamicObject``): ``api_version``, ``kind``
    and ``metadata`` typed, every other top-level field (``spec``, ``status``, ``data``...) kept
    as the JSON parsed, read through ``obj["spec"]``, ``obj.get("status")`` or the read-only
    mapping ``obj.data``. The values are shared with the cache: read them, never change them.

    One built by ``deferred_validator`` parses the rest on its first read, any read: ``data``,
    an item, ``==``, ``model_dump``, ``pickle``; it then is, and compares equal to, the object
    ``model_validate_json`` makes of the same bytes."""

    model_config = ConfigDict(frozen=True, extra="allow", from_attributes=False)

    @property  # type: ignore[misc]
    def __pydantic_extra__(self) -> dict[str, Any] | None:
        extra = _EXTRA_SLOT.__get__(self, type(self))
        if isinstance(extra, bytes):
            extra = type(self).model_validate_json(extra).__pydantic_extra__
            _EXTRA_SLOT.__set__(self, extra)
        return extra  # type: ignore[no-any-return]

    @__pydantic_extra__.setter
    def __pydantic_extra__(self, extra: dict[str, Any] | None) -> None:
        _EXTRA_SLOT.__set__(self, extra)

    @property
    def data(self) -> Mapping[str, Any]:
        """Every top-level field but ``apiVersion``, ``kind`` and ``metadata``, read-only."""
        return MappingProxyType(self.__pydantic_extra__ or {})

    def __getitem__(self, key: str) -> Any:
        return (self.__pydantic_extra__ or {})[key]

    def get(self, key: str, default: Any = None) -> Any:
        return (self.__pydantic_extra__ or {}).get(key, default)


_EXTRA_SLOT = BaseModel.__dict__["__pydantic_extra__"]
"""The slot pydantic keeps a model's extra fields in: a ``DynamicObject`` from
``deferred_validator`` holds its JSON bytes there until they are first read."""

_Dynamic = TypeVar("_Dynamic", bound=DynamicObject)


def deferred_validator(model: type[_Dynamic]) -> Callable[[bytes], _Dynamic]:
    """``model.model_validate_json`` for one object's JSON, except that only the model's own
    fields (``apiVersion``, ``kind``, ``metadata``) become Python values now: the bytes, checked
    as JSON whole, stand for the rest until it is first read (about half of a pod-sized custom
    object's decode and two thirds of its memory in the cache: see the module docstring's row).
    Raises ``ValidationError`` where ``model_validate_json`` would."""

    class _Head(model):  # type: ignore[valid-type,misc]
        model_config = ConfigDict(extra="ignore")

    head = _Head.model_validate_json
    new = object.__new__
    put = object.__setattr__

    def validate(data: bytes) -> _Dynamic:
        parsed = head(data)
        obj = new(model)
        put(obj, "__dict__", parsed.__dict__)
        put(obj, "__pydantic_fields_set__", parsed.__pydantic_fields_set__)
        put(obj, "__pydantic_private__", parsed.__pydantic_private__)
        _EXTRA_SLOT.__set__(obj, data)
        return obj

    return validate
