"""Returning the C heap's free pages to the operating system once a LIST is done.
Go counterpart: the runtime's background scavenger (``debug.FreeOSMemory`` on demand).

A LIST reads pages of about 3 MB each; glibc serves allocations that large from its heap once a
first one has been freed (its mmap threshold rises to match), and the freed pages then stay in the
process between the long-lived pods, counted in its RSS, until something asks glibc to give them
back. ``trim_free_heap`` asks (``malloc_trim(0)``), where the C library has it (glibc); elsewhere it
does nothing. Python's own small-object arenas are not in that heap and are not touched.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_free_heap() -> bool:
    """Gives the C heap's free pages back to the system; whether this C library can."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
