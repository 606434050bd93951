"""Log lines that say which loop spoke. Go: klog's ``LoggerWithName`` (client-go's reflector logs
carry the reflector's name, ``reflector.go``'s ``name`` field).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

LOOP_NAME_FIELD = "reconcile_loop"
"""The ``LogRecord`` attribute that carries the loop's name, for handlers that filter on it."""


class NamedLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every message with ``[name]`` and sets ``record.reconcile_loop`` to ``name``."""

    def __init__(self, logger: logging.Logger, name: str) -> None:
        super().__init__(logger, {LOOP_NAME_FIELD: name})
        self.loop_name = name

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(kwargs.get("extra") or {}), LOOP_NAME_FIELD: self.loop_name}
        return f"[{self.loop_name}] {msg}", kwargs


def default_loop_name(namespace: str, label_selector: str) -> str:
    """A loop's name when none is given: ``namespace/selector`` (``namespace`` alone if the
    selector is empty)."""
    return f"{namespace}/{label_selector}" if label_selector else namespace


def describe(value: object, limit: int = 200) -> str:
    """``value``'s type and its repr cut to ``limit`` characters, for a log line about bad input;
    never raises, whatever ``__repr__`` does."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<unrepresentable {type(value).__name__}: {exc!r}>"
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(value).__name__} {text}"


def one_line(error: BaseException | str, limit: int | None = None) -> str:
    """An error on one line, the one summary every log line, status field and message uses: an
    exception as ``Type: text`` (its type alone when the text is blank), its text's lines joined
    (``ApiException``'s text spans several); a string, already a summary, as its first line (what
    follows is detail); runs of whitespace as one space; longer than ``limit`` characters, cut
    there and ended with ``...``."""
    if isinstance(error, BaseException):
        text = " ".join(str(error).split())
        line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    else:
        line = " ".join(error.split("\n", 1)[0].split())
    return line if limit is None or len(line) <= limit else line[:limit] + "..."
