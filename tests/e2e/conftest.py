"""Shared e2e fixtures: one local control plane per session (or a reused cluster).

- `k8s_control_plane`: builds the pinned binaries if missing, starts etcd plus a cached and an
  uncached kube-apiserver once per session; with MILES_K8S_KUBECONFIG, the reused cluster instead.
  A missing prerequisite (no Go, a failed build) skips, or fails with MILES_K8S_REQUIRE=1 (the
  default when CI is set).
- `k8s_local_control_plane`: the same, but skips when the cluster is reused (for faults).
- `cached_kubeconfig` / `uncached_kubeconfig`: kubeconfig paths of the two apiservers.
- `k8s_api_client`: `async with k8s_api_client("cached") as api:` gives a `kubernetes_asyncio`
  ApiClient, opened on the test's own event loop.
- `k8s_namespace`: a fresh namespace per test, created through the cached apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, NoReturn

import pytest

from miles.utils.k8s_testenv import (
    ApiClientFactory,
    ApiServerName,
    BinaryPaths,
    ControlPlane,
    EnvSettings,
    ExternalControlPlane,
    LocalControlPlane,
    PrerequisiteError,
    api_client,
    check_reachable,
    ensure_binaries,
)


def _terminal(config: pytest.Config) -> Callable[[str], None]:
    """Writes past pytest's output capture: build progress and MILES_K8S_KEEP instructions."""
    capture: Any = config.pluginmanager.getplugin("capturemanager")

    def write(text: str) -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(text, file=sys.stderr, flush=True)

    return write


def _missing_prerequisite(settings: EnvSettings, reason: str) -> NoReturn:
    if settings.require:
        pytest.fail(f"{reason}\n(MILES_K8S_REQUIRE is on, so this fails instead of skipping)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def k8s_terminal(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Writes a line past pytest's output capture (build progress, bring-up times)."""
    return _terminal(pytestconfig)


@pytest.fixture(scope="session")
def k8s_settings() -> EnvSettings:
    return EnvSettings.from_env()


@pytest.fixture(scope="session")
def k8s_binaries(k8s_settings: EnvSettings, pytestconfig: pytest.Config) -> BinaryPaths:
    try:
        return ensure_binaries(settings=k8s_settings, log=_terminal(pytestconfig))
    except PrerequisiteError as err:
        _missing_prerequisite(k8s_settings, str(err))


@pytest.fixture(scope="session")
def k8s_control_plane(
    k8s_settings: EnvSettings, request: pytest.FixtureRequest
) -> Iterator[ControlPlane]:
    if k8s_settings.kubeconfig is not None:
        asyncio.run(check_reachable(k8s_settings.kubeconfig))
        yield ExternalControlPlane(kubeconfig=k8s_settings.kubeconfig)
        return
    binaries: BinaryPaths = request.getfixturevalue("k8s_binaries")
    with LocalControlPlane(
        binaries=binaries, settings=k8s_settings, announce=_terminal(request.config)
    ) as plane:
        yield plane


@pytest.fixture
def k8s_local_control_plane(k8s_control_plane: ControlPlane) -> LocalControlPlane:
    if not isinstance(k8s_control_plane, LocalControlPlane):
        pytest.skip(
            "needs the local control plane's own etcd and apiserver processes, but "
            "MILES_K8S_KUBECONFIG reuses an existing cluster"
        )
    return k8s_control_plane


@pytest.fixture(scope="session")
def cached_kubeconfig(k8s_control_plane: ControlPlane) -> Path:
    return k8s_control_plane.cached_kubeconfig


@pytest.fixture(scope="session")
def uncached_kubeconfig(k8s_control_plane: ControlPlane) -> Path:
    return k8s_control_plane.uncached_kubeconfig


@pytest.fixture(scope="session")
def k8s_api_client(k8s_control_plane: ControlPlane) -> ApiClientFactory:
    kubeconfigs: dict[ApiServerName, Path] = {
        "cached": k8s_control_plane.cached_kubeconfig,
        "uncached": k8s_control_plane.uncached_kubeconfig,
    }

    def open_client(name: ApiServerName) -> AbstractAsyncContextManager[Any]:
        return api_client(kubeconfigs[name])

    return open_client


async def _create_namespace(kubeconfig: Path, name: str) -> None:
    from kubernetes_asyncio import client

    async with api_client(kubeconfig) as api:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )


@pytest.fixture
def k8s_namespace(cached_kubeconfig: Path) -> str:
    """A namespace of its own for this test (left behind: no namespace controller deletes it)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    asyncio.run(_create_namespace(cached_kubeconfig, name))
    return name
