"""Layer k8s_apiserver: in-cluster configuration against the real etcd and kube-apiserver (watch
cache on), with real ServiceAccount tokens from the TokenRequest API (the plane signs them with its
service-account key; RBAC lets the account list, watch and patch pods in its namespace only).

A loop configured from a service-account folder (token, ca.crt, namespace) and
KUBERNETES_SERVICE_HOST/_PORT keeps working when its token file is swapped for another valid
token and the old one is revoked (its bound Secret deleted), across an apiserver restart that
forces every request to authenticate again: the token file is re-read as client-go re-reads it
(after 50 s, and before the next request once one was refused 401). The session's write
transport (`k8s_http2.Http2Transport`, HTTP/2) then patches a pod with the CA and the rotated token.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from miles.utils.k8s_testenv import ApiClientFactory, LocalControlPlane
from miles.utils.workers.reconcile.client import Client, MergePatch
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi, kube_session
from miles.utils.workers.reconcile.k8s_config import KubeTarget
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_http2 import Http2Transport
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.loop import ReconcileLoop
from miles.utils.workers.reconcile.resource import PODS
from miles.utils.workers.reconcile.source_event import ParentKey
from tests.e2e.k8s_apiserver.harness import cell_of, create_pod, eventually

ACCOUNT = "controller"
AFTER_ROTATION_SECONDS = 150.0
"""The first 401 makes the next request read the token file again (client-go's
``ResetTokenOlderThan``), one backoff step later; 150 s leaves room for the apiserver's restart."""


async def _admin(api: Any, namespace: str) -> None:
    core: Any = client.CoreV1Api(api)
    rbac: Any = client.RbacAuthorizationV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": ACCOUNT}})
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]}
    await rbac.create_namespaced_role(namespace, {"metadata": {"name": ACCOUNT}, "rules": [rule]})
    binding = {
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }
    await rbac.create_namespaced_role_binding(namespace, binding)


async def _bound_token(api: Any, namespace: str, secret: str) -> str:
    """A token of the account bound to a Secret of its own: deleting the Secret revokes it."""
    core: Any = client.CoreV1Api(api)
    created = await core.create_namespaced_secret(namespace, {"metadata": {"name": secret}})
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Secret",
                "name": secret,
                "uid": created.metadata.uid,
            },
        },
    }
    answer = await core.create_namespaced_service_account_token(ACCOUNT, namespace, request)
    return str(answer.status.token)


async def _rejected(url: str, ca_cert: Path, token: str, namespace: str) -> bool:
    configuration = client.Configuration(host=url)
    configuration.ssl_ca_cert = str(ca_cert)
    configuration.api_key["BearerToken"] = f"Bearer {token}"
    async with client.ApiClient(configuration) as api:
        try:
            await client.CoreV1Api(api).list_namespaced_pod(namespace, limit=1)
        except ApiException as err:
            if err.status == 401:
                return True
            raise
    return False


def _write_token(folder: Path, token: str) -> None:
    """As the kubelet updates a projected volume: the new file is renamed over the old."""
    fresh = folder / ".token.new"
    fresh.write_text(token)
    os.replace(fresh, folder / "token")


async def test_a_loop_keeps_working_when_its_token_is_rotated_and_the_old_one_revoked(
    k8s_local_control_plane: LocalControlPlane,
    k8s_namespace: str,
    k8s_api_client: ApiClientFactory,
    tmp_path: Path,
) -> None:
    plane = k8s_local_control_plane
    url = plane.apiserver("cached").url
    ca_cert = plane.credentials.ca_cert
    async with k8s_api_client("cached") as admin:
        await _admin(admin, k8s_namespace)
        first = await _bound_token(admin, k8s_namespace, "token-a")
        second = await _bound_token(admin, k8s_namespace, "token-b")
        admin_core: Any = client.CoreV1Api(admin)
        await create_pod(admin_core, k8s_namespace, "p1", cell="one")

        folder = tmp_path / "serviceaccount"
        folder.mkdir()
        _write_token(folder, first)
        (folder / "ca.crt").write_bytes(ca_cert.read_bytes())
        (folder / "namespace").write_text(k8s_namespace)
        host, port = url.removeprefix("https://").rsplit(":", 1)
        environ = {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
        }

        reconciled: list[ParentKey] = []

        async def reconcile(parent: ParentKey) -> None:
            reconciled.append(parent)

        async with kube_session(KubeTarget(), environ, folder) as session:
            assert (session.namespace, session.server) == (k8s_namespace, url)
            pod_api = KubernetesAsyncioPodApi(core_v1_api=session.core_v1_api)
            reflector = KubernetesReflector(
                kube_client=pod_api, namespace=session.namespace, label_selector=""
            )
            loop = ReconcileLoop(
                source=reflector.watch,
                reconcile=reconcile,
                key_map=cell_of,
            )
            async with loop:
                await eventually(lambda: "one" in reconciled, what="the first pod reconciled")
                _write_token(folder, second)
                await admin_core.delete_namespaced_secret("token-a", k8s_namespace)
                await _until_rejected(url, ca_cert, first, k8s_namespace)
                assert not await _rejected(url, ca_cert, second, k8s_namespace)
                plane.restart_apiserver("cached")
                await create_pod(admin_core, k8s_namespace, "p2", cell="two")
                await eventually(
                    lambda: "two" in reconciled,
                    what="a pod created after the rotation reconciled",
                    within=AFTER_ROTATION_SECONDS,
                    context=lambda: repr(loop.status().source),
                )
                assert loop.status().error is None
                await _patch_through_the_write_transport(session, k8s_namespace)


async def _patch_through_the_write_transport(session: Any, namespace: str) -> None:
    """The session's write transport (HTTP/2) writes with the service account's CA and its
    rotated token: at most one 401 (the old token, held until a 401 makes the file read again)."""
    assert isinstance(session.write_transport, Http2Transport)
    writes = Client(transport=session.write_transport, field_manager="in-cluster")
    label = MergePatch({"metadata": {"labels": {"written": "yes"}}})
    refusals: list[int] = []
    while True:
        try:
            patched = await writes.patch(PODS, "p2", label, namespace=namespace)
        except KubernetesApiError as refused:
            refusals.append(refused.code)
            if len(refusals) > 1:
                raise
        else:
            break
    assert refusals in ([], [401])
    assert patched["metadata"]["labels"]["written"] == "yes"


async def _until_rejected(url: str, ca_cert: Path, token: str, namespace: str) -> None:
    """Token revocation reaches the apiserver's authenticator cache within seconds."""
    for _ in range(120):
        if await _rejected(url, ca_cert, token, namespace):
            return
        await asyncio.sleep(0.5)
    raise AssertionError("the old token was still accepted 60 s after its Secret was deleted")
