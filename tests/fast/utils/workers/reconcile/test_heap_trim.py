"""Fast layer: ``trim_free_heap`` (row ``heap_trim.py``): glibc's free heap pages go back to the
system after a LIST; a C library without ``malloc_trim`` makes it a no-op, never an error."""

from __future__ import annotations

import ctypes
import platform

import pytest

from miles.utils.workers.reconcile import heap_trim


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """As after a LIST: once a 4 MB block has been freed, glibc serves 3 MB blocks (a page's body)
    from its heap; freed between small blocks that stay, their pages stay in RSS until trimmed."""
    first = b"x" * (4 * 2**20)
    del first
    blocks, pins = [], []
    for _ in range(8):
        blocks.append(b"x" * (3 * 2**20))
        pins.append(b"p" * 1_000)
    del blocks
    before = rss_bytes()
    assert heap_trim.trim_free_heap()
    assert rss_bytes() < before - 2 * 2**20
    assert len(pins) == 8


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
