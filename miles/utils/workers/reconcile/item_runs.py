"""A long list document validated a run of items at a time, each run as its own small document.
Go: none (``encoding/json`` decodes into the list's structs without first building a tree of it).

pydantic-core parses a whole JSON document into its own tree before it validates any of it: for a
10,000-pod ``kubectl get pods -o json`` that tree is tens of megabytes of fresh memory, and the
document cost more per pod than the same pods in LIST pages of 500 (``bench/decode.py``).
``validated_in_runs`` cuts the top-level ``items`` array into runs of about ``run_bytes`` at the
boundaries between items and validates ``{RUN_KEY:[run]}`` for each, plus the document with its
``items`` emptied (the skeleton), so only one run's tree is alive at a time.

The cuts are found by bytes, and proven by validation, never trusted:

- ``head`` runs up to the ``[`` that opens the items array; ``json.loads(head + b"]}")`` reads an
  object whose last key is ``items`` and holds ``[]``, so that ``[`` opens the value of the
  top-level ``items`` key. The items are taken to end at the document's last ``]``.
- Between the two, the items are cut where ``}``, a comma and the first item's own opening
  (``{``, its whitespace and its first key, quotes included) follow each other with only JSON
  whitespace between; the comma and whitespace left out between two runs are what separates two
  array values. A cut inside a string ends its run inside that string (the key's opening quote
  there can only close it), and a cut inside an item leaves brackets that do not balance: either
  way the run does not parse.
- A run is validated as ``{"\x7f":[`` run ``]}`` (``RUN_KEY``) by a model that refuses every
  other key. One that closed the array early would go on as members of that object and end in
  an array, so its first key would read ``RUN_KEY``, which a run without a DEL byte or a
  ``\\u007f`` cannot spell; a document with a run that holds either is read whole. So every run
  is whole items of the top-level array, that array does end at the last ``]``, and the skeleton
  (the document with its items emptied) holds the document's other keys; ``json`` finds
  ``items`` among them once, so no repeated key overrides the one cut.
- When the skeleton and every run validate, the document is the valid JSON they make up and the
  runs' items in order are its items, validated item by item as the whole document would be.
  When anything does not validate, or the document does not have this shape,
  ``validated_in_runs`` returns ``None`` and the caller validates the document whole, which
  raises or reads it as it always did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

_WHITESPACE = rb"[ \t\n\r]*"
_ITEMS_OPEN = re.compile(rb'"items"' + _WHITESPACE + rb":" + _WHITESPACE + rb"\[")
_FIRST_ITEM = re.compile(rb"(" + _WHITESPACE + rb")\{(" + _WHITESPACE + rb')("(?:[^"\\]|\\.)*")')
_HEAD_MOST = 64 * 2**10
_METADATA_KEY = b'"metadata":'
_ITEM_OPENING_MOST = 256
RUN_KEY = "\x7f"
"""The one key of a run's document: DEL, which JSON allows unescaped and no printer writes."""
_RUN_OPEN = b'{"\x7f":['
_RUN_CLOSE = b"]}"

_Skeleton = TypeVar("_Skeleton")
_Run = TypeVar("_Run")


def kept_whole(data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """The edit of ``validated_in_runs`` that keeps every byte."""
    return [(start, end)]


def validated_in_runs(
    skeleton_of: Callable[[bytes], _Skeleton],
    run_of: Callable[[bytearray], _Run],
    document: bytes,
    *,
    run_bytes: int,
    kept: Callable[[bytes, int, int], list[tuple[int, int]] | None] = kept_whole,
) -> tuple[_Skeleton, list[_Run]] | None:
    """``skeleton_of`` over the document's skeleton and ``run_of`` over each run of its items, as
    the module docstring says; ``None`` where the document is not cut (then validate it whole).
    ``run_of`` reads ``{RUN_KEY: [...]}`` and must refuse any other key (``extra="forbid"``).

    ``kept`` is an edit of the bytes made run by run as if made to the whole document first: the
    spans of ``document[a:b]`` it keeps, ``None`` where it cannot tell from those bytes alone. It
    must keep the skeleton whole and the cuts between runs, so that the runs it edits are the runs
    of the edited document."""
    split = _split(document, run_bytes)
    if split is None or kept(split[0], 0, len(split[0])) != [(0, len(split[0]))]:
        return None
    skeleton, spans = split
    view = memoryview(document)
    run = bytearray(_RUN_OPEN)
    try:
        whole = skeleton_of(skeleton)
        parts = []
        for start, end in spans:
            pieces = kept(document, start, end)
            if pieces is None or not _copied(view, pieces, run):
                return None
            parts.append(run_of(run))
    except ValidationError:
        return None
    return whole, parts


def _copied(view: memoryview, pieces: list[tuple[int, int]], run: bytearray) -> bool:
    """``run`` made ``{RUN_KEY:[`` + the pieces + ``]}`` in place, reusing its memory (a fresh
    buffer per run cost a page fault per 4 KiB, measured); whether it cannot spell ``RUN_KEY``.
    The one assignment that sizes ``run`` also copies the first piece into place."""
    first, first_end = pieces[0]
    size = sum(end - start for start, end in pieces)
    run[len(_RUN_OPEN) :] = view[first : first + size]
    at = len(_RUN_OPEN) + first_end - first
    for start, end in pieces[1:]:
        run[at : at + end - start] = view[start:end]
        at += end - start
    if _spells_the_run_key(run, len(_RUN_OPEN)):
        return False
    run += _RUN_CLOSE
    return True


def _split(document: bytes, run_bytes: int) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The skeleton and the spans of the runs, each a run's first and past-last byte."""
    found = _skeleton(document)
    if found is None:
        return None
    skeleton, start, end = found
    spans = _spans(document, start, end, run_bytes)
    if spans is None or len(spans) < 2:
        return None
    return skeleton, spans


def _skeleton(document: bytes) -> tuple[bytes, int, int] | None:
    """The skeleton, and the first and past-last byte of what the items array holds."""
    opening = _ITEMS_OPEN.search(document, 0, _HEAD_MOST)
    items_end = document.rfind(b"]")
    if opening is None or items_end < opening.end():
        return None
    head = document[: opening.end()]
    skeleton = head + document[items_end:]
    if not _opens_the_top_level_items(head) or _top_level_keys(skeleton).count("items") != 1:
        return None
    return skeleton, opening.end(), items_end


def item_spans(document: bytes) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The skeleton and the span of each item, for a caller that validates each span alone as one
    JSON value; ``None`` where the document is not cut (then validate it whole).

    The items are cut as runs are, but before every item whose opening repeats the first item's
    bytes up to and including its ``"metadata":`` key (``apiVersion`` and ``kind`` first, as an
    apiserver writes a custom resource's list; its first key alone where ``metadata`` is not
    near): an object nested in an item seldom opens so. A span that is one JSON value alone
    balances its brackets outside strings, so the cut after it lies between two items of the
    top-level array; one cut elsewhere leaves a span that is not one value, and the caller reads
    the document whole."""
    found = _skeleton(document)
    if found is None:
        return None
    skeleton, start, end = found
    first = _FIRST_ITEM.match(document, start, end)
    if first is None:
        return None
    opening = first.end(1)
    key = document.find(_METADATA_KEY, opening, opening + _ITEM_OPENING_MOST)
    anchor_end = key + len(_METADATA_KEY) if key != -1 else first.end()
    between = b"}," + first.group(1) + document[opening:anchor_end]
    spans: list[tuple[int, int]] = []
    while (cut := document.find(between, start, end)) != -1:
        spans.append((start, cut + 1))
        start = cut + 2
    spans.append((start, end))
    return skeleton, spans


def _spans(document: bytes, start: int, end: int, run_bytes: int) -> list[tuple[int, int]] | None:
    first = _FIRST_ITEM.match(document, start, end)
    if first is None:
        return None
    leading, inner, key = (re.escape(group) for group in first.groups())
    between = re.compile(rb"\}" + _WHITESPACE + rb"," + leading + rb"(?=\{" + inner + key + rb")")
    spans: list[tuple[int, int]] = []
    while (cut := between.search(document, start + run_bytes, end)) is not None:
        spans.append((start, cut.start() + 1))
        start = cut.end()
    spans.append((start, end))
    return spans


def _spells_the_run_key(run: bytearray, start: int) -> bool:
    """Whether the run's bytes from ``start`` could hold ``RUN_KEY``: a DEL byte, or ``\\u007f``
    where they hold a backslash at all. Searching for one byte runs at memory speed, the more so
    in the run just copied."""
    if run.find(b"\x7f", start) != -1:
        return True
    return run.find(b"\\", start) != -1 and run.find(b"\\u007", start) != -1


def _opens_the_top_level_items(head: bytes) -> bool:
    pairs = _top_level_pairs(head + b"]}")
    return pairs is not None and pairs[-1:] == [("items", [])]


def _top_level_keys(document: bytes) -> list[str]:
    return [key for key, _ in _top_level_pairs(document) or ()]


class _Pairs(list[tuple[str, Any]]):
    """An object's keys and values in document order, duplicates kept."""


def _top_level_pairs(document: bytes) -> _Pairs | None:
    """The top-level object's pairs; ``None`` when ``json`` does not read the document as one."""
    try:
        pairs = json.loads(document, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return None
    return pairs if isinstance(pairs, _Pairs) else None
