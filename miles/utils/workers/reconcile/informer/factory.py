"""One ``SharedInformer`` per resource, namespace, selectors and representation.
Go: client-go ``informers.SharedInformerFactory`` (``InformerFor``), ``dynamicinformer``'s
``ForResource`` and ``metadatainformer``; controller-runtime's cache, one informer per kind and
representation.

``async with SharedInformerFactory() as factory:`` then ``factory.for_resource(api,
namespace=..., label_selector=...)`` gives the same ``SharedInformer`` to every caller asking for
the same resource, model, representation (full or metadata-only), namespace and selectors, so two
loops over the same pods open one watch and hold one store; leaving the block closes them all.
``factory.informer(key, source)`` shares any other source by a key of the caller's choosing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from miles.utils.workers.reconcile.clock import Clock
from miles.utils.workers.reconcile.informer.shared_informer import SharedInformer
from miles.utils.workers.reconcile.k8s_reflector import KubernetesReflector
from miles.utils.workers.reconcile.source_event import SourceWatchFn


class SharedInformerFactory:
    """Holds one ``SharedInformer`` per key; ``clock`` and ``retry_delay`` go to each."""

    def __init__(self, *, clock: Clock | None = None, retry_delay: float = 1.0) -> None:
        self._clock = clock
        self._retry_delay = retry_delay
        self._informers: dict[Hashable, SharedInformer] = {}
        self._closed = False

    def informer(
        self, key: Hashable, source: Callable[[], SourceWatchFn], *, name: str | None = None
    ) -> SharedInformer:
        """The informer of ``key``, made on first use from ``source()`` (called once)."""
        if self._closed:
            raise RuntimeError("the SharedInformerFactory is closed")
        found = self._informers.get(key)
        if found is None:
            found = self._informers[key] = SharedInformer(
                source=source(),
                name=name or str(key),
                clock=self._clock,
                retry_delay=self._retry_delay,
            )
        return found

    def for_resource(
        self,
        api: Any,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        **reflector: Any,
    ) -> SharedInformer:
        """The informer over ``api`` (a ``k8s_api.KubernetesAsyncioResourceApi``) with these
        selectors, through a ``KubernetesReflector`` (``reflector`` keywords go to it when the
        informer is made). Shared by resource, model, ``metadata_only``, namespace and
        selectors."""
        resource = api.resource
        key = (
            resource,
            getattr(api, "model", None),
            bool(getattr(api, "metadata_only", False)),
            namespace,
            label_selector,
            field_selector,
        )
        where = namespace or "all namespaces"
        name = f"{resource.group_resource} in {where}" + (
            f" ({label_selector})" if label_selector else ""
        )

        def source() -> SourceWatchFn:
            made = KubernetesReflector(
                api=api,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                clock=self._clock,
                name=name,
                **reflector,
            )
            return made.watch

        return self.informer(key, source, name=name)

    def informers(self) -> list[SharedInformer]:
        return list(self._informers.values())

    async def aclose(self) -> None:
        self._closed = True
        for informer in self._informers.values():
            await informer.aclose()

    async def __aenter__(self) -> SharedInformerFactory:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
