"""Runs ``async def`` tests on a fresh event loop each, so the suite needs no pytest plugin."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

# Imported now, not by hypothesis's own terminal summary: on CPython 3.11.7 a session that had not
# imported hypothesis yet (an e2e layer alone) rewrote it at the end and died in ast.parse with
# "SystemError: AST constructor recursion depth mismatch" (cpython gh-106905).
import hypothesis.internal.observability  # noqa: F401
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True
