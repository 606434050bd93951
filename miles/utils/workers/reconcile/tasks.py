"""Racing awaitables: the first to finish ends the race, the others are cancelled and awaited.
Go: none; a ``select`` over channels, with the losers' contexts cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first_of(*racers: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Runs ``racers`` until one finishes, then cancels every racer this call started and waits
    until each has ended; returns one future per racer, in the order given.

    A coroutine (or any awaitable that is not a future) is started here as a task and owned by the
    race: it never outlives the call, also when the caller is cancelled. A future or task passed in
    is the caller's: it is watched, never cancelled. A racer finished on its own when its future
    is done and not cancelled (``finished``); an exception of a loser is marked retrieved, so
    asyncio does not log it, and ``result()`` still raises it.
    """
    if not racers:
        raise ValueError("first_of() needs at least one awaitable")
    futures: list[asyncio.Future[Any]] = [asyncio.ensure_future(racer) for racer in racers]
    owned = [f for f, racer in zip(futures, racers, strict=True) if f is not racer]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in owned:
            future.cancel()
        if owned:
            await asyncio.wait(owned)
        for future in owned:
            if not future.cancelled():
                future.exception()
    return futures


def finished(future: asyncio.Future[Any]) -> bool:
    """Whether a racer ended on its own (a result or an exception), not by the race's cancel."""
    return future.done() and not future.cancelled()
