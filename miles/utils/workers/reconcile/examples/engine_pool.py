"""The engine-pool operator: an ``EnginePool`` custom resource keeps ``spec.replicas`` pods made
from ``spec.template``, as a StatefulSet keeps its ordinals. Go: kubebuilder's tutorial operator
(a ``Reconcile`` of a custom resource owning pods, ``cmd/main.go`` with its ``Manager``).

    python -m miles.utils.workers.reconcile.examples.engine_pool --config engine-pool.json

Each pool ``P`` owns the pods ``P-0`` .. ``P-(n-1)`` (its controller reference on each): a name is
created only when no pod holds it, so a second copy cannot exist (the apiserver's AlreadyExists
is the safety net, and the loop's read-your-writes gate keeps the next reconcile until the cache
holds this one's writes). Scaling up creates the missing ordinals; scaling down deletes the
ordinals past ``spec.replicas`` (each delete guarded by the pod's uid) before anything is
created, so the pool's pods that are not terminating never outnumber the larger of the old and
the new ``spec.replicas``. A name still held by a terminating pod waits for it to go.

``status`` is written through the status subresource when it changes: ``replicas`` (pods not
terminating), ``readyReplicas``, ``observedGeneration`` and a ``Ready`` condition
(``metav1.Condition``; its ``lastTransitionTime`` moves only when its status does). Each create
and delete is an Event on the pool (``SuccessfulCreate``, ``SuccessfulDelete``, a StatefulSet's
reasons). The finalizer ``miles.io/drain`` runs the drain step once before the pool goes: each of
its pods is annotated ``miles.io/draining``, one ``Draining`` Event is recorded and the pool is
annotated ``miles.io/drained`` (so a retried cleanup does not drain again); then the finalizer is
removed and the garbage collector deletes the pods. Writes are sent only while this process leads.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import Field

from miles.utils.workers.k8s_types import Pod
from miles.utils.workers.reconcile.client import MergePatch, Patch, Preconditions
from miles.utils.workers.reconcile.client.encoding import to_wire
from miles.utils.workers.reconcile.controllerutil import Finalizer, set_controller_reference
from miles.utils.workers.reconcile.examples.controller_process import (
    LeaderElectionConfig,
    ProcessConfig,
    connected,
    main_of,
)
from miles.utils.workers.reconcile.examples.controller_process import (
    NotLeadingError as NotLeadingError,
)
from miles.utils.workers.reconcile.examples.controller_process import (
    without_traceback as without_traceback,
)
from miles.utils.workers.reconcile.k8s_errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
)
from miles.utils.workers.reconcile.k8s_objects import KubernetesModel, KubernetesObject
from miles.utils.workers.reconcile.loop import Leadership, ReconcileLoop
from miles.utils.workers.reconcile.own_writes import DispatchGate, OwnWrites
from miles.utils.workers.reconcile.owner_key_map import owner_key_map
from miles.utils.workers.reconcile.resource import PODS, Resource
from miles.utils.workers.reconcile.source_event import ParentKey
from miles.utils.workers.reconcile.watches import Watch

logger = logging.getLogger("engine_pool")

ENGINE_POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
FINALIZER = "miles.io/drain"
POOL_LABEL = "miles.io/engine-pool"
DRAINING_ANNOTATION = "miles.io/draining"
DRAINED_ANNOTATION = "miles.io/drained"
EVENT_COMPONENT = "engine-pool"
CREATED_REASON = "SuccessfulCreate"
DELETED_REASON = "SuccessfulDelete"
DRAINING_REASON = "Draining"
READY = "Ready"


class EnginePoolSpec(KubernetesModel):
    replicas: int = 0
    template: dict[str, Any] = Field(default_factory=dict)
    """A pod template: ``metadata`` (labels, annotations) and ``spec``."""


class EnginePool(KubernetesObject):
    """The custom resource as this operator reads it; ``status`` as the apiserver holds it."""

    spec: EnginePoolSpec = Field(default_factory=EnginePoolSpec)
    status: dict[str, Any] = Field(default_factory=dict)


class PoolClient(Protocol):
    """The writes the operator makes, as ``client.Client`` makes them."""

    async def create(
        self, resource: Resource, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]: ...

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Patch,
        *,
        namespace: str | None = None,
        subresource: str = "",
    ) -> dict[str, Any]: ...

    async def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        preconditions: Preconditions | None = None,
    ) -> dict[str, Any]: ...


class EventRecording(Protocol):
    """``events.EventRecorder.record``, as the operator uses it."""

    def record(
        self, obj: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None: ...


@dataclass(frozen=True)
class ScalePlan:
    """One pass's changes: the ordinals' names to create, the pods to delete (highest ordinal
    first), and the names waiting for a terminating pod to go."""

    create: tuple[str, ...] = ()
    delete: tuple[Pod, ...] = ()
    waiting: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolPass:
    """What one reconcile of a pool did."""

    pool: str
    created: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    status: Mapping[str, Any] | None = None
    """The status written, if it changed."""
    drained: tuple[str, ...] | None = None
    """The pods the drain step annotated, when it ran."""


def pod_name(pool: str, ordinal: int) -> str:
    return f"{pool}-{ordinal}"


def ordinal_of(pool: str, name: str) -> int | None:
    """``i`` for ``<pool>-<i>`` (no leading zero), else ``None``."""
    prefix = f"{pool}-"
    suffix = name[len(prefix) :] if name.startswith(prefix) else ""
    if not suffix.isdigit() or (suffix != "0" and suffix.startswith("0")):
        return None
    return int(suffix)


def _rank(pool: str, name: str) -> int:
    """The ordinal, ``-1`` for an owned pod without one (deleted, last)."""
    ordinal = ordinal_of(pool, name)
    return -1 if ordinal is None else ordinal


def controlled_by(pod: Pod, pool: EnginePool) -> bool:
    """``pod``'s controller reference names this pool (its kind and uid)."""
    return any(
        ref.controller is True and ref.kind == ENGINE_POOLS.kind and ref.uid == pool.metadata.uid
        for ref in pod.metadata.owner_references
    )


def terminating(pod: Pod) -> bool:
    return pod.metadata.deletion_timestamp is not None


def plan_scale(pool: EnginePool, pods: Sequence[Pod]) -> ScalePlan:
    """The pass that moves ``pods`` (every pod mapped to the pool, owned or holding a name of
    it) toward ``spec.replicas``: the owned pods past the last ordinal (or with none) deleted,
    the names below it that no pod holds created."""
    name = pool.metadata.name
    replicas = max(pool.spec.replicas, 0)
    live = [p for p in pods if controlled_by(p, pool) and not terminating(p)]
    rank = {p.metadata.name: _rank(name, p.metadata.name) for p in live}
    extra = [p for p in live if rank[p.metadata.name] < 0 or rank[p.metadata.name] >= replicas]
    extra.sort(key=lambda p: rank[p.metadata.name], reverse=True)
    held = {p.metadata.name: p for p in pods}
    wanted = [pod_name(name, i) for i in range(replicas)]
    return ScalePlan(
        create=tuple(n for n in wanted if n not in held),
        delete=tuple(extra),
        waiting=tuple(n for n in wanted if n in held and terminating(held[n])),
    )


def pod_ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)


def desired_status(pool: EnginePool, pods: Sequence[Pod], now: datetime) -> dict[str, Any]:
    """The status ``pods`` say: counts of the owned pods not terminating, the generation seen and
    the ``Ready`` condition (true once every wanted replica exists and is ready)."""
    live = [p for p in pods if controlled_by(p, pool) and not terminating(p)]
    ready = sum(1 for p in live if pod_ready(p))
    wanted = pool.spec.replicas
    if len(live) < wanted:
        reason, message = "ScalingUp", f"{len(live)} of {wanted} pods exist"
    elif len(live) > wanted:
        reason, message = "ScalingDown", f"{len(live)} pods exist, {wanted} wanted"
    elif ready < wanted:
        reason, message = "PodsNotReady", f"{ready} of {wanted} pods ready"
    else:
        reason, message = "AllPodsReady", f"{ready} of {wanted} pods ready"
    status = "True" if reason == "AllPodsReady" else "False"
    generation = pool.metadata.generation
    condition = {
        "type": READY,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": _transition_time(pool, status, now),
    }
    return {
        "replicas": len(live),
        "readyReplicas": ready,
        "observedGeneration": generation,
        "conditions": [condition],
    }


def _transition_time(pool: EnginePool, status: str, now: datetime) -> str:
    """``meta.SetStatusCondition``: the time moves only when the condition's status does."""
    for condition in pool.status.get("conditions") or ():
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == READY
            and condition.get("status") == status
            and condition.get("lastTransitionTime")
        ):
            return str(condition["lastTransitionTime"])
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_manifest(pool: Mapping[str, Any], name: str, template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod ``name`` of ``pool`` (its wire form) from ``template``, with the pool's label and
    controller reference."""
    metadata = template.get("metadata") or {}
    pool_name = pool["metadata"]["name"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pool["metadata"]["namespace"],
            "labels": {**(metadata.get("labels") or {}), POOL_LABEL: pool_name},
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": dict(template.get("spec") or {}),
    }
    set_controller_reference(pool, pod)
    return pod


class EnginePoolOperator:
    """The reconciler: ``reconcile(pool, pods)`` runs one pass of the module's flow for a pool
    (``None``: gone, nothing to do) and the pods its key map names."""

    def __init__(
        self,
        *,
        client: PoolClient,
        recorder: EventRecording,
        namespace: str,
        leadership: Leadership | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._recorder = recorder
        self._namespace = namespace
        self._leadership = leadership
        self._wall = wall
        self._finalizer = Finalizer(name=FINALIZER, client=client, resource=ENGINE_POOLS)

    async def reconcile(self, pool: EnginePool | None, pods: Sequence[Pod]) -> PoolPass | None:
        if pool is None:
            return None
        wire = to_wire(pool)

        async def apply(_: Mapping[str, Any]) -> PoolPass:
            return await self._scale(pool, wire, pods)

        async def cleanup(_: Mapping[str, Any]) -> PoolPass:
            return await self._drain(pool, wire, pods)

        self._must_lead(f"EnginePool {self._namespace}/{pool.metadata.name}")
        return await self._finalizer.reconcile(wire, apply=apply, cleanup=cleanup)

    async def _scale(
        self, pool: EnginePool, wire: Mapping[str, Any], pods: Sequence[Pod]
    ) -> PoolPass:
        plan = plan_scale(pool, pods)
        deleted = [name for pod in plan.delete if (name := await self._delete(pool, wire, pod))]
        created = [name for name in plan.create if await self._create(pool, wire, name)]
        status = desired_status(pool, pods, datetime.fromtimestamp(self._wall(), UTC))
        written = None
        if status != {k: pool.status.get(k) for k in status}:
            self._must_lead(f"status of EnginePool {self._namespace}/{pool.metadata.name}")
            await self._client.patch(
                ENGINE_POOLS,
                pool.metadata.name,
                MergePatch({"status": status}),
                namespace=self._namespace,
                subresource="status",
            )
            written = status
        return PoolPass(
            pool.metadata.name,
            created=tuple(created),
            deleted=tuple(deleted),
            waiting=plan.waiting,
            status=written,
        )

    async def _create(self, pool: EnginePool, wire: Mapping[str, Any], name: str) -> bool:
        where = f"{self._namespace}/{name}"
        self._must_lead(f"pod {where}")
        try:
            await self._client.create(
                PODS, pod_manifest(wire, name, pool.spec.template), namespace=self._namespace
            )
        except AlreadyExistsError:
            logger.info("pod %s exists already; not created again", where)
            return False
        message = f"create Pod {name} in EnginePool {pool.metadata.name} successful"
        self._recorder.record(wire, "Normal", CREATED_REASON, message)
        logger.info("created pod %s", where)
        return True

    async def _delete(self, pool: EnginePool, wire: Mapping[str, Any], pod: Pod) -> str | None:
        name = pod.metadata.name
        where = f"{self._namespace}/{name}"
        self._must_lead(f"pod {where}")
        try:
            await self._client.delete(
                PODS,
                name,
                namespace=self._namespace,
                preconditions=Preconditions(uid=pod.metadata.uid),
            )
        except (NotFoundError, ConflictError):
            logger.info("pod %s (uid %s) is gone already; not deleted", where, pod.metadata.uid)
            return None
        message = f"delete Pod {name} in EnginePool {pool.metadata.name} successful"
        self._recorder.record(wire, "Normal", DELETED_REASON, message)
        logger.info("deleted pod %s", where)
        return name

    async def _drain(
        self, pool: EnginePool, wire: Mapping[str, Any], pods: Sequence[Pod]
    ) -> PoolPass:
        """The finalizer's cleanup: once per pool (its ``drained`` annotation says it ran)."""
        name = pool.metadata.name
        if DRAINED_ANNOTATION in pool.metadata.annotations:
            return PoolPass(name)
        live = [p for p in pods if controlled_by(p, pool) and not terminating(p)]
        for pod in live:
            if DRAINING_ANNOTATION not in pod.metadata.annotations:
                await self._annotate(PODS, pod.metadata.name, DRAINING_ANNOTATION, name)
        names = tuple(sorted(p.metadata.name for p in live))
        message = f"draining {len(names)} pods before EnginePool {name} goes: {', '.join(names)}"
        self._recorder.record(wire, "Normal", DRAINING_REASON, message)
        logger.info("drained EnginePool %s/%s: %s", self._namespace, name, ", ".join(names))
        stamp = datetime.fromtimestamp(self._wall(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self._annotate(ENGINE_POOLS, name, DRAINED_ANNOTATION, stamp)
        return PoolPass(name, drained=names)

    async def _annotate(self, resource: Resource, name: str, key: str, value: str) -> None:
        self._must_lead(f"{resource.kind} {self._namespace}/{name}")
        patch = MergePatch({"metadata": {"annotations": {key: value}}})
        with contextlib.suppress(NotFoundError):
            await self._client.patch(resource, name, patch, namespace=self._namespace)

    def _must_lead(self, what: str) -> None:
        if self._leadership is not None and not self._leadership.is_leader():
            raise NotLeadingError(f"not leading: {what} was not written")


class AllGates:
    """Several ``DispatchGate``s as one: a parent waits for each, and is dispatched inside all."""

    def __init__(self, *gates: DispatchGate) -> None:
        self._gates = gates

    async def wait(self, parent: ParentKey) -> None:
        for gate in self._gates:
            await gate.wait(parent)

    @contextlib.contextmanager
    def dispatching(self, parent: ParentKey) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for gate in self._gates:
                stack.enter_context(gate.dispatching(parent))
            yield


class EnginePoolLeaderElection(LeaderElectionConfig):
    """Leader election, on the Lease ``engine-pool`` by default."""

    lease_name: str = "engine-pool"


class EnginePoolConfig(ProcessConfig):
    """The process's configuration file."""

    leader_election: EnginePoolLeaderElection = Field(default_factory=EnginePoolLeaderElection)


def engine_pool_loop(
    operator: EnginePoolOperator,
    *,
    core_v1_api: Any,
    namespace: str,
    leadership: Leadership | None = None,
    metrics: Any = None,
    own_writes: Sequence[tuple[OwnWrites, Resource]] = (),
) -> ReconcileLoop:
    """The ``ReconcileLoop`` over the namespace's pools and the pods they own (mapped to their
    pool by its controller reference, controller-runtime's ``Owns``). ``own_writes`` pairs a
    read-your-writes tracker with the resource whose source it watches: each is awaited before a
    pool is dispatched again."""
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioResourceApi
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector

    def reflector(resource: Resource, model: type[Any], selector: str = "") -> Any:
        api = KubernetesAsyncioResourceApi.beside(core_v1_api, resource=resource, model=model)
        source = KubernetesReflector(
            api=api, namespace=namespace, label_selector=selector, name=resource.plural
        ).watch
        for tracker, tracked in own_writes:
            if tracked == resource:
                source = tracker.watching(source)
        return source

    async def reconcile(pool: ParentKey) -> None:
        await operator.reconcile(
            loop.cache("enginepools").get(pool), loop.cache("pods").get_by_parent(pool)
        )

    loop = ReconcileLoop(
        sources=[
            Watch(source=reflector(ENGINE_POOLS, EnginePool), name="enginepools"),
            Watch(
                source=reflector(PODS, Pod, POOL_LABEL),
                key_map=owner_key_map(ENGINE_POOLS, key="name"),
                name="pods",
            ),
        ],
        reconcile=reconcile,
        leadership=leadership,
        metrics=metrics,
        dispatch_gate=AllGates(*(tracker for tracker, _ in own_writes)) if own_writes else None,
        name="engine-pool",
    )
    return loop


async def run(config: EnginePoolConfig, kubeconfig: str | None, environ: Mapping[str, str]) -> int:
    from miles.utils.workers.reconcile.client import Client
    from miles.utils.workers.reconcile.events import ClientEventSink, EventRecorder
    from miles.utils.workers.reconcile.manager.manager import run_until_signalled

    async with connected(config, kubeconfig, environ) as process:
        pod_writes, pool_writes = OwnWrites(name="engine-pool"), OwnWrites(name="engine-pool")
        observers = (pod_writes.observer(PODS), pool_writes.observer(ENGINE_POOLS))

        def wrote(resource: Resource, version: str) -> None:
            for observer in observers:
                observer(resource, version)

        client = Client(transport=process.transport, field_manager=EVENT_COMPONENT, on_write=wrote)
        recorder = EventRecorder(
            sink=ClientEventSink(Client(transport=process.transport)), component=EVENT_COMPONENT
        )
        operator = EnginePoolOperator(
            client=client,
            recorder=recorder,
            namespace=process.namespace,
            leadership=process.elector,
        )
        loop = engine_pool_loop(
            operator,
            core_v1_api=process.core_v1_api,
            namespace=process.namespace,
            leadership=process.elector,
            metrics=process.metrics,
            own_writes=((pod_writes, PODS), (pool_writes, ENGINE_POOLS)),
        )
        logger.info("operating EnginePools in namespace %s", process.namespace)
        async with recorder:
            return await run_until_signalled(process.manager(loop))


def main(argv: Sequence[str] | None = None) -> int:
    return main_of(
        prog="engine_pool", description=__doc__, config=EnginePoolConfig, run=run, argv=argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
