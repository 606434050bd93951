"""SIGINT and SIGTERM (``cli/signals``): the command cancelled wherever it waits, its cleanup run,
kubectl's exit codes."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("signum", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
async def test_a_signal_cancels_the_command_wherever_it_waits_and_runs_its_finally(
    signum: str, code: int
) -> None:
    import asyncio
    import os
    import signal

    from miles.utils.workers.reconcile.cli.signals import SignalCancel

    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("terminal restored")

    signals = SignalCancel()
    task = asyncio.create_task(signals.run(waits_forever()))
    await asyncio.sleep(0)
    os.kill(os.getpid(), getattr(signal, signum))
    assert await task == code
    assert cleaned == ["terminal restored"]
    assert not asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
