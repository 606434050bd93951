"""Objects to request bodies and response bodies to objects, typed or dynamic.
Go: apimachinery's JSON serializer (``runtime.Encode`` / ``Decode``), for ``Unstructured`` and
typed objects alike.

A pydantic model is written by its aliases (the camelCase wire names), without ``None`` fields
(and, for an apply, without the fields never set, so that only what the caller states is owned);
a mapping is written as it is. A value JSON cannot carry (a set, an object, a NaN) fails here,
before any request, with ``ValueError`` naming its field. An answer is read back into the type the
caller gave: the model's class, or a ``dict``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError

M = TypeVar("M", bound=BaseModel)

Body = BaseModel | Mapping[str, Any]


def to_wire(obj: Body, *, only_set: bool = False) -> dict[str, Any]:
    """``obj`` as the JSON object it is written as (a fresh dict, safe to change)."""
    if isinstance(obj, BaseModel):
        options: dict[str, Any] = {
            "by_alias": True,
            "exclude_none": True,
            "exclude_unset": only_set,
        }
        try:
            dumped = obj.model_dump(mode="json", **options)
        except PydanticSerializationError as err:
            path = _first_unwritable(obj.model_dump(mode="python", **options), "")
            raise ValueError(
                f"{type(obj).__name__} cannot be written as JSON: field {path or '?'}: {err}"
            ) from None
        return dict(dumped)
    if not isinstance(obj, Mapping):
        raise ValueError(f"a write takes a pydantic model or a mapping, not {type(obj).__name__}")
    path = _first_unwritable(obj, "")
    if path is not None:
        raise ValueError(f"the object cannot be written as JSON: field {path}")
    return json.loads(json.dumps(obj))  # type: ignore[no-any-return]


def encode(value: Any) -> bytes:
    """JSON bytes of a value ``to_wire`` produced (or any JSON-ready value)."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
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
    """The dotted path of the first value in ``value`` JSON cannot carry, or ``None``."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else path or "."
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}.{key!r}" if path else repr(key)
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
