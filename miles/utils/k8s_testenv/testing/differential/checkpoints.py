"""The differential harness's checkpoints: poll the fresh LIST, client-go's store and ours until
they agree and stay agreed, and time how long each client took after a fault.

Go counterpart: none (what holds our reflector and store to client-go's; `views.py` says what each
view must equal).
"""

from __future__ import annotations

import asyncio
import json
import time

from miles.utils.k8s_testenv.testing.differential.config import SELECTOR, HarnessConfig
from miles.utils.k8s_testenv.testing.differential.engine_pools import (
    ENGINE_POOLS,
    pool_row_of_json,
)
from miles.utils.k8s_testenv.testing.differential.errors import DivergenceError, HarnessAborted
from miles.utils.k8s_testenv.testing.differential.lifecycle import Rig
from miles.utils.k8s_testenv.testing.differential.oracle_client import (
    OracleError,
    OracleProcess,
    OracleSnapshot,
)
from miles.utils.k8s_testenv.testing.differential.ours import OurLoopError, OurViews, parent_of
from miles.utils.k8s_testenv.testing.differential.stats import Convergence, Stats
from miles.utils.k8s_testenv.testing.differential.views import (
    Comparison,
    NamelessGhost,
    PodRow,
    View,
    view_of,
    view_of_json,
)

_POLL_INTERVAL = 0.1
GHOST_HOLD = 5.0
"""Seconds client-go's view must stay exactly the predicted ghost before it counts as kept: more
than Go's longest first backoff step (1.6 s) and a LIST, by which a client-go that noticed the
frame would have relisted."""


class _ListFailed(Exception):
    """The fresh LIST could not be made this poll (the control plane is still recovering)."""


class Checkpoints:
    """`await checkpoints.checkpoint(what)` returns once every view agrees; `agreed` is the fresh
    LIST they last agreed on."""

    def __init__(self, *, rig: Rig, config: HarnessConfig, stats: Stats) -> None:
        self._rig = rig
        self._config = config
        self._stats = stats
        self.agreed: View = {}
        self.stored_pods = 0
        """How many pods our store held at the last comparison."""
        self._our_lists = 0
        self._oracle_lists = 0
        self._oracle_lists_before = 0
        """LISTs made by oracle processes since replaced (`Rig.restart_oracle`)."""
        self._oracle_process: tuple[int | None, int] = (None, 0)
        """The oracle's pid and its LISTs at the last comparison."""

    async def checkpoint(
        self, what: str, *, healed_at: float | None = None, ghost: NamelessGhost | None = None
    ) -> Convergence | None:
        """Polls until every view matches what it should, twice in a row on the same LIST; with
        `ghost`, client-go's view may instead be exactly that ghost for `GHOST_HOLD` seconds.

        Returns, after a fault, how long each client took from `healed_at` to match for good.
        """
        started = time.monotonic()
        origin = started if healed_at is None else healed_at
        deadline = started + self._config.quiesce_timeout
        matched_since: dict[str, float | None] = dict.fromkeys(
            ("ours", "client-go", "reconciled", "ghost")
        )
        previous_truth: View | None = None
        last: Comparison | None = None
        kept_ghost: str | None = None
        list_error = ""
        while True:
            self._rig.check_alive()
            now = time.monotonic()
            try:
                comparison = await self._compare()
            except _ListFailed as err:
                list_error = str(err)
                comparison = None
            if comparison is not None:
                last = comparison
                ghost_seen = None if ghost is None else ghost.explain(comparison)
                for view, ok in (
                    ("ours", comparison.ours_matches),
                    ("client-go", comparison.oracle_matches),
                    ("reconciled", comparison.ours_matches and comparison.reconciled_matches),
                    ("ghost", ghost_seen is not None),
                ):
                    if not ok:
                        matched_since[view] = None
                    elif matched_since[view] is None:
                        matched_since[view] = now
                kept_ghost = ghost_seen if _held(matched_since["ghost"], now) else None
                settled = comparison.all_match or (
                    kept_ghost is not None and matched_since["reconciled"] is not None
                )
                if settled and comparison.truth == previous_truth:
                    self.agreed = comparison.truth
                    break
                previous_truth = comparison.truth
            if time.monotonic() > deadline:
                self._fail(what, last, list_error)
            await asyncio.sleep(_POLL_INTERVAL)
        self._stats.checkpoints += 1
        if last is not None and last.pools is not None:
            self._stats.pool_checkpoints += 1
        await self._rig.ours.forget_recordings()
        if healed_at is None:
            return None
        since = {view: max(0.0, (at or origin) - origin) for view, at in matched_since.items()}
        return Convergence(
            ours=since["ours"],
            client_go=None if kept_ghost is not None else since["client-go"],
            reconciled=since["reconciled"],
            client_go_diverged=kept_ghost,
        )

    async def agreed_checkpoint(self, what: str) -> View:
        """A checkpoint; returns the fresh LIST every view agreed with."""
        await self.checkpoint(what)
        return self.agreed

    def relist_counts(self) -> tuple[int, int]:
        """How many times ours and client-go had listed at the last comparison."""
        self._stats.our_lists = self._our_lists
        self._stats.oracle_lists = self._oracle_lists
        return self._stats.our_lists, self._stats.oracle_lists

    def _fail(self, what: str, last: Comparison | None, list_error: str) -> None:
        config = self._config
        if last is None:
            raise HarnessAborted(
                f"{what}: no comparison could be made in {config.quiesce_timeout:.0f}s; "
                f"last failure: {list_error or 'none recorded'}"
            )
        self._stats.divergences += 1
        self._stats.divergences_by_kind.update(last.kinds_differing())
        raise DivergenceError(
            f"{what}: the views did not agree within {config.quiesce_timeout:.0f}s "
            f"(seed {config.seed}, namespace {self._rig.namespace})\n{last.describe()}"
        )

    async def _compare(self) -> Comparison:
        truth = await self._fresh_list()
        pool_truth = await self._fresh_pool_list() if self._config.engine_pools else None
        ours = await self._our_views()
        snapshot = await _read(self._rig.oracle)
        pid, lists = self._oracle_process
        if pid is not None and pid != self._rig.oracle.pid:
            self._oracle_lists_before += lists
        self._oracle_process = (self._rig.oracle.pid, snapshot.lists)
        self._oracle_lists = self._oracle_lists_before + snapshot.lists
        pools = None
        pool_oracle = self._rig.pool_oracle
        if pool_truth is not None and pool_oracle is not None:
            pools = Comparison(
                truth=pool_truth,
                ours=ours.pools or {},
                oracle=_view_of_snapshot(await _read(pool_oracle)),
                reconciled=ours.reconciled_pools or {},
            )
        return Comparison(
            truth=truth,
            ours=ours.store,
            oracle=_view_of_snapshot(snapshot),
            reconciled=ours.reconciled,
            pools=pools,
        )

    async def _our_views(self) -> OurViews:
        try:
            views = await self._rig.ours.views()
        except OurLoopError as err:
            raise HarnessAborted(f"our loop cannot be read: {err}") from err
        self._our_lists = views.lists
        self.stored_pods = len(views.store)
        return views

    async def _fresh_list(self) -> dict[str, PodRow]:
        """A consistent LIST (resourceVersion unset) through the writers' apiserver."""
        try:
            resp = await self._rig.core.list_namespaced_pod(
                self._rig.namespace,
                label_selector=SELECTOR,
                _preload_content=False,
                _request_timeout=10,
            )
            try:
                status, body = resp.status, json.loads(await resp.read())
            finally:
                resp.release()
        except Exception as err:
            raise _ListFailed(f"fresh LIST failed: {type(err).__name__}: {err}") from err
        if status != 200:
            raise _ListFailed(f"fresh LIST answered HTTP {status}: {body}")
        return view_of_json(body["items"], parent_of=parent_of)

    async def _fresh_pool_list(self) -> dict[str, PodRow]:
        """A consistent LIST of the engine pools, as `_fresh_list` of the pods."""
        pools = ENGINE_POOLS
        try:
            body = await self._rig.custom.list_namespaced_custom_object(
                pools.group,
                pools.version,
                self._rig.namespace,
                pools.plural,
                label_selector=SELECTOR,
                _request_timeout=10,
            )
        except Exception as err:
            raise _ListFailed(
                f"fresh LIST of engine pools failed: {type(err).__name__}: {err}"
            ) from err
        return {
            item["metadata"]["name"]: pool_row_of_json(
                item, parent_of(item["metadata"].get("labels") or {})
            )
            for item in body["items"]
        }


async def _read(oracle: OracleProcess) -> OracleSnapshot:
    try:
        return await oracle.snapshot()
    except OracleError as err:
        raise HarnessAborted(f"the oracle cannot be read: {err}") from err


def _view_of_snapshot(snapshot: OracleSnapshot) -> dict[str, PodRow]:
    return view_of(
        ((n, p.uid, p.resource_version, p.labels) for n, p in snapshot.pods.items()),
        parent_of=parent_of,
    )


def _held(since: float | None, now: float) -> bool:
    return since is not None and now - since >= GHOST_HOLD
