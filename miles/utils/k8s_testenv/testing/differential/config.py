"""What a differential run is told: its seed, sizes, timings and what it leaves out; the selector
both clients watch.

Go counterpart: none (the differential harness's own settings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from miles.utils.k8s_testenv import ApiServerName

SELECT_LABEL = "miles.diff/selected"
SELECTOR = f"{SELECT_LABEL}=in"

LogFn = Callable[[str], None]


@dataclass(frozen=True)
class HarnessConfig:
    seed: int
    parents: int = 6
    initial_pods: int = 40
    target: ApiServerName = "uncached"
    watch_timeout_seconds: int = 5
    silent_seconds: float = 8.0
    fault_seconds: float = 3.0
    without: frozenset[str] = frozenset()
    """Operations and faults (their values) left out of a soak."""
    keep_going: bool = False
    """A soak counts a divergence and goes on with the next step instead of stopping."""
    proxy_history: int = 4096
    """How many requests the HTTP proxy remembers (a bounded log, so a soak does not grow)."""
    etcd_down_seconds: float = 3.0
    quiesce_timeout: float = 90.0
    bulk_size: int = 200
    oracle_watch_list: bool = False
    streaming_list: bool = False
    """Ours lists by a streaming list (`sendInitialEvents=true`), as client-go's WatchList does."""
    engine_pools: bool = True
    """Engine pools (a custom resource) written, watched and compared beside the pods: a second
    source in our loop, client-go's dynamic informer in a second oracle."""
