"""Fast layer: ``list_in_pages`` over a ``PrefetchPagedPodApi`` (rows ``k8s_pager.py``): the next
page is requested once this one's token is in (from its head, or from its body's last bytes when
the token trails the items), and this one decodes once that request is written (once its server
is answering, from an API without ``on_sent``), never more than one page ahead, and a LIST that
fails or is cancelled cancels that read; the collector stays paused for the whole LIST, and what a
LIST built is frozen."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from miles.utils.k8s_testenv.testing.k8s_fakes import list_body, pod, realistic_pod
from miles.utils.workers.reconcile.gc_pause import COLLECTOR
from miles.utils.workers.reconcile.k8s_errors import FrameDecodeError, KubernetesApiError
from miles.utils.workers.reconcile.k8s_interfaces import PrefetchPagedPodApi
from miles.utils.workers.reconcile.k8s_pager import list_in_pages
from miles.utils.workers.reconcile.k8s_values import ListOptions, PodListPage
from miles.utils.workers.reconcile.k8s_wire import (
    peek_continue_token,
    peek_trailing_continue_token,
)

LOG = logging.getLogger("test_k8s_pager")


@pytest.fixture(autouse=True)
def collector_on_and_unfrozen() -> Iterator[None]:
    gc.enable()
    yield
    gc.unfreeze()
    gc.enable()


@dataclass
class Read:
    """One ``read_pod_page`` call: its token, and gates a test may hold shut."""

    token: str | None
    answer: asyncio.Event = field(default_factory=asyncio.Event)
    body: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False


@dataclass
class Undecoded:
    api: PrefetchApi
    page: PodListPage | BaseException
    continue_hint: str | None

    def decode(self) -> PodListPage:
        self.api.decoded.append((len(self.api.reads), gc.isenabled()))
        if isinstance(self.page, BaseException):
            raise self.page
        return self.page


@dataclass
class PrefetchApi:
    """Pages by token; a token in ``held`` delivers its head (``on_head``) only once its
    ``Read.answer`` is set, one in ``bodies_held`` delivers its head at once and its body once its
    ``Read.body`` is set. The hint is ``hints[token]`` if given, else the page's own token. An
    exception entry is raised by the read, a ``FrameDecodeError`` by the decode. ``decoded`` has,
    per decode, how many reads had started and whether the collector was on."""

    pages: dict[str | None, list[PodListPage | BaseException]]
    hints: dict[str | None, str | None] = field(default_factory=dict)
    held: set[str | None] = field(default_factory=set)
    bodies_held: set[str | None] = field(default_factory=set)
    reads: list[Read] = field(default_factory=list)
    decoded: list[tuple[int, bool]] = field(default_factory=list)
    collector_on_in_reads: list[bool] = field(default_factory=list)
    read_started: asyncio.Event = field(default_factory=asyncio.Event)
    trailing: bool = False

    async def list_pod_page(self, options: ListOptions) -> PodListPage:
        return (await self.read_pod_page(options)).decode()

    async def read_pod_page(
        self, options: ListOptions, *, on_head: Callable[[str | None], object] | None = None
    ) -> Undecoded:
        continue_token = options.continue_token
        read = Read(continue_token)
        self.reads.append(read)
        self.read_started.set()
        self.collector_on_in_reads.append(gc.isenabled())
        try:
            if continue_token in self.held:
                await read.answer.wait()
            entry = self.pages[continue_token].pop(0)
            if isinstance(entry, BaseException) and not isinstance(entry, FrameDecodeError):
                raise entry
            hint = self.hints.get(
                continue_token, entry.continue_token if isinstance(entry, PodListPage) else None
            )
            if on_head is not None:
                on_head(None if self.trailing else hint)
            if continue_token in self.bodies_held:
                await read.body.wait()
        except asyncio.CancelledError:
            read.cancelled = True
            raise
        return Undecoded(self, entry, hint)

    async def started(self, reads: int) -> None:
        while len(self.reads) < reads:
            self.read_started.clear()
            await self.read_started.wait()


@dataclass
class SendingApi(PrefetchApi):
    """A ``PrefetchApi`` that calls ``on_sent`` as each read starts (its request written), before
    its head: ``trailing`` pages announce no token at their head (a custom resource's list), their
    ``continue_hint`` has it once the body is in."""

    async def read_pod_page(
        self,
        options: ListOptions,
        *,
        on_head: Callable[[str | None], object] | None = None,
        on_sent: Callable[[], object] | None = None,
    ) -> Undecoded:
        if on_sent is not None:
            on_sent()
        return await super().read_pod_page(options, on_head=on_head)


def pages(count: int, per_page: int = 2) -> dict[str | None, list[PodListPage | BaseException]]:
    """``count`` pages chained by tokens ``t1``, ``t2``, ...; pods ``p0``, ``p1``, ..."""
    chained: dict[str | None, list[PodListPage | BaseException]] = {}
    for number in range(count):
        token = f"t{number}" if number else None
        following = f"t{number + 1}" if number + 1 < count else None
        names = [f"p{number * per_page + i}" for i in range(per_page)]
        chained[token] = [PodListPage(tuple(pod(n) for n in names), "77", following)]
    return chained


async def listed(api: PrefetchApi) -> PodListPage:
    return await list_in_pages(api, ListOptions("ns"), log=LOG)


def names(page: PodListPage) -> list[str]:
    return [p.metadata.name for p in page.pods]


def test_the_fake_offers_the_prefetch_capability() -> None:
    assert isinstance(PrefetchApi(pages={}), PrefetchPagedPodApi)


async def test_the_next_page_is_requested_before_this_one_decodes_never_two_ahead() -> None:
    api = PrefetchApi(pages(4))
    page = await listed(api)
    assert names(page) == [f"p{i}" for i in range(8)]
    assert page.resource_version == "77"
    assert [r.token for r in api.reads] == [None, "t1", "t2", "t3"]
    # Page n decodes once n + 2 reads have started (itself and the next), the last with n + 1.
    assert [started for started, _ in api.decoded] == [2, 3, 4, 4]


async def test_the_next_page_is_requested_once_this_ones_head_is_in_before_its_body() -> None:
    api = PrefetchApi(pages(4), bodies_held={None, "t1"})
    task = asyncio.create_task(listed(api))
    await api.started(2)
    assert [r.token for r in api.reads] == [None, "t1"]
    api.reads[0].body.set()
    await api.started(3)
    for _ in range(20):
        await asyncio.sleep(0)
    # Page 1's body is still out: page 2 is requested, page 3 is not (one ahead at most).
    assert [r.token for r in api.reads] == [None, "t1", "t2"]
    assert len(api.decoded) == 1
    api.reads[1].body.set()
    assert len((await task).pods) == 8


async def test_a_page_decodes_only_once_the_next_pages_server_is_answering() -> None:
    """So the request is on the wire before the decode holds the event loop."""
    api = PrefetchApi(pages(2), held={"t1"})
    task = asyncio.create_task(listed(api))
    await api.started(2)
    assert api.decoded == []
    api.reads[1].answer.set()
    assert names(await task) == ["p0", "p1", "p2", "p3"]
    assert len(api.decoded) == 2


async def test_a_page_decodes_once_the_next_request_is_written_before_its_head() -> None:
    """The apiserver answers a page's head only once it has built the page, so waiting for the
    head would leave it idle while this page decodes."""
    api = SendingApi(pages(3), held={"t1"})
    task = asyncio.create_task(listed(api))
    await api.started(2)
    for _ in range(20):
        await asyncio.sleep(0)
    assert api.decoded == [(2, False)]
    api.reads[1].answer.set()
    assert names(await task) == [f"p{i}" for i in range(6)]
    assert [started for started, _ in api.decoded] == [2, 3, 3]


async def test_a_token_after_the_items_asks_for_the_next_page_before_this_one_decodes() -> None:
    """A custom resource's list: no token at the head; the next page is asked for from the token
    in the body's last bytes, and this page decodes while the apiserver builds that one."""
    api = SendingApi(pages(3), held={"t1", "t2"}, trailing=True)
    task = asyncio.create_task(listed(api))
    await api.started(2)
    for _ in range(20):
        await asyncio.sleep(0)
    assert [r.token for r in api.reads] == [None, "t1"]
    assert api.decoded == [(2, False)]
    api.reads[1].answer.set()
    await api.started(3)
    for _ in range(20):
        await asyncio.sleep(0)
    assert api.decoded == [(2, False), (3, False)]
    api.reads[2].answer.set()
    assert names(await task) == [f"p{i}" for i in range(6)]
    assert [r.token for r in api.reads] == [None, "t1", "t2"]


async def test_the_collector_stays_paused_for_the_whole_list_and_comes_back_on() -> None:
    api = PrefetchApi(pages(3))
    await listed(api)
    assert api.collector_on_in_reads == [False, False, False]
    assert [on for _, on in api.decoded] == [False, False, False]
    assert gc.isenabled()
    assert COLLECTOR.holders == 0


async def test_a_listed_page_lands_in_the_oldest_generation_and_nothing_stays_frozen() -> None:
    page = await listed(PrefetchApi(pages(2)))
    assert len(page.pods) == 4
    assert gc.get_freeze_count() == 0
    oldest = {id(obj) for obj in gc.get_objects(generation=2)}
    assert id(page) in oldest
    assert all(id(pod) in oldest for pod in page.pods)


async def test_cyclic_garbage_alive_at_the_end_of_a_list_is_still_collected() -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    witness = weakref.ref(cycle := Cycle())
    await listed(PrefetchApi(pages(1)))
    del cycle
    gc.collect()
    assert witness() is None


async def test_a_heap_the_process_froze_itself_stays_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    await listed(PrefetchApi(pages(1)))
    # Neither unfrozen nor frozen further; a frozen object may still be freed by its refcount.
    assert 0 < gc.get_freeze_count() <= frozen


async def test_a_page_that_does_not_decode_cancels_the_read_ahead() -> None:
    chained = pages(3)
    chained["t1"] = [FrameDecodeError("unreadable pod list")]
    api = PrefetchApi(chained, hints={"t1": "t2"}, bodies_held={"t2"})
    with pytest.raises(FrameDecodeError, match="unreadable pod list"):
        await listed(api)
    assert [(r.token, r.cancelled) for r in api.reads] == [
        (None, False),
        ("t1", False),
        ("t2", True),
    ]
    assert gc.isenabled()
    assert COLLECTOR.holders == 0


@pytest.mark.parametrize("trailing", [False, True], ids=["leading-token", "trailing-token"])
async def test_a_cancelled_list_cancels_the_read_ahead_and_restores_the_collector(
    trailing: bool,
) -> None:
    api = (
        SendingApi(pages(3), held={"t1"}, trailing=True)
        if trailing
        else PrefetchApi(pages(3), held={"t1"})
    )
    before = gc.get_freeze_count()
    task = asyncio.create_task(listed(api))
    await api.started(2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(r.token, r.cancelled) for r in api.reads] == [(None, False), ("t1", True)]
    assert gc.isenabled()
    assert COLLECTOR.holders == 0
    assert gc.get_freeze_count() == before


async def test_a_hint_the_decoded_page_contradicts_is_dropped_for_the_decoded_token() -> None:
    api = PrefetchApi({**pages(2), "stale": [PodListPage((), "1")]}, hints={None: "stale"})
    page = await listed(api)
    assert [r.token for r in api.reads] == [None, "stale", "t1"]
    assert names(page) == ["p0", "p1", "p2", "p3"]


async def test_a_page_without_a_hint_is_followed_after_its_decode() -> None:
    api = PrefetchApi(pages(2), hints={None: None})
    page = await listed(api)
    assert [started for started, _ in api.decoded] == [1, 2]
    assert names(page) == ["p0", "p1", "p2", "p3"]


@pytest.mark.parametrize("trailing", [False, True], ids=["leading-token", "trailing-token"])
async def test_an_expired_continuation_read_ahead_restarts_the_list_from_page_one(
    caplog: pytest.LogCaptureFixture, trailing: bool
) -> None:
    chained = pages(2)
    chained[None].append(chained[None][0])
    chained["t1"].insert(0, KubernetesApiError(410, "Expired", "continue token expired"))
    api = SendingApi(chained, trailing=True) if trailing else PrefetchApi(chained)
    with caplog.at_level(logging.WARNING):
        page = await listed(api)
    assert [r.token for r in api.reads] == [None, "t1", None, "t1"]
    assert names(page) == ["p0", "p1", "p2", "p3"]
    assert "continue token expired after 2 pods" in caplog.text


def test_the_continue_token_is_read_from_the_bytes_before_the_items() -> None:
    body = list_body([realistic_pod("a")], "42", continue_token="tok/1+=")
    assert body.startswith(b'{"kind": "PodList"') or body.startswith(b'{"kind":"PodList"')
    assert peek_continue_token(body) == "tok/1+="
    assert peek_continue_token(list_body([realistic_pod("a")], "42")) is None
    assert peek_continue_token(b'{"items":[],"metadata":{"continue":"x"}}') is None
    assert peek_continue_token(b'{"metadata":{"continue":') is None
    assert peek_continue_token(b'{"kind":"PodList","metadata":{"continue":"x"},"items":[]}') == "x"


def test_the_continue_token_is_read_from_the_bytes_after_the_items() -> None:
    """As the apiserver writes a custom resource's list: its keys sorted, ``metadata`` last."""
    body = b'{"apiVersion":"x/v1","items":[{"metadata":{"name":"a"}}],"kind":"XList",'
    assert (
        peek_trailing_continue_token(
            body + b'"metadata":{"continue":"tok/1+=","resourceVersion":"7"}}\n'
        )
        == "tok/1+="
    )
    assert peek_trailing_continue_token(body + b'"metadata":{"resourceVersion":"7"}}') is None
    assert peek_trailing_continue_token(b'{"items":[{"metadata":{"continue":"x"}}]}') is None
    assert peek_trailing_continue_token(b'{"items":[],"metadata":{"continue":"x"}') is None
    pods_first = list_body([realistic_pod("a")], "42", continue_token="tok")
    assert peek_trailing_continue_token(pods_first) is None
