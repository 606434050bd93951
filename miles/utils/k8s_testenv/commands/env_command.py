"""``miles-reconcile env up|down`` and the control plane the demo runs on.

Wraps ``miles.utils.k8s_testenv`` (Go: envtest plus kwokctl): builds the pinned binaries with a
progress display, starts etcd, both kube-apiservers and a kubelet: the real node
(``RealNodeAddon``: containerd, kubelet, scheduler, controller manager) when it can run here, else
KWOK with one fake node (``KwokAddon``), saying which and why; and either leaves them running
(``env up``; ``env down`` stops every process naming the plane's folder, KWOK or the real node
included, and undoes the real node's host changes) or owns them for the length of a demo. A
plane's name is its folder's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

from miles.utils.k8s_testenv.commands.build_progress import LogFn, run_with_progress

T = TypeVar("T")
REQUIRED_BINARIES = ("etcd", "kube-apiserver")
KUBELET_BINARY = "kwok"
NO_KUBELET_NODE = "demo-node-0"
KWOK_START_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class LocalPlane:
    """A started ``LocalControlPlane`` as the demo sees it."""

    plane: Any
    node_name: str
    has_kubelet: bool
    real_node: bool = False
    """Pods run in containers on this host: the scheduler places them, the kubelet restarts them."""

    @property
    def kubeconfig(self) -> str:
        return str(self.plane.cached_kubeconfig)

    async def restart_apiserver(self) -> None:
        await asyncio.to_thread(self.plane.restart_apiserver, "cached")


async def build_binaries(*, out: TextIO) -> tuple[Any, bool]:
    """Build what is missing, showing progress; KWOK is optional (without it the demo plays the
    kubelet). Returns the binary paths and whether KWOK is among them."""
    from miles.utils.k8s_testenv.binaries import ensure_binaries
    from miles.utils.k8s_testenv.errors import BuildError

    tty = out.isatty()

    def build(names: tuple[str, ...]) -> Callable[[LogFn], Any]:
        return lambda log: ensure_binaries(names=names, log=log)

    await run_with_progress(build(REQUIRED_BINARIES), stream=out, tty=tty)
    try:
        paths = await run_with_progress(build((KUBELET_BINARY,)), stream=out, tty=tty)
    except BuildError as err:
        out.write(
            f"KWOK unavailable ({str(err).splitlines()[0]}); the demo will play the kubelet\n"
        )
        return await run_with_progress(build(()), stream=out, tty=tty), False
    return paths, True


async def real_node_addon(*, out: TextIO) -> Any | None:
    """The real node's addon when it can run here (binaries built), else None, saying why."""
    from miles.utils.k8s_testenv.binaries import ensure_node_binaries
    from miles.utils.k8s_testenv.errors import PrerequisiteError
    from miles.utils.k8s_testenv.real_node import RealNodeAddon, real_node_unavailable
    from miles.utils.k8s_testenv.settings import EnvSettings

    setting = EnvSettings.from_env().node
    reason = real_node_unavailable(setting)
    if reason is not None and setting == "real":
        raise PrerequisiteError(f"MILES_K8S_NODE=real, but {reason}")
    if reason is not None:
        out.write(f"kubelet: KWOK (no real node: {reason.splitlines()[0]})\n")
        return None
    binaries = await run_with_progress(
        lambda log: ensure_node_binaries(log=log), stream=out, tty=out.isatty()
    )
    out.write("kubelet: the real node (containerd, runc, kubelet, scheduler, controller manager)\n")
    return RealNodeAddon(binaries=binaries)


async def start_plane(*, out: TextIO, keep: bool | None) -> LocalPlane:
    from miles.utils.k8s_testenv.control_plane import LocalControlPlane
    from miles.utils.k8s_testenv.kwok import KwokAddon

    binaries, with_kwok = await build_binaries(out=out)
    real = await real_node_addon(out=out)
    kwok = KwokAddon(start_timeout=KWOK_START_TIMEOUT) if with_kwok and real is None else None
    addon = real or kwok
    plane = LocalControlPlane(
        binaries=binaries,
        addons=[addon] if addon is not None else [],
        keep=keep,
        announce=lambda _: None,
    )
    started = time.monotonic()
    kubelet = " and the real node" if real else " and KWOK" if kwok else ""
    out.write(f"starting etcd, two kube-apiservers{kubelet} ...\n")
    out.flush()
    await finish_blocking(plane.start, on_cancel=plane.stop)
    out.write(f"control plane ready in {time.monotonic() - started:.1f}s\n")
    node_name = real.node.node_name if real else kwok.node_name if kwok else NO_KUBELET_NODE
    return LocalPlane(
        plane=plane, node_name=node_name, has_kubelet=addon is not None, real_node=real is not None
    )


async def finish_blocking(work: Callable[[], T], *, on_cancel: Callable[[], None]) -> T:
    """Run blocking ``work`` in a thread; if cancelled meanwhile, let it finish, run
    ``on_cancel`` (so nothing it started is left behind), then re-raise the cancellation."""
    job = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await job
        await asyncio.to_thread(on_cancel)
        raise


@contextlib.asynccontextmanager
async def local_plane(*, out: TextIO) -> AsyncIterator[LocalPlane]:
    """A local control plane with KWOK for the block's length; ``MILES_K8S_KEEP=1`` keeps it."""
    local = await start_plane(out=out, keep=None)
    try:
        yield local
    finally:
        await asyncio.to_thread(local.plane.__exit__, None, None, None)
        if local.plane.keep:
            out.write(f"{local.plane.describe()}\n{stop_hint(local.plane.work_dir.name)}\n")


def stop_hint(name: str) -> str:
    return f"stop it with: miles-reconcile env down {name}"


async def env_up(*, out: TextIO, err: TextIO) -> None:
    """Start and leave running; stdout is shell lines, so ``eval "$(... env up)"`` works."""
    local = await start_plane(out=err, keep=True)
    local.plane.leave_running()
    name = local.plane.work_dir.name
    err.write(f"{local.plane.describe()}\n{stop_hint(name)}\n")
    out.write(f"# control plane {name}; kubeconfig: {local.kubeconfig}\n")
    out.write(f"export KUBECONFIG={local.kubeconfig}\n")


async def env_down(*, names: Sequence[str], out: TextIO, err: TextIO) -> None:
    """Stop the planes named, or, with no name, list this user's planes and stop those left running
    on purpose or orphaned by a killed run; a plane a live process still owns (a test session, a
    running demo) is listed and left alone."""
    from miles.utils.k8s_testenv.state import planes_named, running_planes, stop_plane

    if names:
        for plane in planes_named(names):
            await asyncio.to_thread(stop_plane, plane)
            out.write(f"stopped {plane.name} ({plane.owner})\n")
        return
    planes = running_planes()
    if not planes:
        out.write("nothing is running\n")
    for plane in planes:
        if plane.abandoned:
            await asyncio.to_thread(stop_plane, plane)
            out.write(f"stopped {plane.name} ({plane.owner})\n")
        else:
            out.write(f"left {plane.name} running ({plane.owner}); {stop_hint(plane.name)}\n")
