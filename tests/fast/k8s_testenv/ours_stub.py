"""A child for `test_differential_ours.py`: `serve()` over a stub of our side, no cluster."""

from __future__ import annotations

import asyncio
import sys

from miles.utils.k8s_testenv.testing.differential.ours import (
    OurViews,
    parse_settings_argument,
    protocol_stdout,
    serve,
    stdin_reader,
)
from miles.utils.k8s_testenv.testing.differential.views import PodRow


class StubOurs:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.fault = (0.0, False)
        self.forgotten = 0

    async def views(self) -> OurViews:
        row = PodRow(
            uid=self.namespace,
            resource_version=str(self.forgotten),
            parent="cell-0",
            status="Running ready=False; main ready=False r=2 waiting:CrashLoopBackOff last=7",
        )
        return OurViews(
            store={"p-1": row},
            reconciled={"p-1": PodRow(row.uid, repr(self.fault), "cell-0+cell-1")},
            lists=7,
        )

    async def reconcile_fault(self, *, delay: float, raises: bool) -> None:
        self.fault = (delay, raises)

    async def forget_recordings(self) -> None:
        self.forgotten += 1

    def failure(self) -> str | None:
        return None


async def _main() -> None:
    out = protocol_stdout()
    print("stray output goes to stderr, not to the protocol")
    settings = parse_settings_argument(sys.argv[1])
    await serve(StubOurs(settings.namespace), await stdin_reader(), out)


if __name__ == "__main__":
    asyncio.run(_main())
