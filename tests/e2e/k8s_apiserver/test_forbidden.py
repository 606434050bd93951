"""Layer: real apiserver, no kubelet (the cached kube-apiserver, RBAC on). A loop whose service
account may not list its pods, refused by the apiserver's own authorizer: each LIST answered 403
is one ERROR line naming the verb, the resource and the server's answer, tried again every 10 s
(controller-runtime's ``Kind`` source); a Role granted meanwhile is picked up at the next try, and
without one ``start()`` fails with ``ReconcileLoopError`` naming it after ``cache_sync_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from miles.utils.k8s_testenv import ApiClientFactory
from miles.utils.k8s_testenv.client import api_client
from miles.utils.k8s_testenv.kubeconfig import with_token
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop, ReconcileLoopError
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.e2e.k8s_apiserver.harness import eventually

pytestmark = pytest.mark.k8s_apiserver

_REFUSED = 'list pods (group "", version v1): forbidden: KubernetesApiError: HTTP 403 Forbidden'
LAYER = "k8s_apiserver: ran on the cached kube-apiserver (watch cache on, RBAC authorizer)"


async def _nothing(_: ParentKey) -> None:
    return None


async def _service_account_kubeconfig(
    admin: Any, namespace: str, cached_kubeconfig: Path, into: Path
) -> tuple[Path, str]:
    """A kubeconfig for a new service account that no Role names yet, and its user name."""
    core = client.CoreV1Api(admin)
    name = f"reader-{uuid.uuid4().hex[:6]}"
    await core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = await core.create_namespaced_service_account_token(name, namespace, request)
    path = with_token(cached_kubeconfig, token.status.token, into / f"{name}.kubeconfig")
    return path, f"system:serviceaccount:{namespace}:{name}"


async def _grant_pod_reading(admin: Any, namespace: str, user: str) -> None:
    rbac = client.RbacAuthorizationV1Api(admin)
    rule = client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list", "watch"])
    meta = client.V1ObjectMeta(name="pod-reader")
    await rbac.create_namespaced_role(namespace, client.V1Role(metadata=meta, rules=[rule]))
    subject = client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")
    ref = client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader")
    binding = client.V1RoleBinding(metadata=meta, role_ref=ref, subjects=[subject])
    await rbac.create_namespaced_role_binding(namespace, binding)


@asynccontextmanager
async def _loop_as(kubeconfig: Path, namespace: str, **loop_options: Any) -> AsyncIterator[Any]:
    """A loop over ``namespace``'s pods as the kubeconfig's user, not yet started."""
    async with api_client(kubeconfig) as api:
        pods = KubernetesAsyncioPodApi(core_v1_api=client.CoreV1Api(api))
        reflector = KubernetesReflector(kube_client=pods, namespace=namespace)
        yield ReconcileLoop(source=reflector.watch, reconcile=_nothing, **loop_options)


@asynccontextmanager
async def _starting(loop: ReconcileLoop) -> AsyncIterator[asyncio.Task[None]]:
    """``loop.start()`` running; on exit the loop is stopped if it started, else its start is
    cancelled."""
    start = asyncio.create_task(loop.start())
    try:
        yield start
    finally:
        if start.done() and not start.cancelled() and start.exception() is None:
            await loop.stop()
        else:
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError, ReconcileLoopError):
                await start


def _refusals(caplog: pytest.LogCaptureFixture, user: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
        and _REFUSED in r.getMessage()
        and f'User "{user}" cannot list resource "pods"' in r.getMessage()
    ]


async def test_a_refused_listing_is_retried_and_a_role_granted_meanwhile_is_picked_up(
    k8s_api_client: ApiClientFactory,
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with k8s_api_client("cached") as admin:
        kubeconfig, user = await _service_account_kubeconfig(
            admin, k8s_namespace, cached_kubeconfig, tmp_path
        )
        with caplog.at_level(logging.ERROR):
            async with (
                _loop_as(kubeconfig, k8s_namespace, cache_sync_timeout=60.0) as loop,
                _starting(loop) as start,
            ):
                await eventually(lambda: _refusals(caplog, user), what="the 403 line")
                assert not start.done(), "a refusal is tried again, not fatal"
                await _grant_pod_reading(admin, k8s_namespace, user)
                granted = asyncio.get_running_loop().time()
                await asyncio.wait_for(asyncio.shield(start), timeout=20.0)
                waited = asyncio.get_running_loop().time() - granted
                assert loop.status().synced
                assert 1 <= len(_refusals(caplog, user)) <= 3, "one line per 10 s try"
    print(f"synced {waited:.1f}s after the Role was granted; {LAYER}")


async def test_a_listing_never_permitted_fails_start_naming_it(
    k8s_api_client: ApiClientFactory,
    cached_kubeconfig: Path,
    k8s_namespace: str,
    tmp_path: Path,
) -> None:
    async with k8s_api_client("cached") as admin:
        kubeconfig, user = await _service_account_kubeconfig(
            admin, k8s_namespace, cached_kubeconfig, tmp_path
        )
    async with _loop_as(kubeconfig, k8s_namespace, cache_sync_timeout=3.0) as loop:
        with pytest.raises(ReconcileLoopError) as failed:
            await loop.start()
    message = str(failed.value)
    assert "waiting for the store to sync (cache_sync_timeout)" in message
    assert _REFUSED in message
    assert "(RBAC: no Role or ClusterRole lets this user list it)" in message
    assert f'User "{user}" cannot list resource "pods"' in message
    print(LAYER)
