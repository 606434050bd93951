"""Doubles and harnesses shared by `tests/` and `bench/` (Go: client-go's `tools/cache/testing`).

The one place where the runtime and the test environment meet for tests: it imports both, and
neither imports it.
"""
