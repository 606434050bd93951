"""A pause of the cyclic garbage collector that any number of holders share, also across awaits.
Go counterpart: none (Go's collector is concurrent; ``debug.SetGCPercent(-1)`` is the nearest).

``gc.disable()`` is process-wide, so two holders that each saved and restored ``gc.isenabled()``
would undo each other: the first to leave would switch the collector back on under the second.
``CollectorPause`` counts its holders instead: the first one in disables the collector, the last
one out enables it again, and only if it was enabled when the first came in. A holder leaves in
``__exit__``, so an exception or a cancellation inside a ``with`` block restores the collector
like a return does.

``COLLECTOR`` is the one instance every holder in the process uses; the switch it guards is itself
process state, so one counter per process is the only count that is right.
"""

from __future__ import annotations

import gc
from types import TracebackType


class CollectorPause:
    """Counts holders of a pause of the cyclic garbage collector."""

    def __init__(self) -> None:
        self._holders = 0
        self._restore = False

    @property
    def holders(self) -> int:
        return self._holders

    def held(self) -> CollectorPause:
        """The collector stays off inside the ``with`` block, whatever other holders do
        meanwhile. The pause is its own context manager, not a generator's: it is entered for
        every read of a watch, and ``contextlib.contextmanager`` cost about 1 µs more each time."""
        return self

    def __enter__(self) -> None:
        if self._holders == 0:
            self._restore = gc.isenabled()
            gc.disable()
        self._holders += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._holders -= 1
        if self._holders == 0 and self._restore:
            gc.enable()


COLLECTOR = CollectorPause()
