"""Fast layer: ``KubernetesReflector`` over any resource (``api=``, a scripted ``ResourceApi``), on
a fake clock: keys within a namespace and across namespaces, the selectors it sends, a resource the
server does not serve or refuses (retried every 10 s, one ERROR line naming it), an object that
does not validate (record rows ``k8s_reflector.py`` "Any resource" and "Not served").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import next_scripted
from miles.utils.workers.reconcile.clock import FakeClock
from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError, KubernetesApiError
from miles.utils.workers.reconcile.k8s_interfaces import ResourceApi, UndecodedPodPage
from miles.utils.workers.reconcile.k8s_objects import DynamicObject
from miles.utils.workers.reconcile.k8s_reflector import (
    NOT_SERVED_RETRY_SECONDS,
    KubernetesReflector,
)
from miles.utils.workers.reconcile.k8s_values import ListOptions, ListPage, WatchEvent
from miles.utils.workers.reconcile.resource import NODES, Resource
from miles.utils.workers.reconcile.source_event import (
    DeleteEvent,
    ReplaceEvent,
    SourceEvent,
    UpsertEvent,
)

POOLS = Resource.custom(
    group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
)
RETRY = 2.0


def obj(namespace: str, name: str, rv: str = "10") -> DynamicObject:
    return DynamicObject.model_validate(
        {
            "apiVersion": POOLS.api_version,
            "kind": POOLS.kind,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv},
            "spec": {"replicas": 1},
        }
    )


def event(kind: str, o: DynamicObject) -> WatchEvent[DynamicObject]:
    return WatchEvent(kind, o, o.metadata.resource_version)


@dataclass
class FakeResourceApi:
    """A scripted ``ResourceApi``: each LIST page (not a probe) pops ``lists``, each watch pops
    ``watches``; a dry queue parks the call, so a test sees exactly the calls it scripted."""

    lists: list[ListPage[DynamicObject] | BaseException] = field(default_factory=list)
    watches: list[list[WatchEvent[DynamicObject] | BaseException]] = field(default_factory=list)
    list_calls: list[ListOptions] = field(default_factory=list)
    watch_calls: list[dict[str, Any]] = field(default_factory=list)
    resource: Resource = POOLS

    async def list_page(self, options: ListOptions) -> ListPage[DynamicObject]:
        if options.resource_version is not None:
            return ListPage((), options.resource_version)
        self.list_calls.append(options)
        return await next_scripted(self.lists)

    async def read_page(
        self, options: ListOptions, *, on_head: Callable[[str | None], object] | None = None
    ) -> UndecodedPodPage:
        page = await self.list_page(options)
        if on_head is not None:
            on_head(page.continue_token)
        return _Read(page)

    def stream(self, **kwargs: Any) -> AsyncIterator[WatchEvent[DynamicObject]]:
        self.watch_calls.append(kwargs)
        return _play(self.watches)

    def stream_list(self, **kwargs: Any) -> AsyncIterator[WatchEvent[DynamicObject]]:
        raise AssertionError("stream_list is not scripted")


@dataclass(frozen=True)
class _Read:
    page: ListPage[DynamicObject]

    @property
    def continue_hint(self) -> str | None:
        return self.page.continue_token

    def decode(self) -> ListPage[DynamicObject]:
        return self.page


async def _play(
    scripts: list[list[WatchEvent[DynamicObject] | BaseException]],
) -> AsyncIterator[WatchEvent[DynamicObject]]:
    if not scripts:
        await asyncio.Event().wait()
    for step in scripts.pop(0):
        if isinstance(step, BaseException):
            raise step
        yield step


@asynccontextmanager
async def running(api: Any, clock: FakeClock, **kwargs: Any) -> AsyncIterator[list[SourceEvent]]:
    events: list[SourceEvent] = []
    reflector = KubernetesReflector(
        api=api, watch_timeout_seconds=120, retry_delay=RETRY, clock=clock, **kwargs
    )

    async def pump() -> None:
        async for e in reflector.watch():
            events.append(e)

    task = asyncio.create_task(pump())
    await clock.advance(0)
    try:
        yield events
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_the_fake_is_a_resource_api() -> None:
    assert isinstance(FakeResourceApi(), ResourceApi)


async def test_across_namespaces_objects_are_keyed_namespace_slash_name() -> None:
    """client-go's ``MetaNamespaceKeyFunc``: two objects of one name in two namespaces are two."""
    api = FakeResourceApi(
        lists=[ListPage((obj("a", "p"), obj("b", "p")), "10")],
        watches=[[event("ADDED", obj("c", "p", "11")), event("DELETED", obj("a", "p", "12"))]],
    )
    async with running(api, FakeClock(), namespace="", field_selector="spec.x=1") as events:
        replace, add, dele = events[:3]
        assert isinstance(replace, ReplaceEvent)
        assert sorted(replace.objects) == ["a/p", "b/p"]
        assert isinstance(add, UpsertEvent)
        assert add.key == "c/p"
        assert isinstance(dele, DeleteEvent)
        assert dele.key == "a/p"
    (listed,) = api.list_calls
    assert (listed.namespace, listed.label_selector, listed.field_selector) == ("", "", "spec.x=1")
    assert api.watch_calls[0]["field_selector"] == "spec.x=1"
    assert api.watch_calls[0]["namespace"] == ""


async def test_within_one_namespace_objects_are_keyed_by_name() -> None:
    api = FakeResourceApi(
        lists=[ListPage((obj("ns", "p"),), "10")], watches=[[event("MODIFIED", obj("ns", "p"))]]
    )
    async with running(api, FakeClock(), namespace="ns", label_selector="app=x") as events:
        replace, mod = events[:2]
        assert isinstance(replace, ReplaceEvent)
        assert list(replace.objects) == ["p"]
        assert isinstance(mod, UpsertEvent)
        assert mod.key == "p"
        assert api.list_calls[0].label_selector == "app=x"


@pytest.mark.parametrize(
    ("code", "answer"), [(404, "not served"), (403, "forbidden")], ids=["404", "403"]
)
async def test_a_resource_not_served_or_forbidden_is_listed_again_every_10s(
    code: int, answer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """controller-runtime's ``Kind`` source polls every 10 s, so a CRD installed meanwhile is
    picked up: one ERROR line per attempt naming the resource and the server's answer."""
    clock = FakeClock()
    refused = KubernetesApiError(code, "NotFound" if code == 404 else "Forbidden", "no")
    api = FakeResourceApi(lists=[refused, refused, ListPage((obj("ns", "p"),), "10")])
    with caplog.at_level(logging.ERROR):
        async with running(api, clock, namespace="ns") as events:
            assert len(api.list_calls) == 1
            await clock.advance(NOT_SERVED_RETRY_SECONDS - 0.01)
            assert len(api.list_calls) == 1, "not before 10 s"
            await clock.advance(0.01)
            assert len(api.list_calls) == 2
            await clock.advance(NOT_SERVED_RETRY_SECONDS)
            assert len(api.list_calls) == 3
            assert [type(e) for e in events] == [ReplaceEvent]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 2
    assert (
        f'list enginepools (group "miles.io", version v1alpha1): {answer}: KubernetesApiError: '
        f"HTTP {code}"
    ) in lines[0]
    assert lines[0].endswith("; listing by LIST in 10.00s")


async def test_an_object_that_does_not_validate_ends_the_watch_and_relists_after_one_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The one rule for LIST and WATCH: the object is not served from the cache (a LIST leaves it
    out; a WATCH ends and relists, which leaves it out), named in one ERROR line, and nothing
    spins: the relist waits one backoff step."""
    clock = FakeClock()
    bad = FrameDecodeError(
        "EnginePool ns/q does not validate: spec.replicas: Input should be a valid integer",
        name="q",
        resource_version="11",
        event_type="MODIFIED",
    )
    api = FakeResourceApi(
        lists=[ListPage((obj("ns", "p"), obj("ns", "q")), "10"), ListPage((obj("ns", "p"),), "12")],
        watches=[[bad]],
    )
    with caplog.at_level(logging.ERROR):
        async with running(api, clock, namespace="ns") as events:
            assert len(api.list_calls) == 1
            await clock.advance(RETRY * 2)
            assert len(api.list_calls) == 2
            first, second = (e for e in events if isinstance(e, ReplaceEvent))
            assert sorted(first.objects) == ["p", "q"]
            assert sorted(second.objects) == ["p"], "the stale copy of q is gone"
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "EnginePool watch frame unreadable after resourceVersion=10" in line
    assert "EnginePool=q: EnginePool ns/q does not validate: spec.replicas" in line


def test_a_pod_reflector_still_takes_one_namespace_and_no_field_selector() -> None:
    with pytest.raises(TypeError, match="one of kube_client"):
        KubernetesReflector(namespace="ns", label_selector="")
    with pytest.raises(TypeError, match="one namespace"):
        KubernetesReflector(kube_client=object(), namespace="", label_selector="")  # type: ignore[arg-type]


def test_a_cluster_scoped_resource_takes_no_namespace() -> None:
    nodes = FakeResourceApi(resource=NODES)
    with pytest.raises(TypeError, match="nodes is cluster-scoped"):
        KubernetesReflector(api=nodes, namespace="ns")
    KubernetesReflector(api=nodes, namespace="")
