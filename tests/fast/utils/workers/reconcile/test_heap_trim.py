"""Fast layer: ``trim_free_heap`` (row ``heap_trim.py``): glibc's free heap pages go back to the
system after a LIST; a C library without ``malloc_trim`` makes it a no-op, never an error."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys

import pytest

from miles.utils.workers.reconcile import heap_trim

# Run in a fresh interpreter: in the suite's own process, earlier tests leave free holes in the heap
# that the pins can land in, leaving the blocks next to the top of the heap, which glibc then trims
# on free by itself (a clean-clone CI at d5ffee9 saw 128 KiB go back, not 24 MiB).
_FREED_BETWEEN_PINS = """
import json
from miles.utils.workers.reconcile import heap_trim

def rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

first = b"x" * (4 * 2**20)
del first
blocks, pins = [], []
for _ in range(8):
    blocks.append(b"x" * (3 * 2**20))
    pins.append(b"p" * 2**18)
del blocks
before = rss_bytes()
trimmed = heap_trim.trim_free_heap()
print(json.dumps({"trimmed": trimmed, "before": before, "after": rss_bytes(), "pins": len(pins)}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """As after a LIST: once a 4 MB block has been freed, glibc serves 3 MB blocks (a page's body)
    from its heap; freed between blocks that stay, their pages stay in RSS until trimmed."""
    # A MALLOC_ tunable that fixes the mmap threshold keeps the blocks out of the heap.
    glibc_defaults = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("MALLOC_", "GLIBC_TUNABLES"))
    }
    child = subprocess.run(
        [sys.executable, "-c", _FREED_BETWEEN_PINS],
        env=glibc_defaults,
        capture_output=True,
        text=True,
        check=True,
    )
    sizes = json.loads(child.stdout)
    assert sizes["trimmed"] is True
    assert sizes["after"] < sizes["before"] - 16 * 2**20, sizes
    assert sizes["pins"] == 8


def test_without_malloc_trim_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoTrim:
        def __getattr__(self, name: str) -> object:
            raise AttributeError(name)

    heap_trim._malloc_trim.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda _name: NoTrim())
    try:
        assert heap_trim.trim_free_heap() is False
    finally:
        heap_trim._malloc_trim.cache_clear()
