"""The pairing controller as a process: releases each gated inference pod onto its trainer's node,
under a ``Manager`` with optional leader election. Go: a kubebuilder ``cmd/main.go`` with one
reconciler (``ctrl.NewManager`` with ``LeaderElection``, ``mgr.Start(SetupSignalHandler())``).

    python -m miles.utils.workers.reconcile.examples.colocate_pairing --config pairing.json

Inference pods are created gated (``spec.schedulingGates`` holds ``gate``) and name their trainer
in ``trainer_label``; ``role_label`` says ``trainer`` or ``inference``. Trainer and inference pods
alike map to the trainer's name. Once the trainer has a node, each gated inference pod of it gets,
in one JSON patch guarded by the resourceVersion it was read at (``client.JsonPatch.guarded``,
sent by the write client), ``spec.nodeSelector`` ``node_label: <node>`` and loses ``gate`` (other
gates stay), and a ``Paired`` event about the pod says so (``kubectl describe pod``). A patch is
sent only while this process leads (the loop's gate, and a check right before the request).

The configuration is one JSON object (``PairingConfig``; a ConfigMap key in a Deployment). The
process connects with the service account when in a pod (``KUBERNETES_SERVICE_HOST`` set and no
kubeconfig given), else with ``--kubeconfig``, ``KUBECONFIG`` or ``~/.kube/config``. ``/healthz``
and ``/readyz`` answer on ``health_probe_bind_address``; ``/readyz`` fails while the last patch was
refused by authorization (``pods: patch`` missing from the Role), until one succeeds; each refused
attempt is one line, the loop's, which names the pod, the reason and the retry delay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from miles.utils.workers.k8s_types import Pod
from miles.utils.workers.reconcile.client import JsonPatch
from miles.utils.workers.reconcile.examples import controller_process
from miles.utils.workers.reconcile.examples.controller_process import (
    ConfigError as ConfigError,
)
from miles.utils.workers.reconcile.examples.controller_process import (
    ExplainedFailure,
    ProcessConfig,
    connected,
    main_of,
)
from miles.utils.workers.reconcile.examples.controller_process import (
    NotLeadingError as NotLeadingError,
)
from miles.utils.workers.reconcile.examples.controller_process import (
    identity_of as identity_of,
)
from miles.utils.workers.reconcile.examples.controller_process import (
    without_traceback as without_traceback,
)
from miles.utils.workers.reconcile.k8s_errors import (
    ConflictError,
    ForbiddenError,
    KubernetesApiError,
)
from miles.utils.workers.reconcile.loop import Leadership
from miles.utils.workers.reconcile.resource import PODS, Resource

logger = logging.getLogger("colocate_pairing")

PERMITTED_CHECK = "pairing-permitted"
CONFLICT_STATUSES = (409, 422)
"""The codes of a failed ``test`` of the resourceVersion (422) and of a write conflict (409); the
write client raises both as ``ConflictError``: the pod changed since it was read, and the watch
brings the new version to another reconcile."""
EVENT_COMPONENT = "colocate-pairing"
PAIRED_REASON = "Paired"


class PodPatcher(Protocol):
    """The write the reconciler needs: ``client.Client.patch`` of one pod."""

    async def patch(
        self, resource: Resource, name: str, patch: JsonPatch, *, namespace: str | None = None
    ) -> Any: ...


class EventRecording(Protocol):
    """``events.EventRecorder.record``, as the reconciler uses it."""

    def record(
        self, obj: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None: ...


class LeaderElectionConfig(controller_process.LeaderElectionConfig):
    """Leader election, on the Lease ``colocate-pairing`` by default."""

    lease_name: str = "colocate-pairing"


class PairingConfig(ProcessConfig):
    """The process's configuration file."""

    selector: str = ""
    gate: str = "miles.io/paired-with-trainer"
    trainer_label: str = "miles.io/trainer"
    role_label: str = "miles.io/role"
    node_label: str = "kubernetes.io/hostname"
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)


def load_config(path: Path) -> PairingConfig:
    return controller_process.load_config(path, PairingConfig)


@dataclass(frozen=True)
class Pairing:
    """One reconcile: the trainer, the node it saw it on (None: no trainer on a node yet), the
    pods mapped to it, and the inference pods released by this pass."""

    trainer: str
    node: str | None
    members: frozenset[str]
    released: tuple[str, ...] = ()


class PairingForbiddenError(ExplainedFailure):
    """Authorization refused the patch; the loop retries the trainer with its backoff."""


class ColocatePairing:
    """The reconciler: ``pair(trainer, members)`` releases the trainer's gated inference pods."""

    def __init__(
        self,
        *,
        namespace: str,
        config: PairingConfig,
        client: PodPatcher | None = None,
        core_v1_api: Any = None,
        recorder: EventRecording | None = None,
        leadership: Leadership | None = None,
        on_pass: Callable[[Pairing], None] | None = None,
    ) -> None:
        """``client`` sends the patches (a ``client.Client``); ``core_v1_api``, the older way to
        say where, is a ``CoreV1Api`` whose ``ApiClient`` a ``Client`` is built on. ``recorder``,
        when given, gets one ``Paired`` event per pod released."""
        if client is None:
            if core_v1_api is None:
                raise ValueError("ColocatePairing needs a client (or a core_v1_api)")
            client = _client_beside(core_v1_api)
        self._client = client
        self._recorder = recorder
        self._namespace = namespace
        self._config = config
        self._leadership = leadership
        self._on_pass = on_pass
        self._refused: str | None = None
        self.patches_sent = 0

    def trainer_of(self, pod: Pod) -> str | None:
        """The loop's ``key_map``."""
        return pod.metadata.labels.get(self._config.trainer_label) or None

    def check(self) -> str | None:
        """A readiness check: why this process cannot act (its last patch was forbidden)."""
        return self._refused

    async def pair(self, trainer_name: str, members: Iterable[Pod]) -> Pairing:
        pods = list(members)
        node = self._trainer_node(trainer_name, pods)
        released: list[str] = []
        if node is not None:
            for pod in pods:
                if self._waits(pod) and await self._release(trainer_name, pod, node):
                    released.append(str(pod.metadata.name))
        pairing = Pairing(
            trainer_name, node, frozenset(str(p.metadata.name) for p in pods), tuple(released)
        )
        if self._on_pass is not None:
            self._on_pass(pairing)
        return pairing

    def _trainer_node(self, trainer_name: str, pods: Sequence[Pod]) -> str | None:
        role = self._config.role_label
        for pod in pods:
            if (
                pod.metadata.name == trainer_name
                and pod.metadata.labels.get(role) == "trainer"
                and pod.metadata.deletion_timestamp is None
            ):
                return pod.spec.node_name
        return None

    def _waits(self, pod: Pod) -> bool:
        return pod.metadata.labels.get(self._config.role_label) == "inference" and (
            self._config.gate in _gates(pod)
        )

    def _patch(self, pod: Pod, node: str) -> JsonPatch:
        kept = [{"name": name} for name in _gates(pod) if name != self._config.gate]
        selector = {**pod.spec.node_selector, self._config.node_label: node}
        return JsonPatch.guarded(
            str(pod.metadata.resource_version),
            [
                {"op": "add", "path": "/spec/nodeSelector", "value": selector},
                {"op": "replace", "path": "/spec/schedulingGates", "value": kept}
                if kept
                else {"op": "remove", "path": "/spec/schedulingGates"},
            ],
        )

    async def _release(self, trainer: str, pod: Pod, node: str) -> bool:
        """Sends the patch; ``False`` if the pod changed since it was read."""
        name = f"{self._namespace}/{pod.metadata.name}"
        if self._leadership is not None and not self._leadership.is_leader():
            raise NotLeadingError(f"not leading: pod {name} was not patched")
        version = pod.metadata.resource_version
        try:
            self.patches_sent += 1
            patched = await self._client.patch(
                PODS, str(pod.metadata.name), self._patch(pod, node), namespace=self._namespace
            )
        except ConflictError:
            logger.info("pod %s changed since resourceVersion %s; not patched", name, version)
            return False
        except ForbiddenError as failure:
            self._refused = f"patch of pod {name} forbidden: {_reason(failure)}"
            raise PairingForbiddenError(f"{self._refused}; the Role needs pods: patch") from None
        self._refused = None
        logger.info(
            "released pod %s onto node %s (trainer %s, resourceVersion %s)",
            name,
            node,
            trainer,
            version,
        )
        if self._recorder is not None and isinstance(patched, Mapping):
            message = f"released onto node {node}, beside trainer {trainer}"
            self._recorder.record(patched, "Normal", PAIRED_REASON, message)
        return True


def _client_beside(core_v1_api: Any) -> PodPatcher:
    from miles.utils.workers.reconcile.client import Client
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport

    return Client(transport=KubernetesAsyncioTransport.beside(core_v1_api))


def _gates(pod: Pod) -> list[str | None]:
    return [gate.name for gate in pod.spec.scheduling_gates]


def _reason(failure: KubernetesApiError) -> str:
    return failure.message or f"{failure.code} {failure.reason}"


def pairing_loop(
    controller: ColocatePairing,
    *,
    pod_api: Any,
    namespace: str,
    selector: str,
    leadership: Leadership | None = None,
    metrics: Any = None,
) -> Any:
    """The ``ReconcileLoop`` that runs ``controller`` over the pods ``selector`` picks."""
    from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
    from miles.utils.workers.reconcile.loop import ReconcileLoop

    reflector = KubernetesReflector(
        kube_client=pod_api, namespace=namespace, label_selector=selector
    )

    async def reconcile(trainer: str) -> None:
        await controller.pair(trainer, loop.get_by_parent(trainer))

    loop = ReconcileLoop(
        source=reflector.watch,
        reconcile=reconcile,
        key_map=controller.trainer_of,
        metrics=metrics,
        leadership=leadership,
        name="colocate-pairing",
    )
    return loop


async def run(config: PairingConfig, kubeconfig: str | None, environ: Mapping[str, str]) -> int:
    from miles.utils.workers.reconcile.client import Client
    from miles.utils.workers.reconcile.events import ClientEventSink, EventRecorder
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
    from miles.utils.workers.reconcile.manager.manager import run_until_signalled

    async with connected(config, kubeconfig, environ) as process:
        client = Client(transport=process.transport)
        recorder = EventRecorder(sink=ClientEventSink(client), component=EVENT_COMPONENT)
        controller = ColocatePairing(
            client=client,
            recorder=recorder,
            namespace=process.namespace,
            config=config,
            leadership=process.elector,
        )
        loop = pairing_loop(
            controller,
            pod_api=KubernetesAsyncioPodApi(core_v1_api=process.core_v1_api),
            namespace=process.namespace,
            selector=config.selector,
            leadership=process.elector,
            metrics=process.metrics,
        )
        manager = process.manager(loop)
        manager.readyz.add(PERMITTED_CHECK, controller.check)
        logger.info(
            "pairing pods in namespace %s (selector %r)", process.namespace, config.selector
        )
        async with recorder:
            return await run_until_signalled(manager)


def main(argv: Sequence[str] | None = None) -> int:
    return main_of(
        prog="colocate_pairing", description=__doc__, config=PairingConfig, run=run, argv=argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
