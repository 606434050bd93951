"""What a LIST does to the process's memory: the collector paused across it, what it built aged
into the oldest generation, the C heap trimmed after it. Go: none (the runtime's concurrent
collector and its scavenger, ``debug.FreeOSMemory``, do this on their own).

The cyclic garbage collector stays paused for the whole LIST (``gc_pause.COLLECTOR``), and a LIST
that succeeded moves what it built into the oldest generation before the pause ends (``gc.freeze()``
then ``gc.unfreeze()``, which walks nothing): the listed pods are long-lived, so only a full
collection walks them. Then the C heap's free pages, the pages' bodies among them, go back to the
system (``heap_trim``). A LIST that fails or is cancelled only ends the pause. See the rows of
``docs/reconcile-loop.md`` that name this module.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.heap_trim import trim_free_heap


@contextmanager
def listing() -> Iterator[None]:
    """The ``with`` block is one LIST, kept as the module docstring says."""
    with COLLECTOR.held():
        yield
        _age_without_a_walk()
    trim_free_heap()


def _age_without_a_walk() -> None:
    """Move every object the collector tracks into its oldest generation, walking none: what the
    LIST built would otherwise be walked by the next young collection, and by every collection
    until it had survived two. A full collection still walks them, so nothing is held past it
    (a ``gc.freeze()`` left in place would never collect what later becomes cyclic garbage). A
    process that froze its own heap (before forking, say) is left as it is."""
    if gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()
