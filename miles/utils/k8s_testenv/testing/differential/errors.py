"""How a differential run fails: the views disagreed, or no comparison could be made.

Go counterpart: none (the differential harness's own outcomes).
"""

from __future__ import annotations


class DivergenceError(AssertionError):
    """The views did not agree within the quiescence timeout."""


class HarnessAborted(RuntimeError):
    """A comparison could not be made: the oracle or the proxy died, or the LIST kept failing."""
