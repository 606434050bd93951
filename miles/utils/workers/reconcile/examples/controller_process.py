"""What every example controller process shares: its configuration file's common part, the
leader elector it builds from it, the connection it runs on, and its ``main``. Go: a kubebuilder
``cmd/main.go``'s flags and ``ctrl.Options`` (``LeaderElection*``, ``HealthProbeBindAddress``,
``Metrics.BindAddress``, ``GracefulShutdownTimeout``).

A process's configuration is one JSON object (a ConfigMap key in a Deployment): a
``ProcessConfig`` subclass adding the controller's own fields. The process connects with the
service account when in a pod (``KUBERNETES_SERVICE_HOST`` set and no kubeconfig given), else with
``--kubeconfig``, ``KUBECONFIG`` or ``~/.kube/config``.
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
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miles.utils.workers.reconcile.leaderelection.leader_election import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
)
from miles.utils.workers.reconcile.manager.manager import (
    DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
    DEFAULT_HEALTH_PROBE_ADDRESS,
    DEFAULT_METRICS_ADDRESS,
)

C = TypeVar("C", bound="ProcessConfig")

logger = logging.getLogger(__name__)


class LeaderElectionConfig(BaseModel):
    """Go: CR ``Options.LeaderElection*`` and client-go's timings (their defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False
    lease_name: str = "controller"
    lease_namespace: str | None = None
    """Default: the namespace the controller watches."""
    identity: str | None = None
    """Default: ``$POD_NAME``, else the hostname and a UUID (CR's ``getInClusterNamespace`` id)."""
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD


class ProcessConfig(BaseModel):
    """The fields of every controller process's configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str | None = None
    """Default: the service account's namespace, else the kubeconfig context's."""
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    health_probe_bind_address: str = DEFAULT_HEALTH_PROBE_ADDRESS
    metrics_bind_address: str = DEFAULT_METRICS_ADDRESS
    graceful_shutdown_timeout: float = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT

    @property
    def metrics_enabled(self) -> bool:
        """CR's ``"0"`` (and an empty address) turns the metrics server off."""
        return self.metrics_bind_address not in ("", "0")


class ConfigError(ValueError):
    """The configuration file cannot be read or is not a valid configuration; one line."""


def load_config(path: Path, model: type[C]) -> C:
    """``path``'s JSON object as ``model``; ``ConfigError`` naming the file and each problem."""
    try:
        document = json.loads(path.read_text())
        return model.model_validate(document)
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


def leader_elector(
    election: LeaderElectionConfig,
    *,
    core_v1_api: Any,
    namespace: str,
    environ: Mapping[str, str],
) -> Any:
    """The ``LeaderElector`` on ``election``'s Lease, or ``None`` when election is off."""
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioLeaseApi
    from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
    from miles.utils.workers.reconcile.leaderelection.lease_lock import LeaseLock

    if not election.enabled:
        return None
    lock = LeaseLock(
        lease_api=KubernetesAsyncioLeaseApi.beside(core_v1_api),
        namespace=election.lease_namespace or namespace,
        name=election.lease_name,
        identity=identity_of(election.identity, environ),
    )
    logger.info("leader election on Lease %s as %s", lock.describe(), lock.identity)
    return LeaderElector(
        lock=lock,
        lease_duration=election.lease_duration,
        renew_deadline=election.renew_deadline,
        retry_period=election.retry_period,
    )


def manager_of(config: ProcessConfig, *, loops: Sequence[Any], elector: Any) -> Any:
    """The ``Manager`` running ``loops`` with ``config``'s probes, metrics and grace."""
    from miles.utils.workers.reconcile.manager.manager import Manager

    return Manager(
        loops=loops,
        elector=elector,
        health_probe_address=config.health_probe_bind_address,
        metrics_address=config.metrics_bind_address,
        graceful_shutdown_timeout=config.graceful_shutdown_timeout,
    )


def global_registry() -> Any:
    from prometheus_client import REGISTRY

    return REGISTRY


@dataclass(frozen=True)
class Connected:
    """A process connected to its cluster, as ``connected`` yields it: the namespace it works in,
    the ``CoreV1Api`` (and a write transport on its ``ApiClient``), and the leader elector
    (``None`` when election is off). Go: what ``cmd/main.go`` holds after ``ctrl.NewManager``."""

    config: ProcessConfig
    namespace: str
    core_v1_api: Any
    transport: Any
    elector: Any

    @property
    def metrics(self) -> Any:
        """The registry a loop reports to; ``None`` when the metrics server is off."""
        return global_registry() if self.config.metrics_enabled else None

    def manager(self, *loops: Any) -> Any:
        """The ``Manager`` running ``loops`` under this process's elector (``manager_of``)."""
        return manager_of(self.config, loops=loops, elector=self.elector)


@asynccontextmanager
async def connected(
    config: ProcessConfig, kubeconfig: str | None, environ: Mapping[str, str]
) -> AsyncIterator[Connected]:
    """The connection ``config`` and ``kubeconfig`` name (``k8s_api.kube_session``), with the
    leader elector ``config`` asks for; closed on exit."""
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioTransport, kube_session
    from miles.utils.workers.reconcile.k8s_config import KubeTarget

    target = KubeTarget(kubeconfig=kubeconfig, namespace=config.namespace)
    async with kube_session(target, environ) as session:
        yield Connected(
            config=config,
            namespace=session.namespace,
            core_v1_api=session.core_v1_api,
            transport=session.write_transport
            or KubernetesAsyncioTransport.beside(session.core_v1_api),
            elector=leader_elector(
                config.leader_election,
                core_v1_api=session.core_v1_api,
                namespace=session.namespace,
                environ=environ,
            ),
        )


def quiet_failures(*explained: type[BaseException]) -> Callable[[logging.LogRecord], bool]:
    """A logging filter: the loop's line for a failure of one of ``explained`` (which a
    controller explains in its message) carries no stack, so each attempt is one line (the
    loop's, with its retry delay)."""

    def without_traceback(record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], explained):
            record.exc_info = None
        return True

    return without_traceback


class ExplainedFailure(RuntimeError):
    """A failure whose message says what happened and what to do: the loop logs it as one line,
    without a stack (``main_of`` installs ``without_traceback``), and retries with its backoff."""


class NotLeadingError(ExplainedFailure):
    """A write was about to be sent while this process does not lead; none was sent."""


without_traceback = quiet_failures(ExplainedFailure)
"""A logging filter: the loop's line for an ``ExplainedFailure`` carries no stack."""


def parse_args(prog: str, description: str, argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", type=Path, help="a JSON configuration (default: all defaults)")
    parser.add_argument(
        "--kubeconfig", help="path to a kubeconfig (default: in-cluster, then the usual places)"
    )
    return parser.parse_args(argv)


def main_of(
    *,
    prog: str,
    description: str,
    config: type[C],
    run: Callable[[C, str | None, Mapping[str, str]], Coroutine[Any, Any, int]],
    log_filter: Callable[[logging.LogRecord], bool] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """A process's ``main``: logging, the flags, the configuration, ``run`` until a signal; a
    failure to start is one line on stderr and exit status 1, never a traceback. The first line
    of ``description`` (a module's docstring, say) is the ``--help`` text. The loop's lines for an
    ``ExplainedFailure`` carry no stack; ``log_filter`` filters them too."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    loop_logger = logging.getLogger("miles.utils.workers.reconcile.loop")
    for installed in (without_traceback, log_filter):
        if installed is not None:
            loop_logger.addFilter(installed)
    args = parse_args(prog, description.split("\n")[0], argv)
    try:
        loaded = config() if args.config is None else load_config(args.config, config)
        return asyncio.run(run(loaded, args.kubeconfig, os.environ))
    except Exception as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
