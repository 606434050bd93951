"""Pods, clocks and loop snapshots the command's view tests share."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

from miles.utils.workers.reconcile.cli.live_view import LiveView, Terminal
from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.status import (
    LoopStatus,
    SourcePhase,
    SourceStatus,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def make_pod(
    name: str,
    *,
    cell: str = "cell-0",
    phase: str = "Running",
    ready: bool = True,
    restarts: int = 0,
    ip: str | None = "10.0.0.1",
    rv: str = "1",
    deleting: bool = False,
) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": f"uid-{name}",
                "resourceVersion": rv,
                "labels": {"cell": cell, "app": "engine"},
                "creationTimestamp": T0.isoformat(),
                "deletionTimestamp": T0.isoformat() if deleting else None,
            },
            "spec": {"nodeName": "fake-node", "containers": [{"name": "engine"}]},
            "status": {
                "phase": phase,
                "podIP": ip,
                "containerStatuses": [
                    {
                        "name": "engine",
                        "ready": ready,
                        "restartCount": restarts,
                        "state": {"running": {}},
                    }
                ],
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def pod(name: str, cell: str = "cell-0", restarts: int = 0) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "labels": {"cell": cell},
                "creationTimestamp": (T0 - timedelta(minutes=4, seconds=3)).isoformat(),
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "engine"}]},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "containerStatuses": [
                    {
                        "name": "engine",
                        "ready": True,
                        "restartCount": restarts,
                        "state": {"running": {}},
                    }
                ],
            },
        }
    )


def live_view(width: int, height: int, *, styled: bool = True) -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    terminal = Terminal(live=True, styled=styled, size=lambda: (width, height))
    view = LiveView(stream=out, output="table", tty=True, title="t", now=Clock(), terminal=terminal)
    return view, out


def source(phase: SourcePhase, **kw: Any) -> SourceStatus:
    return SourceStatus(phase=phase, **kw)


def snapshot(src: SourceStatus, taken_at: float = 100.0, **kw: Any) -> LoopStatus:
    return LoopStatus(name="ns/app=x", taken_at=taken_at, synced=True, source=src, **kw)


WALL = 1_800_000_000.0
