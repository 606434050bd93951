"""Objects to request bodies and response bodies to objects, typed or dynamic.
Go: apimachinery's JSON serializer (``runtime.Encode`` / ``Decode``), for ``Unstructured`` and
typed objects alike.

A pydantic model is written by its wire names (``wire_name``: the alias, or the camelCase name a
``k8s_types``/``k8s_objects`` model validates from), without ``None`` fields (and, for an apply,
without the fields never set, so that only what the caller states is owned), its extra fields as
they are; its own field serializers are not run. A mapping is written as it is. A value JSON
cannot carry (an object, a NaN) fails here, before any request, with ``ValueError`` naming its
field. An answer is read back into the type the caller gave: the model's class, or a ``dict``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import AliasChoices, BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticSerializationError, to_jsonable_python

from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError

M = TypeVar("M", bound=BaseModel)

Body = BaseModel | Mapping[str, Any]

_PLAIN = frozenset({str, int, bool, type(None)})
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``encode``'s; made once, as ``json.dumps`` makes one per call for any option not its default
(a stateless object: ``encode`` keeps nothing between calls)."""


def to_wire(obj: Body, *, only_set: bool = False) -> dict[str, Any]:
    """``obj`` as the JSON object it is written as (a fresh dict, safe to change)."""
    if isinstance(obj, BaseModel):
        return _model_wire(obj, only_set, "")
    if not isinstance(obj, Mapping):
        raise ValueError(f"a write takes a pydantic model or a mapping, not {type(obj).__name__}")
    path = _first_unwritable(obj, "")
    if path is not None:
        raise ValueError(f"the object cannot be written as JSON: field {path}")
    return json.loads(json.dumps(obj))  # type: ignore[no-any-return]


def request_wire(obj: Body, *, only_set: bool = False) -> dict[str, Any]:
    """``to_wire`` for a request's body: the same JSON, but of a mapping only the top level is a
    fresh dict (safe to set ``apiVersion`` and ``kind`` in), its values the caller's, not copied
    (the body is encoded once, from this)."""
    if type(obj) is not dict and (isinstance(obj, BaseModel) or not isinstance(obj, Mapping)):
        return to_wire(obj, only_set=only_set)
    path = _first_unwritable(obj, "")
    if path is not None:
        raise ValueError(f"the object cannot be written as JSON: field {path}")
    return dict(obj)


def wire_name(name: str, info: FieldInfo) -> str:
    """A field's name on the wire: its serialization alias or alias, else the validation alias
    that is not the field's own name (``k8s_types``' models read both spellings and name only the
    camelCase one as an alias to validate from), else the field's name."""
    alias = info.serialization_alias or info.alias
    if alias:
        return alias
    choices = info.validation_alias
    if isinstance(choices, str):
        return choices
    if isinstance(choices, AliasChoices):
        for choice in choices.choices:
            if isinstance(choice, str) and choice != name:
                return choice
    return name


def _model_wire(model: BaseModel, only_set: bool, path: str) -> dict[str, Any]:
    """``model``'s fields by wire name, ``None`` left out (and, with ``only_set``, every field
    never set); the fields a model keeps beyond its own (``extra="allow"``) as they are."""
    wire: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        if only_set and name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        if value is not None:
            key = wire_name(name, info)
            wire[key] = _value_wire(value, only_set, f"{path}.{key}" if path else key)
    for key, value in (model.__pydantic_extra__ or {}).items():
        if value is not None:
            wire[key] = _value_wire(value, only_set, f"{path}.{key}" if path else key)
    return wire


def _value_wire(value: Any, only_set: bool, path: str) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"field {path} is {value}, which JSON cannot carry")
        return value
    if isinstance(value, BaseModel):
        return _model_wire(value, only_set, path)
    if isinstance(value, Mapping):
        return {str(k): _value_wire(v, only_set, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_value_wire(v, only_set, f"{path}[{i}]") for i, v in enumerate(value)]
    try:
        return to_jsonable_python(value)
    except PydanticSerializationError as err:
        raise ValueError(
            f"field {path} ({type(value).__name__}) cannot be written as JSON: {err}"
        ) from None


def encode(value: Any) -> bytes:
    """JSON bytes of a value ``to_wire`` produced (or any JSON-ready value)."""
    try:
        return _ENCODER.encode(value).encode()
    except (TypeError, ValueError):
        path = _first_unwritable(value, "")
        raise ValueError(f"the body cannot be written as JSON: field {path or '?'}") from None


def decode(body: bytes, into: type[M] | None, what: str) -> Any:
    """An answer's body as ``into`` (a model class) or, for ``None``, a ``dict``; ``what`` names
    the request in the ``FrameDecodeError`` a body that does not read raises."""
    try:
        if into is not None:
            return into.model_validate_json(body)
        value = json.loads(body)
    except (ValueError, ValidationError) as err:
        raise FrameDecodeError(f"{what}: the answer does not read: {_first_line(err)}") from None
    if not isinstance(value, dict):
        raise FrameDecodeError(f"{what}: the answer is not a JSON object")
    return value


def _first_unwritable(value: Any, path: str) -> str | None:
    """The dotted path of the first value in ``value`` JSON cannot carry, or ``None``. A plain
    scalar is passed over by its exact type (``_PLAIN``) before any ``isinstance``, and not
    recursed into: the walk runs before every write of a mapping (cProfile: the costliest call
    of an apply)."""
    if type(value) in _PLAIN or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else path or "."
    if isinstance(value, Mapping):
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                return f"{path}.{key!r}" if path else repr(key)
            if type(item) in _PLAIN:
                continue
            found = _first_unwritable(item, f"{path}.{key}" if path else key)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_unwritable(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return f"{path or '.'} ({type(value).__name__})"


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
