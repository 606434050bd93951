"""What-if variants of ours for ``bench/apiserver.py``: the fixes its profile proposes, applied
from the outside so they can be measured before the runtime adopts them.

Go counterpart: none (benchmark experiments). Each variant patches the runtime in its own contender
process only, before the measured window starts:

- ``gc``: the cyclic garbage collector is paused while one LIST body is decoded (pydantic builds
  tens of thousands of acyclic objects there, and every generation-2 pass it triggers walks all of
  them), and the stored pods are moved out of its reach (``gc.freeze()``) once synced;
- ``paged``: the same, plus the LIST read in pages of ``PAGE_LIMIT`` pods, as client-go's pager
  does, so that no more than two pages' bodies are ever held at once; the next page is asked
  for before the current one is decoded, so the server produces it while the client decodes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from miles.utils.workers.reconcile import k8s_api
from miles.utils.workers.reconcile.k8s_api import PodListPage
from miles.utils.workers.reconcile.k8s_types import Pod

PAGE_LIMIT = 500
SEND_TURNS = 4
"""Event-loop turns given to the next page's request, so it is on the wire before a decode."""
VARIANTS = ("gc", "paged")
_CONTINUE = re.compile(rb'"continue":"([^"]*)"')


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _gc_paused(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode_with_collector_paused(body: bytes) -> Any:
        with collector_paused():
            return decode(body)

    return decode_with_collector_paused


def _continue_token(body: bytes) -> str | None:
    head = body[: body.find(b'"items"')] if b'"items"' in body else body[:4096]
    match = _CONTINUE.search(head)
    if match is None:
        return None
    token: str = json.loads(b'"' + match.group(1) + b'"')
    return token or None


_UNPAGED_LIST = k8s_api.KubernetesAsyncioPodApi.list_pods


async def _paged_list_pods(
    self: Any,
    *,
    namespace: str,
    label_selector: str,
    resource_version: str | None = None,
    limit: int | None = None,
) -> PodListPage:
    """The first, consistent LIST in pages; any other LIST (a probe, a capped one) as it was."""
    if resource_version is not None or limit is not None:
        return await _UNPAGED_LIST(
            self,
            namespace=namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            limit=limit,
        )
    pods: list[Pod] = []
    body = await _fetch_page(self, namespace, label_selector, None)
    while True:
        token = _continue_token(body)
        following = (
            asyncio.create_task(_fetch_page(self, namespace, label_selector, token))
            if token
            else None
        )
        for _ in range(SEND_TURNS):
            await asyncio.sleep(0)
        page, _ = k8s_api.decode_pod_list(body)
        pods.extend(page.pods)
        del body
        if following is None:
            return PodListPage(tuple(pods), page.resource_version)
        body = await following


async def _fetch_page(self: Any, namespace: str, label_selector: str, token: str | None) -> bytes:
    extra = {"_continue": token} if token else {}
    resp = await self._core.list_namespaced_pod(
        namespace,
        label_selector=label_selector,
        limit=PAGE_LIMIT,
        _preload_content=False,
        **extra,
    )
    try:
        await k8s_api._raise_for_status(resp)
        body: bytes = await resp.read()
    finally:
        resp.release()
    return body


def apply(variant: str) -> Callable[[], None]:
    """Patches the runtime for ``variant``; returns what to run once the store has synced."""
    k8s_api.decode_pod_list = _gc_paused(k8s_api.decode_pod_list)  # type: ignore[assignment]
    if variant == "paged":
        k8s_api.KubernetesAsyncioPodApi.list_pods = _paged_list_pods  # type: ignore[method-assign]
    return gc.freeze
