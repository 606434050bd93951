"""The in-cluster token as client-go keeps it (``transport.cachingTokenSource``), on the wire
(no cluster, real sockets): the transport through a real ``kubernetes_asyncio`` ``ApiClient``
against an aiohttp server on loopback that accepts only the newest token, so the request after a
401 reads the file again. The token's own rules are ``test_k8s_config``'s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from miles.utils.k8s_testenv.testing.k8s_fakes import list_body, realistic_pod
from miles.utils.workers.reconcile.k8s_api import KubernetesAsyncioPodApi, in_cluster_configuration
from miles.utils.workers.reconcile.k8s_errors import KubernetesApiError
from miles.utils.workers.reconcile.k8s_values import ListOptions


def rotate(path: Path, token: str) -> None:
    """As the kubelet updates a projected volume: the new file is renamed over the old."""
    fresh = path.with_name(".token.new")
    fresh.write_text(token)
    os.replace(fresh, path)


async def test_after_a_401_the_next_request_carries_the_rotated_token(tmp_path: Path) -> None:
    """The apiserver accepts only ``second``: the LIST with ``first`` is refused 401, and the
    retry, well inside the 50 s cache, carries the file's new token."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("first")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    seen: list[str] = []

    async def pods(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if seen[-1] != "Bearer second":
            return web.json_response({"kind": "Status", "reason": "Unauthorized"}, status=401)
        return web.Response(body=list_body([realistic_pod("a")], "7"))

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/pods", pods)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    configuration = in_cluster_configuration(environ, account)
    configuration.host = f"http://127.0.0.1:{runner.addresses[0][1]}"
    configuration.ssl_ca_cert = None
    try:
        async with ApiClient(configuration=configuration) as client:
            api = KubernetesAsyncioPodApi(core_v1_api=CoreV1Api(client))
            options = ListOptions(namespace="ns", label_selector="")
            rotate(account / "token", "second")
            with pytest.raises(KubernetesApiError) as refused:
                await api.list_pod_page(options)
            assert refused.value.code == 401
            page = await api.list_pod_page(options)
    finally:
        await runner.cleanup()
    assert [p.metadata.name for p in page.pods] == ["a"]
    assert seen == ["Bearer first", "Bearer second"]
