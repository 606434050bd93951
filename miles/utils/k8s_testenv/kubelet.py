"""The kubelet layer a test runs on (the real node, KWOK, kind, or a reused cluster) and the pod
actions that differ between KWOK and a real kubelet. Go counterpart: none; this is the test-side
half of `kwok_stages.yaml`.

A real kubelet restarts or completes a container when its process exits, so there the tests make
the process exit: the test container exits 1 on SIGUSR1 (a crash, restarted under restartPolicy
Always) and 0 on SIGUSR2 (completion), and ignores SIGTERM, so a graceful deletion lasts the whole
grace period. On kind and reused clusters it is a busybox PID-1 shell; on the real node it is the
`engine` image built here (`node_images`), with TERM_DELAY_SECONDS=-1 for the same contract, and
`engine_*` reach its HTTP endpoints (health, exit code) at the pod IP. On KWOK there is no process:
the same requests are annotations that kwok's stages turn into the status a kubelet would write.

Everything async takes a `kubernetes_asyncio` `CoreV1Api` (imported lazily) and every wait has a
deadline, ending in `WaitTimeout` that names what was awaited, for how long, and what was seen.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from miles.utils.k8s_testenv.kwok import COMPLETE_ANNOTATION, RESTART_COUNT_ANNOTATION
from miles.utils.k8s_testenv.node_images import ENGINE_IMAGE, ENGINE_PORT

T = TypeVar("T")
Probe = Callable[[], T | None] | Callable[[], Awaitable[T | None]]
"""What `eventually` polls: a plain or async callable returning a result, or None/False for no."""

TEST_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
CONTAINER_NAME = "main"
CONTAINER_SCRIPT = 'trap "exit 1" USR1; trap "exit 0" USR2; while true; do sleep 1 & wait $!; done'


class LayerName(enum.StrEnum):
    REAL = "real-node"
    KWOK = "kwok"
    KIND = "kind"
    KUBECONFIG = "kubeconfig"


class WaitTimeout(AssertionError):
    """A wait ran out of time; the message names what was awaited, how long, and what was seen."""


def _nothing_wrong() -> str | None:
    return None


def engine_container(
    *,
    name: str = CONTAINER_NAME,
    term_delay_seconds: float = -1,
    readiness_probe: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The real node's `engine` container: SIGTERM ends it after `term_delay_seconds` (negative:
    ignored, like the busybox shell); `readiness_probe` probes `/healthz` every second."""
    container: dict[str, Any] = {
        "name": name,
        "image": ENGINE_IMAGE,
        "imagePullPolicy": "Never",
        "env": [
            {"name": "TERM_DELAY_SECONDS", "value": str(term_delay_seconds)},
            *({"name": k, "value": v} for k, v in (env or {}).items()),
        ],
        "ports": [{"containerPort": ENGINE_PORT}],
    }
    if readiness_probe:
        container["readinessProbe"] = {
            "httpGet": {"path": "/healthz", "port": ENGINE_PORT},
            "periodSeconds": 1,
            "failureThreshold": 1,
            "successThreshold": 1,
        }
    return container


@dataclass(frozen=True)
class KubeletLayer:
    """Where pods run. `node_name` is set when nothing schedules (KWOK): pods are bound to it.
    `failure` says why the layer stopped working (kwok exited), so waits fail at once."""

    name: LayerName
    kubeconfig: Path
    node_name: str | None = None
    failure: Callable[[], str | None] = field(default=_nothing_wrong)

    @property
    def simulated(self) -> bool:
        return self.name is LayerName.KWOK

    @property
    def has_controllers(self) -> bool:
        """Whether a controller manager runs (service accounts, Deployments, StatefulSets)."""
        return self.name is not LayerName.KWOK

    def pod_manifest(
        self, *, name: str, labels: dict[str, str], restart_policy: str = "Always"
    ) -> dict[str, Any]:
        container = (
            engine_container()
            if self.name is LayerName.REAL
            else {
                "name": CONTAINER_NAME,
                "image": TEST_IMAGE,
                "command": ["sh", "-c", CONTAINER_SCRIPT],
            }
        )
        spec: dict[str, Any] = {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 30,
            "containers": [container],
        }
        if self.node_name is not None:
            spec["nodeName"] = self.node_name
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }

    async def restart_containers(self, core_v1: Any, *, namespace: str, name: str) -> None:
        """Every container of the pod exits with code 1 once; the kubelet restarts it."""
        if self.simulated:
            pod = await core_v1.read_namespaced_pod(name, namespace)
            count = max((s.restart_count for s in pod.status.container_statuses or ()), default=0)
            await _annotate(core_v1, namespace, name, {RESTART_COUNT_ANNOTATION: str(count + 1)})
        else:
            await _signal_pid1(core_v1, namespace, name, "USR1")

    async def complete(self, core_v1: Any, *, namespace: str, name: str) -> None:
        """Every container exits with code 0; under restartPolicy Never the pod is Succeeded."""
        if self.simulated:
            await _annotate(core_v1, namespace, name, {COMPLETE_ANNOTATION: "true"})
        else:
            await _signal_pid1(core_v1, namespace, name, "USR2")

    async def eventually(
        self,
        probe: Probe[T],
        *,
        what: str,
        timeout_seconds: float,
        seen: Callable[[], object] | None = None,
    ) -> T:
        """`eventually`, failing at once if the layer itself stopped working."""
        return await eventually(
            probe, what=what, timeout_seconds=timeout_seconds, seen=seen, failure=self.failure
        )


async def eventually(
    probe: Probe[T],
    *,
    what: str,
    timeout_seconds: float,
    seen: Callable[[], object] | None = None,
    failure: Callable[[], str | None] = _nothing_wrong,
    interval: float = 0.05,
) -> T:
    """The first result of `probe` that is neither None nor False, polled every `interval`.

    Raises `WaitTimeout` after `timeout_seconds`, or as soon as `failure()` reports a reason,
    with `seen()` (the last state observed) in the message.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result is not None and result is not False:
            return result
        waited = timeout_seconds - (deadline - loop.time())
        if (problem := failure()) is not None:
            raise WaitTimeout(f"gave up after {waited:.1f} s waiting for {what}: {problem}")
        if loop.time() >= deadline:
            last = f"; last seen: {seen()}" if seen is not None else ""
            raise WaitTimeout(f"waited {timeout_seconds:.1f} s for {what}{last}")
        await asyncio.sleep(interval)


def describe_pod(pod: Any) -> str:
    """One line on where a `V1Pod` stands: scheduling first, since an unbound pod never runs."""
    if pod is None:
        return "pod does not exist"
    node = pod.spec.node_name
    phase = pod.status.phase if pod.status is not None else None
    if not node:
        return f"never scheduled (spec.nodeName is empty), phase {phase}"
    statuses = pod.status.container_statuses or ()
    states = ", ".join(f"{s.name} restarts={s.restart_count} ready={s.ready}" for s in statuses)
    return f"on node {node}, phase {phase}" + (f", {states}" if states else "")


async def create_namespace(
    layer: KubeletLayer, core_v1: Any, name: str, *, timeout_seconds: float = 60.0
) -> None:
    """Creates namespace `name`. Where a controller manager runs it also waits for its `default`
    service account, which ServiceAccount admission requires of every pod on a real cluster and the
    controller creates a moment later (the local control plane runs with that admission off)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    await core_v1.create_namespace({"metadata": {"name": name}})
    if not layer.has_controllers:
        return

    async def default_account() -> Any:
        try:
            return await core_v1.read_namespaced_service_account("default", name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    await layer.eventually(
        default_account, what=f"service account {name}/default", timeout_seconds=timeout_seconds
    )


async def read_pod_or_none(core_v1: Any, *, namespace: str, name: str) -> Any:
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        return await core_v1.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def wait_for_pod_phase(
    layer: KubeletLayer,
    core_v1: Any,
    *,
    namespace: str,
    name: str,
    phase: str,
    timeout_seconds: float,
) -> Any:
    """The pod once the apiserver reports `phase`; the timeout message says where it stands."""
    last: list[Any] = [None]

    async def probe() -> Any:
        last[0] = await read_pod_or_none(core_v1, namespace=namespace, name=name)
        pod = last[0]
        return pod if pod is not None and pod.status.phase == phase else None

    return await layer.eventually(
        probe,
        what=f"pod {namespace}/{name} to reach phase {phase}",
        timeout_seconds=timeout_seconds,
        seen=lambda: describe_pod(last[0]),
    )


async def _annotate(core_v1: Any, namespace: str, name: str, annotations: dict[str, str]) -> None:
    await core_v1.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


async def _signal_pid1(core_v1: Any, namespace: str, name: str, signal: str) -> None:
    from kubernetes_asyncio import client
    from kubernetes_asyncio.stream import WsApiClient

    async with WsApiClient(configuration=core_v1.api_client.configuration) as ws:
        # The client sends a list as one `command` query parameter per item, as exec requires.
        exec_args: dict[str, Any] = {"command": ["kill", f"-{signal}", "1"]}
        await client.CoreV1Api(api_client=ws).connect_get_namespaced_pod_exec(
            name, namespace, container=CONTAINER_NAME, stderr=True, stdout=True, **exec_args
        )


async def engine_get(pod_ip: str, path: str, *, timeout_seconds: float = 5.0) -> str:
    """GET `path` from the engine at `pod_ip` (reachable from the host over the node's bridge),
    retrying for `timeout_seconds` while it does not answer (a container that just started)."""
    import urllib.request

    url = f"http://{pod_ip}:{ENGINE_PORT}{path}"

    def get() -> str:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as answer:
            return str(answer.read().decode())

    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while True:
        try:
            return await asyncio.to_thread(get)
        except OSError as error:
            if asyncio.get_running_loop().time() > deadline:
                raise WaitTimeout(f"the engine at {url} does not answer: {error}") from error
            await asyncio.sleep(0.1)


async def _pod_ip(core_v1: Any, namespace: str, name: str) -> str:
    pod = await core_v1.read_namespaced_pod(name, namespace)
    if not pod.status.pod_ip:
        raise WaitTimeout(f"pod {namespace}/{name} has no IP yet: {describe_pod(pod)}")
    return str(pod.status.pod_ip)


async def crash_engine(core_v1: Any, *, namespace: str, name: str, exit_code: int) -> None:
    """The engine container of a real-node pod exits with `exit_code` (its `/exit` endpoint)."""
    await engine_get(await _pod_ip(core_v1, namespace, name), f"/exit?code={exit_code}")


async def set_engine_health(core_v1: Any, *, namespace: str, name: str, healthy: bool) -> None:
    """Makes the engine's `/healthz` (its readiness probe) pass or fail."""
    ok = "true" if healthy else "false"
    await engine_get(await _pod_ip(core_v1, namespace, name), f"/health?ok={ok}")
