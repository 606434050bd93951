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

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miles.utils.workers.k8s_types import Pod
from miles.utils.workers.reconcile.client import JsonPatch
from miles.utils.workers.reconcile.k8s_errors import (
    ConflictError,
    ForbiddenError,
    KubernetesApiError,
)
from miles.utils.workers.reconcile.leaderelection.leader_election import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
)
from miles.utils.workers.reconcile.loop import Leadership
from miles.utils.workers.reconcile.manager.manager import (
    DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
    DEFAULT_HEALTH_PROBE_ADDRESS,
    DEFAULT_METRICS_ADDRESS,
)
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


class LeaderElectionConfig(BaseModel):
    """Go: CR ``Options.LeaderElection*`` and client-go's timings (their defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False
    lease_name: str = "colocate-pairing"
    lease_namespace: str | None = None
    """Default: the namespace the controller watches."""
    identity: str | None = None
    """Default: ``$POD_NAME``, else the hostname and a UUID (CR's ``getInClusterNamespace`` id)."""
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD


class PairingConfig(BaseModel):
    """The process's configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str | None = None
    """Default: the service account's namespace, else the kubeconfig context's."""
    selector: str = ""
    gate: str = "miles.io/paired-with-trainer"
    trainer_label: str = "miles.io/trainer"
    role_label: str = "miles.io/role"
    node_label: str = "kubernetes.io/hostname"
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    health_probe_bind_address: str = DEFAULT_HEALTH_PROBE_ADDRESS
    metrics_bind_address: str = DEFAULT_METRICS_ADDRESS
    graceful_shutdown_timeout: float = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT


class ConfigError(ValueError):
    """The configuration file cannot be read or is not a valid ``PairingConfig``; one line."""


def load_config(path: Path) -> PairingConfig:
    try:
        document = json.loads(path.read_text())
        return PairingConfig.model_validate(document)
    except OSError as exc:
        raise ConfigError(f"config {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config {path}: not JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"config {path}: {problems}") from None


def identity_of(configured: str | None, environ: Mapping[str, str]) -> str:
    """The lease holder's name: configured, else ``POD_NAME`` (the downward API), else
    ``<hostname>_<uuid>`` as CR makes it unique."""
    return configured or environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True)
class Pairing:
    """One reconcile: the trainer, the node it saw it on (None: no trainer on a node yet), the
    pods mapped to it, and the inference pods released by this pass."""

    trainer: str
    node: str | None
    members: frozenset[str]
    released: tuple[str, ...] = ()


class NotLeadingError(RuntimeError):
    """A patch was about to be sent while this process does not lead; none was sent."""


class PairingForbiddenError(RuntimeError):
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
    from miles.utils.workers.reconcile.k8s_api import (
        KubernetesAsyncioLeaseApi,
        KubernetesAsyncioPodApi,
        KubernetesAsyncioTransport,
        kube_session,
    )
    from miles.utils.workers.reconcile.k8s_config import KubeTarget
    from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
    from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseLock
    from miles.utils.workers.reconcile.manager.manager import Manager, run_until_signalled

    target = KubeTarget(kubeconfig=kubeconfig, namespace=config.namespace)
    async with kube_session(target, environ) as session:
        namespace = session.namespace
        election = config.leader_election
        elector = None
        if election.enabled:
            lock = LeaseLock(
                lease_api=KubernetesAsyncioLeaseApi.beside(session.core_v1_api),
                namespace=election.lease_namespace or namespace,
                name=election.lease_name,
                identity=identity_of(election.identity, environ),
            )
            elector = LeaderElector(
                lock=lock,
                lease_duration=election.lease_duration,
                renew_deadline=election.renew_deadline,
                retry_period=election.retry_period,
            )
            logger.info("leader election on Lease %s as %s", lock.describe(), lock.identity)
        client = Client(transport=KubernetesAsyncioTransport.beside(session.core_v1_api))
        recorder = EventRecorder(sink=ClientEventSink(client), component=EVENT_COMPONENT)
        controller = ColocatePairing(
            client=client,
            recorder=recorder,
            namespace=namespace,
            config=config,
            leadership=elector,
        )
        metrics = config.metrics_bind_address not in ("", "0")
        loop = pairing_loop(
            controller,
            pod_api=KubernetesAsyncioPodApi(core_v1_api=session.core_v1_api),
            namespace=namespace,
            selector=config.selector,
            leadership=elector,
            metrics=_global_registry() if metrics else None,
        )
        manager = Manager(
            loops=[loop],
            elector=elector,
            health_probe_address=config.health_probe_bind_address,
            metrics_address=config.metrics_bind_address,
            graceful_shutdown_timeout=config.graceful_shutdown_timeout,
        )
        manager.readyz.add(PERMITTED_CHECK, controller.check)
        logger.info("pairing pods in namespace %s (selector %r)", namespace, config.selector)
        async with recorder:
            return await run_until_signalled(manager)


def _global_registry() -> Any:
    from prometheus_client import REGISTRY

    return REGISTRY


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="colocate_pairing", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, help="a JSON PairingConfig (default: all defaults)")
    parser.add_argument(
        "--kubeconfig", help="path to a kubeconfig (default: in-cluster, then the usual places)"
    )
    return parser.parse_args(argv)


def without_traceback(record: logging.LogRecord) -> bool:
    """A logging filter: the loop's line for a refusal this module explains carries no stack, so
    each attempt is one line (the loop's, with its retry delay)."""
    if record.exc_info and isinstance(record.exc_info[1], (PairingForbiddenError, NotLeadingError)):
        record.exc_info = None
    return True


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("miles.utils.workers.reconcile.loop").addFilter(without_traceback)
    args = parse_args(argv)
    try:
        config = PairingConfig() if args.config is None else load_config(args.config)
        return asyncio.run(run(config, args.kubeconfig, os.environ))
    except Exception as exc:
        print(f"colocate_pairing: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
