"""Fast layer: the engine-pool operator's decisions (``examples/engine_pool.py``) against a fake
namespace that applies its writes as the apiserver does (create by name once, delete guarded by
uid leaving the pod terminating, JSON and merge patches, the status subresource), on a
``FakeClock``'s wall time: scale up and down by ordinal, the count bound while a change is under
way, names never held twice, the status and its Ready condition, the drain run once."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from miles.utils.workers.k8s_types import Pod
from miles.utils.workers.reconcile.client import MergePatch, Patch, Preconditions
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.examples.engine_pool import (
    CREATED_REASON,
    DELETED_REASON,
    DRAINED_ANNOTATION,
    DRAINING_ANNOTATION,
    DRAINING_REASON,
    ENGINE_POOLS,
    FINALIZER,
    POOL_LABEL,
    AllGates,
    EnginePool,
    EnginePoolConfig,
    EnginePoolOperator,
    NotLeadingError,
    main,
    ordinal_of,
)
from miles.utils.workers.reconcile.k8s_errors import api_error
from miles.utils.workers.reconcile.owner_key_map import owner_key_map
from miles.utils.workers.reconcile.resource import PODS, Resource

NAMESPACE = "ns"
START = 1_780_000_000.0
TEMPLATE = {
    "metadata": {"labels": {"app": "engine"}},
    "spec": {"containers": [{"name": "engine", "image": "engine:1"}]},
}


@dataclass
class FakeNamespace:
    """The pool and its pods as the apiserver holds them, written by the operator's client."""

    pool: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)
    max_live: int = 0
    refused_creates: int = 0
    uids: Any = field(default_factory=lambda: itertools.count(1))

    def live(self) -> int:
        return sum(1 for p in self.pods.values() if "deletionTimestamp" not in p["metadata"])

    def _wrote(self, verb: str, name: str) -> None:
        self.writes.append((verb, name))
        self.max_live = max(self.max_live, self.live())

    async def create(
        self, resource: Resource, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        assert (resource, namespace) == (PODS, NAMESPACE)
        name = obj["metadata"]["name"]
        if name in self.pods:
            self.refused_creates += 1
            raise api_error(409, "AlreadyExists", f'pods "{name}" already exists')
        pod = copy.deepcopy(dict(obj))
        pod["metadata"]["uid"] = f"uid-{next(self.uids)}"
        self.pods[name] = pod
        self._wrote("create", name)
        return copy.deepcopy(pod)

    async def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        preconditions: Preconditions | None = None,
    ) -> dict[str, Any]:
        assert (resource, namespace) == (PODS, NAMESPACE)
        pod = self.pods.get(name)
        if pod is None:
            raise api_error(404, "NotFound", f'pods "{name}" not found')
        if preconditions is not None and preconditions.uid != pod["metadata"]["uid"]:
            raise api_error(409, "Conflict", "Precondition failed: UID in precondition")
        pod["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
        self._wrote("delete", name)
        return copy.deepcopy(pod)

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        subresource: str = "",
    ) -> dict[str, Any]:
        assert namespace == NAMESPACE
        target = self.pool if resource == ENGINE_POOLS else self.pods[name]
        body = patch.wire()
        if isinstance(patch, MergePatch):
            if subresource == "status":
                target["status"] = copy.deepcopy(body["status"])
            else:
                annotations = target["metadata"].setdefault("annotations", {})
                annotations.update(body["metadata"]["annotations"])
        else:
            _json_patch_finalizers(target, body)
        self._wrote(f"patch {subresource}".strip(), name)
        return copy.deepcopy(target)

    def pool_model(self) -> EnginePool:
        return EnginePool.model_validate(copy.deepcopy(self.pool))

    def pod_models(self) -> list[Pod]:
        return [Pod.model_validate(copy.deepcopy(p)) for p in self.pods.values()]

    def scale(self, replicas: int) -> None:
        self.pool["spec"]["replicas"] = replicas
        self.pool["metadata"]["generation"] += 1

    def kubelet(self, *, ready: bool = True) -> None:
        """Terminating pods go; the others report Ready."""
        for name in [n for n, p in self.pods.items() if "deletionTimestamp" in p["metadata"]]:
            del self.pods[name]
        for pod in self.pods.values():
            status = "True" if ready else "False"
            pod["status"] = {"conditions": [{"type": "Ready", "status": status}]}


def _json_patch_finalizers(obj: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    finalizers = obj["metadata"].get("finalizers")
    for op in ops:
        path = op["path"]
        if op["op"] == "test":
            actual = finalizers if path == "/metadata/finalizers" else finalizers[int(path[21:])]
            if actual != op["value"]:
                raise api_error(422, "Invalid", f"testing value {path} failed")
        elif op["op"] == "add":
            finalizers = (
                list(op["value"])
                if path == "/metadata/finalizers"
                else [
                    *(finalizers or []),
                    op["value"],
                ]
            )
        else:
            finalizers = [f for i, f in enumerate(finalizers) if i != int(path[21:])]
    obj["metadata"]["finalizers"] = finalizers


@dataclass
class Events:
    recorded: list[tuple[str, str, str, str]] = field(default_factory=list)

    def record(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        self.recorded.append((obj["metadata"]["name"], event_type, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.recorded]


@dataclass
class Leading:
    leader: bool = True

    def is_leader(self) -> bool:
        return self.leader

    async def wait_until_leading(self) -> None:
        return None


def _pool(replicas: int, *, finalizers: tuple[str, ...] = (FINALIZER,)) -> dict[str, Any]:
    return {
        "apiVersion": ENGINE_POOLS.api_version,
        "kind": "EnginePool",
        "metadata": {
            "name": "pool",
            "namespace": NAMESPACE,
            "uid": "pool-uid",
            "generation": 1,
            "resourceVersion": "10",
            # The apiserver omits an empty list.
            **({"finalizers": list(finalizers)} if finalizers else {}),
        },
        "spec": {"replicas": replicas, "template": TEMPLATE},
    }


@dataclass
class Harness:
    cluster: FakeNamespace
    events: Events
    clock: FakeClock
    leading: Leading
    operator: EnginePoolOperator

    async def reconcile(self, pods: list[Pod] | None = None) -> Any:
        """One pass over the pool and ``pods`` (default: the pods as they are now)."""
        seen = self.cluster.pod_models() if pods is None else pods
        return await self.operator.reconcile(self.cluster.pool_model(), seen)


def _harness(replicas: int, **pool: Any) -> Harness:
    cluster = FakeNamespace(_pool(replicas, **pool))
    events, clock, leading = Events(), FakeClock(START), Leading()
    operator = EnginePoolOperator(
        client=cluster,
        recorder=events,
        namespace=NAMESPACE,
        leadership=leading,
        wall=clock.time,
    )
    return Harness(cluster, events, clock, leading, operator)


async def test_the_first_pass_adds_the_finalizer_and_nothing_else() -> None:
    h = _harness(3, finalizers=())
    assert await h.reconcile() is None
    assert h.cluster.pool["metadata"]["finalizers"] == [FINALIZER]
    assert h.cluster.pods == {}
    assert h.events.recorded == []


async def test_scale_up_creates_the_missing_ordinals_owned_by_the_pool_once() -> None:
    h = _harness(3)
    done = await h.reconcile()
    assert done.created == ("pool-0", "pool-1", "pool-2")
    pod = h.cluster.pods["pool-1"]
    assert pod["metadata"]["labels"] == {"app": "engine", POOL_LABEL: "pool"}
    assert pod["spec"] == TEMPLATE["spec"]
    (ref,) = pod["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "miles.io/v1alpha1",
        "kind": "EnginePool",
        "name": "pool",
        "uid": "pool-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert owner_key_map(ENGINE_POOLS, key="name")(Pod.model_validate(pod)) == "pool"
    assert h.events.reasons() == [CREATED_REASON] * 3
    assert "create Pod pool-2 in EnginePool pool successful" in h.events.recorded[2][3]
    # A stale cache (the pods not seen yet) creates nothing twice: AlreadyExists is the net.
    again = await h.reconcile([])
    assert again.created == ()
    assert h.cluster.refused_creates == 3
    assert len(h.cluster.pods) == 3
    assert len(h.events.recorded) == 3


async def test_scale_down_deletes_the_highest_ordinals_first_guarded_by_uid() -> None:
    h = _harness(5)
    await h.reconcile()
    h.cluster.kubelet()
    h.cluster.scale(1)
    done = await h.reconcile()
    assert done.deleted == ("pool-4", "pool-3", "pool-2", "pool-1")
    assert done.created == ()
    assert h.events.reasons()[-4:] == [DELETED_REASON] * 4
    # The terminating pods are not deleted again.
    again = await h.reconcile()
    assert again.deleted == ()
    assert again.created == ()


async def test_a_uid_precondition_spares_a_pod_recreated_under_the_same_name() -> None:
    h = _harness(1)
    await h.reconcile()
    stale = h.cluster.pod_models()
    h.cluster.pods["pool-0"]["metadata"]["uid"] = "someone-elses"
    h.cluster.scale(0)
    done = await h.reconcile(stale)
    assert done.deleted == ()
    assert "deletionTimestamp" not in h.cluster.pods["pool-0"]["metadata"]


async def test_a_name_held_by_a_terminating_pod_waits_for_it_to_go() -> None:
    h = _harness(2)
    await h.reconcile()
    await h.cluster.delete(PODS, "pool-0", namespace=NAMESPACE)
    done = await h.reconcile()
    assert done.created == ()
    assert done.waiting == ("pool-0",)
    h.cluster.kubelet()
    done = await h.reconcile()
    assert done.created == ("pool-0",)


async def test_live_pods_never_outnumber_the_larger_of_old_and_new_replicas() -> None:
    """Every write's moment, through a sequence of scalings with the kubelet lagging behind."""
    h = _harness(3)
    previous = 3
    for replicas in (3, 5, 1, 4, 0, 2, 2):
        h.cluster.scale(replicas)
        h.cluster.max_live = h.cluster.live()
        for _ in range(3):
            await h.reconcile()
            assert h.cluster.max_live <= max(previous, replicas)
        h.cluster.kubelet()
        await h.reconcile()
        assert h.cluster.max_live <= max(previous, replicas)
        assert h.cluster.live() == replicas
        names = sorted(h.cluster.pods)
        assert names == sorted(f"pool-{i}" for i in range(replicas))
        previous = replicas
    assert h.cluster.refused_creates == 0


async def test_status_says_what_the_pods_say_and_is_written_only_when_it_changes() -> None:
    h = _harness(2)
    await h.reconcile()
    h.cluster.kubelet(ready=False)
    done = await h.reconcile()
    assert done.status is not None
    status = h.cluster.pool["status"]
    assert status["replicas"] == 2
    assert status["readyReplicas"] == 0
    assert status["observedGeneration"] == 1
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Ready",
        "False",
        "PodsNotReady",
    )
    first_transition = condition["lastTransitionTime"]
    await h.clock.advance(60)
    assert (await h.reconcile()).status is None
    h.cluster.kubelet(ready=True)
    await h.reconcile()
    (condition,) = h.cluster.pool["status"]["conditions"]
    assert condition["status"] == "True"
    assert condition["reason"] == "AllPodsReady"
    assert condition["lastTransitionTime"] > first_transition
    assert h.cluster.pool["status"]["readyReplicas"] == 2
    h.cluster.scale(3)
    await h.reconcile()
    assert h.cluster.pool["status"]["observedGeneration"] == 2
    writes = [verb for verb, _ in h.cluster.writes]
    assert writes.count("patch status") == 4


async def test_deleting_the_pool_drains_once_then_removes_the_finalizer() -> None:
    h = _harness(2)
    await h.reconcile()
    h.cluster.kubelet()
    h.cluster.pool["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    done = await h.reconcile()
    assert done.drained == ("pool-0", "pool-1")
    assert all(
        p["metadata"]["annotations"][DRAINING_ANNOTATION] == "pool" for p in h.cluster.pods.values()
    )
    assert DRAINED_ANNOTATION in h.cluster.pool["metadata"]["annotations"]
    assert h.cluster.pool["metadata"]["finalizers"] == []
    assert h.events.reasons().count(DRAINING_REASON) == 1
    # A cleanup retried (the finalizer's removal failed) sees the annotation and drains no more.
    h.cluster.pool["metadata"]["finalizers"] = [FINALIZER]
    again = await h.reconcile()
    assert again.drained is None
    assert h.events.reasons().count(DRAINING_REASON) == 1
    assert h.cluster.pool["metadata"]["finalizers"] == []
    # Nothing is created for a pool being deleted.
    assert sorted(h.cluster.pods) == ["pool-0", "pool-1"]


async def test_nothing_is_written_while_not_leading() -> None:
    h = _harness(3)
    h.leading.leader = False
    with pytest.raises(NotLeadingError, match="not leading: EnginePool ns/pool"):
        await h.reconcile()
    assert h.cluster.writes == []


async def test_a_pool_gone_from_the_cache_is_left_alone() -> None:
    h = _harness(1)
    assert await h.operator.reconcile(None, h.cluster.pod_models()) is None
    assert h.cluster.writes == []


def test_ordinals_are_the_names_a_statefulset_gives() -> None:
    assert [ordinal_of("p", n) for n in ("p-0", "p-12", "p-01", "p-x", "q-1", "p-")] == [
        0,
        12,
        None,
        None,
        None,
        None,
    ]


async def test_all_gates_waits_for_each_and_dispatches_inside_all() -> None:
    entered: list[str] = []

    class Gate:
        def __init__(self, name: str) -> None:
            self.name = name

        async def wait(self, parent: str) -> None:
            entered.append(f"wait {self.name} {parent}")

        def dispatching(self, parent: str) -> Any:
            import contextlib

            @contextlib.contextmanager
            def inside() -> Any:
                entered.append(f"in {self.name}")
                yield
                entered.append(f"out {self.name}")

            return inside()

    gates = AllGates(Gate("a"), Gate("b"))
    await gates.wait("p")
    with gates.dispatching("p"):
        entered.append("reconcile")
    assert entered == ["wait a p", "wait b p", "in a", "in b", "reconcile", "out b", "out a"]


def test_the_lease_is_named_for_the_operator() -> None:
    assert EnginePoolConfig().leader_election.lease_name == "engine-pool"


def test_a_bad_configuration_is_one_line_and_exit_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "engine-pool.json"
    config.write_text('{"replicas": 3}')
    assert main(["--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err == f"engine_pool: config {config}: replicas: Extra inputs are not permitted\n"
