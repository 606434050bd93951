"""Each pod's ``metadata.managedFields`` cut out of JSON bytes before they are validated.
Go: controller-runtime's ``cache.TransformStripManagedFields`` (which drops them after decoding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError

_MANAGED_FIELDS = b',"managedFields":['
_Validated = TypeVar("_Validated")


def validated_without_managed_fields(
    validate: Callable[[bytes], _Validated], data: bytes, *, most: int | None = None
) -> _Validated:
    """``validate`` over ``data`` without its managed fields, or, when that fails, as it came."""
    cut = without_managed_fields(data, most=most)
    if cut is not data:
        try:
            return validate(cut)
        except ValidationError:
            pass
    return validate(data)


def without_managed_fields(data: bytes, *, most: int | None = None) -> bytes:
    """A pod's, a watch frame's or a LIST body's JSON without each pod's ``metadata.managedFields``,
    which no model reads; data without them is returned as it is. They are 44-45% of a pod's bytes
    as an apiserver writes them, and pydantic-core would parse them in full only to drop them
    (controller-runtime drops them after decoding, ``TransformStripManagedFields``).

    Each array runs from ``,"managedFields":[`` to the first ``]`` after it. The opening cannot
    match inside a JSON string (a quote there is always escaped), and a managed-fields entry holds
    only strings and the ``fieldsV1`` trie of objects, never an array, so the first ``]`` outside a
    string closes the array. One inside a string (a trie key may quote a value) cuts the data in
    the middle of that string, which leaves JSON that does not parse: a caller whose cut data does
    not validate decodes the data it was given instead. ``most`` stops the search after that many
    arrays (1 for a watch line: the search for a second one cost a third of the cut)."""
    if not isinstance(data, bytes):  # a str line, as the decoders also accept
        return data
    parts: list[bytes] = []
    taken = 0
    while (start := data.find(_MANAGED_FIELDS, taken)) != -1:
        end = data.find(b"]", start + len(_MANAGED_FIELDS))
        if end == -1:
            break
        parts.append(data[taken:start])
        taken = end + 1
        if len(parts) == most:
            break
    if not parts:
        return data
    parts.append(data[taken:])
    return b"".join(parts)


def holds_managed_fields(data: bytes, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` has a managed-fields array this module would cut (written as
    the apiserver writes JSON: compact)."""
    return data.find(_MANAGED_FIELDS, start, end) != -1


def kept_spans(data: bytes, start: int, end: int) -> list[tuple[int, int]] | None:
    """The spans of ``data[start:end]`` that ``without_managed_fields`` keeps, as ``(first,
    past-last)`` pairs, where every array it cuts there also closes there; ``None`` where one does
    not (what it would cut then depends on bytes after ``end``)."""
    spans: list[tuple[int, int]] = []
    while (opening := data.find(_MANAGED_FIELDS, start, end)) != -1:
        close = data.find(b"]", opening + len(_MANAGED_FIELDS), end)
        if close == -1:
            return None
        spans.append((start, opening))
        start = close + 1
    spans.append((start, end))
    return spans
