"""The wire contender of ``bench/apiserver.py``: the same LIST and WATCH, read and not decoded.

Go counterpart: none (a floor). It runs in the process and protocol of
``bench/apiserver_contender.py`` (``--contender wire``) over the same client stack as ours
(``kubernetes_asyncio``'s ``ApiClient`` on aiohttp, asyncio's TLS), so its CPU per WATCH event is
what one event costs before anything is decoded: the socket, TLS, HTTP chunking, the event loop,
line framing, and a regular expression for the event's resourceVersion, which is all it keeps.
The LIST is read in pages of 500, each body whole, and the WATCH opens at the LIST's
resourceVersion with bookmarks, as ours does.

Two more steps split ours's cost per event from outside (``WIRE_LEVELS``): ``wire-decode`` also
decodes each line as ours's steady WATCH does (``k8s_wire.decode_watch_line``) and drops the pod;
``wire-keep`` keeps it too, in a dict by name, so that the pods stay alive for the collector to
walk, as a store's do.
"""

from __future__ import annotations

import re
import time
from typing import Any

from bench.apiserver_proc import SELECTOR, AppliedEvents, first_resource_version, read_body
from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError
from miles.utils.workers.reconcile.k8s_wire import decode_watch_line

PAGE_SIZE = 500
_CONTINUE = re.compile(rb'"continue":"([^"]*)"')
_ITEM = re.compile(rb'\{"metadata":\{"name":')
_POD_EVENT = re.compile(rb'\{"type":"(?:ADDED|MODIFIED|DELETED)"')
WIRE_LEVELS = {"wire": "read", "wire-decode": "decode", "wire-keep": "keep"}


class WireReader(AppliedEvents):
    """Counts the pods of one raw LIST, then stamps each WATCH line's resourceVersion."""

    def __init__(self, core_v1_api: Any, namespace: str, level: str = "read") -> None:
        super().__init__()
        self._core = core_v1_api
        self._namespace = namespace
        self._decodes = level in ("decode", "keep")
        self._keeps = level == "keep"
        self._kept: dict[str, Any] = {}
        self.stored = 0

    async def list(self) -> str:
        """Reads every page; the LIST's resourceVersion (the first page's, as the pager keeps)."""
        token: str | None = None
        list_rv = ""
        while True:
            options: dict[str, Any] = {"label_selector": SELECTOR, "limit": PAGE_SIZE}
            if token:
                options["_continue"] = token
            resp = await self._core.list_namespaced_pod(
                self._namespace, _preload_content=False, **options
            )
            body = await read_body(resp)
            found = _CONTINUE.search(body, 0, 4096)
            list_rv = list_rv or str(first_resource_version(body))
            self.stored += len(_ITEM.findall(body))
            token = found.group(1).decode() if found else None
            if not token:
                return list_rv

    async def watch(self, resource_version: str) -> None:
        resp = await self._core.list_namespaced_pod(
            self._namespace,
            label_selector=SELECTOR,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=3600,
            _preload_content=False,
        )
        buffer = bytearray()
        try:
            while chunk := await resp.content.readany():
                buffer += chunk
                start = 0
                while (end := buffer.find(b"\n", start)) != -1:
                    self._note(bytes(buffer[start:end]))
                    start = end + 1
                del buffer[:start]
        finally:
            resp.release()

    def _note(self, line: bytes) -> None:
        if self._decodes:
            try:
                pod = decode_watch_line(line).pod
            except FrameDecodeError:
                pod = None
            if self._keeps and pod is not None:
                self._kept[pod.metadata.name] = pod
        if _POD_EVENT.match(line):
            self.note(first_resource_version(line), time.monotonic())
