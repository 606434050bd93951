"""``miles-reconcile demo``: a pool story on a local control plane, then checked. Go: none.

Three cells of four engine pods go through a scale-up, a container restart, a graceful delete, a
move to another cell, an apiserver restart and a pod leaving the selector, while the loop's live
view is drawn. The verdict compares the loop's view with a fresh LIST. On the real node the
engines are containers: the scheduler places them, the restart is a real crash loop (the engine
exits 3 twice, the kubelet backs off) and the graceful delete a real SIGTERM handled within the
grace period. Where no KWOK plays the kubelet either, the demo writes the pod status a kubelet would
(Running, a restart, the final delete of a terminating pod) itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO, TypeVar

from miles.utils.workers.reconcile.cli.failures import CliError
from miles.utils.workers.reconcile.cli.live_view import (
    CLEAR_SCREEN,
    LiveView,
    view_title,
    wait_redrawing,
)
from miles.utils.workers.reconcile.cli.log_notes import logs_into
from miles.utils.workers.reconcile.cli.pool_loop import (
    PoolOptions,
    parent_label_map,
    pool_loop,
    synced_pool,
)
from miles.utils.workers.reconcile.cli.signals import INTERRUPTED_EXIT, stop_on_signals
from miles.utils.workers.reconcile.source_event import ParentKey
from miles.utils.workers.reconcile.tasks import finished, first_of

NAMESPACE = "miles-demo"
APP_LABEL = "app"
APP = "miles-engine"
CELL_LABEL = "miles.io/cell"
CELLS = ("cell-0", "cell-1", "cell-2")
ENGINES_PER_CELL = 4
CONTAINER = "engine"
IMAGE = "miles/engine:demo"
GRACE_SECONDS = 3
TERM_DELAY_SECONDS = 1.0
"""How long the real node's engine takes to exit on SIGTERM, well inside GRACE_SECONDS."""
CRASH_EXIT_CODE = 3
CONVERGE_TIMEOUT = 60.0
STEP_PAUSE = 2.5
T = TypeVar("T")
OPTIONS = PoolOptions(namespace=NAMESPACE, selector=f"{APP_LABEL}={APP}", parent_label=CELL_LABEL)
RETRY_DELAY = 0.5
"""The reflector's and the loop's first retry, shorter than their defaults, so the story's apiserver
restart is over sooner."""

PoolView = Mapping[ParentKey, Mapping[str, str]]
"""Per parent, each member's name and resourceVersion: what the verdict compares."""


class DemoPlane(Protocol):
    """The control plane the story runs on."""

    @property
    def kubeconfig(self) -> str: ...

    @property
    def node_name(self) -> str: ...

    @property
    def has_kubelet(self) -> bool:
        """Whether KWOK (or a kubelet) moves pods to Running and finishes graceful deletes."""
        ...

    @property
    def real_node(self) -> bool:
        """Whether a real kubelet runs the engines as containers (and a scheduler places them)."""
        ...

    async def restart_apiserver(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    matched: bool
    loop_view: PoolView
    listed: PoolView

    def lines(self) -> list[str]:
        members = sum(len(m) for m in self.listed.values())
        if self.matched:
            return [
                f"verdict: match ({len(self.listed)} parents, {members} pods: the loop's view "
                "equals a fresh LIST)"
            ]
        return [
            "verdict: MISMATCH (loop view vs fresh LIST)",
            *view_diff(self.loop_view, self.listed),
        ]


def view_diff(loop_view: PoolView, listed: PoolView) -> list[str]:
    """One line per member that differs: missing from the loop, extra in it, or at another RV."""
    lines = []
    for parent in sorted(set(loop_view) | set(listed)):
        ours, theirs = loop_view.get(parent, {}), listed.get(parent, {})
        for name in sorted(set(ours) | set(theirs)):
            if name not in ours:
                lines.append(f"  {parent}/{name}: in LIST (rv {theirs[name]}), missing from loop")
            elif name not in theirs:
                lines.append(f"  {parent}/{name}: in loop (rv {ours[name]}), not in LIST")
            elif ours[name] != theirs[name]:
                lines.append(
                    f"  {parent}/{name}: loop has rv {ours[name]}, LIST has {theirs[name]}"
                )
    return lines


def group_by_parent(pods: Sequence[Any], key_map: Callable[[Any], ParentKey | None]) -> PoolView:
    view: dict[ParentKey, dict[str, str]] = {}
    for pod in pods:
        parent = key_map(pod)
        if parent is not None:
            view.setdefault(parent, {})[pod.metadata.name] = pod.metadata.resource_version or ""
    return view


def engine_name(cell: str, index: int) -> str:
    return f"{cell}-engine-{index}"


def engine_manifest(name: str, cell: str, node: str, *, real_node: bool = False) -> dict[str, Any]:
    """A pod bound to `node`; on the real node, the engine image, placed by the scheduler."""
    from miles.utils.k8s_testenv.kubelet import engine_container

    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": [{"name": CONTAINER, "image": IMAGE}],
        "tolerations": [{"operator": "Exists"}],
    }
    if real_node:
        spec["containers"] = [
            engine_container(name=CONTAINER, term_delay_seconds=TERM_DELAY_SECONDS)
        ]
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {APP_LABEL: APP, CELL_LABEL: cell}},
        "spec": spec,
    }


def running_status(ip: str, restarts: int, *, restarted: bool) -> dict[str, Any]:
    """The pod status a kubelet writes for a running engine (after ``restarts`` restarts)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": IMAGE,
        "imageID": "",
        "ready": True,
        "started": True,
        "restartCount": restarts,
        "state": {"running": {"startedAt": now}},
    }
    if restarted:
        container["lastState"] = {
            "terminated": {"exitCode": 137, "reason": "Error", "startedAt": now, "finishedAt": now}
        }
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [ready],
            "containerStatuses": [container],
        }
    }


class DemoCluster:
    """The writes the story makes, through a ``CoreV1Api``; plays the kubelet when there is none."""

    def __init__(self, *, core_v1_api: Any, plane: DemoPlane) -> None:
        self.core = core_v1_api
        self._plane = plane
        self._next_ip = 10

    async def reset(self) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as err:
            if err.status != 409:
                raise
        await self.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        await self.wait_for(lambda pods: not pods, "leftover pods to go")

    async def create_engines(self, cells_and_indices: Sequence[tuple[str, int]]) -> None:
        names = []
        for cell, index in cells_and_indices:
            name = engine_name(cell, index)
            manifest = engine_manifest(
                name, cell, self._plane.node_name, real_node=self._plane.real_node
            )
            await self.core.create_namespaced_pod(NAMESPACE, manifest)
            names.append(name)
        if not self._plane.has_kubelet:
            for name in names:
                await self.patch_status(name, running_status(self._ip(), 0, restarted=False))
        await self.wait_for(
            lambda pods: all(_phase(pods.get(n)) == "Running" for n in names), "engines to run"
        )

    async def restart_container(self, name: str) -> None:
        """KWOK restarts on its restart-count annotation; without it, the status is patched."""
        from miles.utils.k8s_testenv.kwok import RESTART_COUNT_ANNOTATION

        pod = await self.core.read_namespaced_pod(name, NAMESPACE)
        wanted = _restarts(pod) + 1
        if self._plane.real_node:
            await self._crash_loop(name, wanted)
            return
        if self._plane.has_kubelet:
            annotation = {RESTART_COUNT_ANNOTATION: str(wanted)}
            await self.core.patch_namespaced_pod(
                name, NAMESPACE, {"metadata": {"annotations": annotation}}
            )
        else:
            await self.patch_status(name, running_status(pod.status.pod_ip, wanted, restarted=True))
        await self.wait_for(
            lambda pods: name in pods and _restarts(pods[name]) >= wanted, f"{name} to restart"
        )

    async def _crash_loop(self, name: str, wanted: int) -> None:
        """The engine exits twice; after the second exit the kubelet backs off (CrashLoopBackOff)
        before starting it again."""
        from miles.utils.k8s_testenv.kubelet import crash_engine

        await crash_engine(self.core, namespace=NAMESPACE, name=name, exit_code=CRASH_EXIT_CODE)
        await self.wait_for(lambda pods: _running_after(pods.get(name), wanted), f"{name} back")
        await crash_engine(self.core, namespace=NAMESPACE, name=name, exit_code=CRASH_EXIT_CODE)
        # The back-off lasts 5 s: a slow LIST may see the pod only once it runs again.
        await self.wait_for(
            lambda pods: (
                _waiting_reason(pods.get(name)) == "CrashLoopBackOff"
                or _running_after(pods.get(name), wanted + 1)
            ),
            f"{name} in CrashLoopBackOff",
        )
        await self.wait_for(lambda pods: _running_after(pods.get(name), wanted + 1), f"{name} back")

    async def graceful_delete(self, name: str) -> None:
        await self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=GRACE_SECONDS)
        if not self._plane.has_kubelet:
            await asyncio.sleep(GRACE_SECONDS)
            await self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        await self.wait_for(lambda pods: name not in pods, f"{name} to be deleted")

    async def relabel(self, name: str, labels: Mapping[str, str]) -> None:
        await self.core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"labels": labels}})

    async def patch_status(self, name: str, body: Mapping[str, Any]) -> None:
        await self.core.patch_namespaced_pod_status(name, NAMESPACE, body)

    async def list_view(self) -> PoolView:
        from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi

        page = await KubernetesAsyncioPodApi(core_v1_api=self.core).list_pods(
            namespace=NAMESPACE, label_selector=OPTIONS.selector
        )
        return group_by_parent(page.pods, parent_label_map(CELL_LABEL))

    async def wait_for(self, done: Callable[[Mapping[str, Any]], bool], what: str) -> None:
        deadline = time.monotonic() + CONVERGE_TIMEOUT
        while True:
            listed = await self.core.list_namespaced_pod(NAMESPACE)
            if done({pod.metadata.name: pod for pod in listed.items}):
                return
            if time.monotonic() > deadline:
                raise CliError(f"demo: waited {CONVERGE_TIMEOUT:.0f}s for {what}")
            await asyncio.sleep(0.2)

    def _ip(self) -> str:
        self._next_ip += 1
        return f"10.244.0.{self._next_ip}"


def _restarts(pod: Any) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


def _phase(pod: Any) -> str | None:
    return None if pod is None else pod.status.phase


def _waiting_reason(pod: Any) -> str | None:
    statuses = (pod.status.container_statuses or []) if pod is not None else []
    waiting = statuses[0].state.waiting if statuses else None
    return None if waiting is None else waiting.reason


def _running_after(pod: Any, restarts: int) -> bool:
    statuses = (pod.status.container_statuses or []) if pod is not None else []
    return bool(statuses) and _restarts(pod) >= restarts and statuses[0].state.running is not None


@dataclass(frozen=True, slots=True)
class Step:
    caption: str
    act: Callable[[DemoCluster, DemoPlane], Awaitable[None]]


def story(*, real_node: bool = False) -> list[Step]:
    moved, leaver = engine_name("cell-0", 3), engine_name("cell-1", 0)
    restart = (
        f"container restart: cell-2-engine-1's engine crashes twice (exit {CRASH_EXIT_CODE}), "
        "a real crash loop: CrashLoopBackOff, then running again"
        if real_node
        else "container restart: cell-2-engine-1's engine exits and comes back"
    )
    delete = (
        f"graceful delete: cell-2-engine-3 gets SIGTERM and exits {TERM_DELAY_SECONDS:.0f}s "
        f"later, inside its {GRACE_SECONDS}s grace"
        if real_node
        else f"graceful delete: cell-2-engine-3 terminates over {GRACE_SECONDS}s"
    )
    return [
        Step(
            f"create the pool: {len(CELLS)} cells x {ENGINES_PER_CELL} engines",
            lambda c, _: c.create_engines(
                [(cell, i) for cell in CELLS for i in range(ENGINES_PER_CELL)]
            ),
        ),
        Step(
            "scale-up: cell-1 gets a fifth engine",
            lambda c, _: c.create_engines([("cell-1", ENGINES_PER_CELL)]),
        ),
        Step(restart, lambda c, _: c.restart_container(engine_name("cell-2", 1))),
        Step(delete, lambda c, _: c.graceful_delete(engine_name("cell-2", 3))),
        Step(
            f"move: {moved} is relabelled into cell-2",
            lambda c, _: c.relabel(moved, {CELL_LABEL: "cell-2"}),
        ),
        Step(
            "apiserver restart: the loop's watch is cut and reopens",
            lambda _, p: p.restart_apiserver(),
        ),
        Step(
            f"leave the selector: {leaver} is relabelled {APP_LABEL}=miles-debug",
            lambda c, _: c.relabel(leaver, {APP_LABEL: "miles-debug"}),
        ),
    ]


async def converge(loop: Any, cluster: DemoCluster) -> Verdict:
    """Compare the loop's view with a fresh LIST until they agree or :data:`CONVERGE_TIMEOUT`."""
    started = time.monotonic()
    while True:
        listed = await cluster.list_view()
        ours = loop_view(loop)
        elapsed = time.monotonic() - started
        if ours == listed or elapsed > CONVERGE_TIMEOUT:
            return Verdict(matched=ours == listed, loop_view=ours, listed=listed)
        await asyncio.sleep(0.2)


def loop_view(loop: Any) -> PoolView:
    return {
        parent: {pod.metadata.name: pod.metadata.resource_version or "" for pod in members}
        for parent in loop.parent_keys()
        if (members := loop.get_by_parent(parent))
    }


async def play(*, plane: DemoPlane, short: bool, out: TextIO) -> Verdict:
    """Run the story with the live view drawn on ``out``; return the final verdict."""
    from miles.utils.workers.reconcile.k8s_api import kube_session
    from miles.utils.workers.reconcile.k8s_config import KubeTarget

    tty = out.isatty()
    view = LiveView(stream=out, output="table", tty=tty, title=view_title(OPTIONS, command="demo"))
    if tty:
        out.write(CLEAR_SCREEN)
    async with kube_session(KubeTarget(kubeconfig=plane.kubeconfig), {}) as session:
        cluster = DemoCluster(core_v1_api=session.core_v1_api, plane=plane)
        await cluster.reset()
        with logs_into(view.notes, enabled=tty):
            return await _play_story(cluster, plane, view, short=short, tty=tty)


async def _play_story(
    cluster: DemoCluster, plane: DemoPlane, view: LiveView, *, short: bool, tty: bool
) -> Verdict:
    async with _demo_loop(cluster.core, view) as loop, redrawing(view, enabled=tty):
        view.start_marking(synced_pool(loop))
        steps = story(real_node=plane.real_node)
        for number, step in enumerate(steps, start=1):
            view.caption = [f"step {number}/{len(steps)}: {step.caption}"]
            view.draw()
            await step.act(cluster, plane)
            verdict = await converge(loop, cluster)
            if not verdict.matched:
                view.caption.append(f"the loop did not converge after step {number}")
                break
            await asyncio.sleep(0.0 if short else STEP_PAUSE)
        else:
            verdict = await converge(loop, cluster)
            view.caption = []
    view.caption = [*view.caption, *verdict.lines()]
    view.draw()
    return verdict


@contextlib.asynccontextmanager
async def _demo_loop(core: Any, view: LiveView) -> AsyncIterator[Any]:
    from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi

    pod_api = KubernetesAsyncioPodApi(core_v1_api=core)
    async with pool_loop(
        OPTIONS, pod_api=pod_api, show=view.show_parent, retry_delay=RETRY_DELAY
    ) as loop:
        yield loop


@contextlib.asynccontextmanager
async def redrawing(view: LiveView, *, enabled: bool) -> AsyncIterator[None]:
    """Redraw every :data:`TICK_SECONDS` while the body runs, so ages move and marks fade."""
    if not enabled:
        yield
        return
    done = asyncio.Event()
    ticker = asyncio.create_task(wait_redrawing(view, done, tick=True))
    try:
        yield
    finally:
        done.set()
        await ticker


async def until_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or ``None`` once ``stop`` is set first (``work`` is then cancelled)."""
    task, _ = await first_of(work, stop.wait())
    return task.result() if finished(task) else None


async def run_demo(*, short: bool, out: TextIO, err: TextIO) -> int:
    from miles.utils.k8s_testenv.commands.env_command import local_plane

    async def demo() -> Verdict:
        async with local_plane(out=err) as plane:
            return await play(plane=plane, short=short, out=out)

    stop = asyncio.Event()
    with stop_on_signals(stop):
        verdict = await until_stopped(demo(), stop)
    if verdict is None:
        err.write("miles-reconcile: demo interrupted\n")
        return INTERRUPTED_EXIT
    return 0 if verdict.matched else 1
