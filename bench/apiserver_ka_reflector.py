"""The ``kubernetes_asyncio`` contender: a reflector on its own ``Watch`` and model decoding.

Go counterpart: ``cache.Reflector``, with the LIST/WATCH semantics of ``k8s_reflector.py``: one
consistent LIST (resourceVersion unset) as a ``ReplaceEvent``, then a WATCH from its cursor with
bookmarks and a server timeout, reopened from the cursor when it closes, and a relist on 410 or 504.
Every object is the client's generated ``V1Pod`` model, decoded by ``ApiClient.deserialize`` (for
the LIST) and by ``Watch.unmarshal_event`` (for each frame), which is how a user of the library
reads pods when nothing bypasses the model layer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

logger = logging.getLogger("bench.apiserver.ka")

CURSOR_REJECTED = frozenset({410, 504})


@dataclass(frozen=True, kw_only=True)
class KubernetesAsyncioModelReflector:
    """A ``SourceWatchFn`` whose objects are ``kubernetes_asyncio`` ``V1Pod`` models."""

    core_v1_api: Any
    namespace: str
    label_selector: str
    watch_timeout_seconds: int = 300
    retry_delay: float = 1.0

    async def watch(self) -> AsyncIterator[SourceEvent]:
        while True:
            listed = await self.core_v1_api.list_namespaced_pod(
                self.namespace, label_selector=self.label_selector
            )
            yield ReplaceEvent({pod.metadata.name: pod for pod in listed.items or ()})
            cursor: str = listed.metadata.resource_version
            relist = False
            while not relist:
                follow = self._follow(cursor)
                try:
                    async for cursor_after, event in follow:
                        cursor = cursor_after
                        if event is not None:
                            yield event
                except _CursorRejectedError:
                    relist = True
                except Exception as err:
                    logger.warning("watch from %s failed, retrying: %r", cursor, err)
                    await asyncio.sleep(self.retry_delay)
                finally:
                    await follow.aclose()

    async def _follow(self, cursor: str) -> AsyncGenerator[tuple[str, SourceEvent | None], None]:
        from kubernetes_asyncio.client.exceptions import ApiException
        from kubernetes_asyncio.watch import Watch

        watch = Watch()
        try:
            stream = watch.stream(
                self.core_v1_api.list_namespaced_pod,
                self.namespace,
                label_selector=self.label_selector,
                resource_version=cursor,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_seconds,
            )
            async for frame in stream:
                kind = frame["type"]
                if kind == "BOOKMARK":
                    yield frame["raw_object"]["metadata"]["resourceVersion"], None
                    continue
                pod = frame["object"]
                name = pod.metadata.name
                source_event: SourceEvent = (
                    DeleteEvent(name, pod) if kind == "DELETED" else UpsertEvent(name, pod)
                )
                yield pod.metadata.resource_version, source_event
        except ApiException as err:
            if err.status in CURSOR_REJECTED:
                raise _CursorRejectedError from err
            raise
        finally:
            await watch.close()


class _CursorRejectedError(Exception):
    pass
