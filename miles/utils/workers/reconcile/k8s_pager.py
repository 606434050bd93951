"""One consistent LIST read in pages and joined into one page. Go: ``tools/pager.ListPager``.

Pages of ``LIST_PAGE_SIZE`` pods follow continue tokens, each decoded as it arrives; the server
serves every continuation from the first page's snapshot, so the pages join into one page at the
last page's resourceVersion. A continue token the server no longer honours (its snapshot was
compacted away: 410, or a Status reason Expired) restarts the paged LIST from its first page; a
second expiry in a row falls back to one unpaged LIST, which has no token to lose. Go's
``FullListIfExpired`` falls back at the first expiry; restarting once first keeps the one-page
memory bound when the expiry was a single slow read.

With a ``PrefetchPagedPodApi``, page n+1 is requested as soon as page n's continue token can be
read without decoding page n: from its first bytes when ``metadata`` precedes the items (a pod
list), so the apiserver serves page n+1 while page n still streams; from its last bytes when
``metadata`` follows them (a custom resource's list, served unstructured). Page n decodes once
page n+1's request is written (``on_sent``; or its head is in, from an API without ``on_sent``),
so the apiserver builds page n+1 while page n decodes. Page n+2 is requested only after page n has
decoded, so at most one page is read ahead, and a LIST that fails or is cancelled cancels it. Go's
pager reads its pages one after another, as ours does over a plain ``PagedPodApi``.

The whole LIST runs inside ``list_memory.listing()``, which owns what it does to memory (the
collector's pause, the aging of what it built, the heap trim).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, overload

from miles.utils.workers.reconcile.k8s_errors import exception_rejects_cursor
from miles.utils.workers.reconcile.k8s_interfaces import (
    PagedPodApi,
    PrefetchPagedPodApi,
    ResourceApi,
    UndecodedPodPage,
)
from miles.utils.workers.reconcile.k8s_values import ListOptions, ListPage, PodListPage
from miles.utils.workers.reconcile.list_memory import listing
from miles.utils.workers.reconcile.log import one_line
from miles.utils.workers.reconcile.tasks import first_of

LIST_PAGE_SIZE = 500
"""Pods per LIST page, client-go's ``pager.defaultPageSize``."""
PAGED_ATTEMPTS = 2
"""Paged LISTs tried before the unpaged one, when each loses its continue token."""


class _ContinueExpired(Exception):
    def __init__(self, pods_read: int, cause: BaseException) -> None:
        super().__init__(f"after {pods_read} pods: {cause}")
        self.pods_read = pods_read
        self.cause = cause


@overload
async def list_in_pages(
    api: ResourceApi,
    options: ListOptions,
    *,
    log: logging.Logger | logging.LoggerAdapter[Any],
    page_size: int = LIST_PAGE_SIZE,
) -> ListPage[Any]: ...


@overload
async def list_in_pages(
    api: PagedPodApi,
    options: ListOptions,
    *,
    log: logging.Logger | logging.LoggerAdapter[Any],
    page_size: int = LIST_PAGE_SIZE,
) -> PodListPage: ...


async def list_in_pages(
    api: PagedPodApi | ResourceApi,
    options: ListOptions,
    *,
    log: logging.Logger | logging.LoggerAdapter[Any],
    page_size: int = LIST_PAGE_SIZE,
) -> Any:
    """Every object of one consistent LIST as one page (a ``PodListPage`` from a pod API, a
    ``ListPage`` from a ``ResourceApi``); raises what the LIST raised otherwise. ``options``
    without a ``limit`` is paged by ``page_size``, as Go's pager sets ``PageSize``."""
    if options.limit is None:
        options = replace(options, limit=page_size)
    with listing():
        if isinstance(api, ResourceApi):
            return await _list(api.list_page, api.read_page, options, log=log)
        read = api.read_pod_page if isinstance(api, PrefetchPagedPodApi) else None
        return await _list(api.list_pod_page, read, options, log=log)


_ListPage = Callable[[ListOptions], Awaitable[Any]]
_ReadPage = Callable[..., Coroutine[Any, Any, UndecodedPodPage]]


def _takes_on_sent(read_page: _ReadPage) -> bool:
    """Whether ``read_page`` takes ``on_sent``; an API written before it takes ``on_head`` only."""
    try:
        parameters = inspect.signature(read_page).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "on_sent" or p.kind is p.VAR_KEYWORD for p in parameters)


async def _list(
    list_page: _ListPage,
    read_page: _ReadPage | None,
    options: ListOptions,
    *,
    log: logging.Logger | logging.LoggerAdapter[Any],
) -> Any:
    for attempt in range(1, PAGED_ATTEMPTS + 1):
        try:
            if read_page is not None:
                return await _prefetched(read_page, options)
            return await _paged(list_page, options)
        except _ContinueExpired as expired:
            log.warning(
                "LIST continue token expired after %d pods (%s), %s",
                expired.pods_read,
                one_line(expired.cause),
                "relisting from the first page"
                if attempt < PAGED_ATTEMPTS
                else "falling back to one unpaged LIST",
            )
    return await list_page(replace(options, limit=None))


async def _paged(list_page: _ListPage, options: ListOptions) -> Any:
    pods: list[Any] = []
    page = await list_page(options)
    while True:
        pods.extend(page.objects)
        if not page.continue_token:
            return page.joined(pods, page.resource_version)
        with _continuation(len(pods)):
            page = await list_page(options.continued(page.continue_token))


async def _prefetched(read_page: _ReadPage, options: ListOptions) -> Any:
    signals_sent = _takes_on_sent(read_page)

    def read(token: str | None) -> _Read:
        loop = asyncio.get_running_loop()
        head: asyncio.Future[str | None] = loop.create_future()
        written: asyncio.Future[str | None] = loop.create_future()
        asked = options if token is None else options.continued(token)
        signals = {"on_head": partial(_resolve, head)}
        if signals_sent:
            signals["on_sent"] = partial(_resolve, written, None)
        task = asyncio.create_task(read_page(asked, **signals))
        return _Read(token, task, head, written)

    pods: list[Any] = []
    current, ahead = read(None), None
    try:
        while True:
            hint = await current.head_or_none()
            ahead = read(hint) if hint else None
            with _continuation(len(pods)) if current.token else nullcontext():
                undecoded = await current.task
            if ahead is None and (hint := undecoded.continue_hint):
                ahead = read(hint)
            if ahead is not None:
                await ahead.until_written()
            page = undecoded.decode()
            del undecoded
            pods.extend(page.objects)
            if not page.continue_token:
                return page.joined(pods, page.resource_version)
            if ahead is None or hint != page.continue_token:
                if ahead is not None:
                    await ahead.discard()
                ahead = read(page.continue_token)
            current, ahead = ahead, None
    finally:
        for unfinished in (current, ahead):
            if unfinished is not None:
                await unfinished.discard()


@contextmanager
def _continuation(pods_read: int) -> Iterator[None]:
    """A continuation that failed because its token is dead raises ``_ContinueExpired``."""
    try:
        yield
    except Exception as err:
        if not exception_rejects_cursor(err):
            raise
        raise _ContinueExpired(pods_read, err) from err


def _resolve(future: asyncio.Future[str | None], hint: str | None) -> None:
    if not future.done():
        future.set_result(hint)


@dataclass(frozen=True)
class _Read:
    """One page being read: its continue token, its own token once the head is in, and whether its
    request is written."""

    token: str | None
    task: asyncio.Task[UndecodedPodPage]
    head: asyncio.Future[str | None]
    written: asyncio.Future[str | None]

    async def head_or_none(self) -> str | None:
        """The continue token read from the page's first bytes, once they are in (so its request
        is on the wire and its server answering); ``None`` if the read ended without them."""
        await first_of(self.task, self.head)
        return self.head.result() if self.head.done() else None

    async def until_written(self) -> None:
        """Returns once the request is written, its head is in or the read ended: a decode that
        held the event loop before that would hold the request back with it."""
        await first_of(self.task, self.head, self.written)

    async def discard(self) -> None:
        """Cancels the read and waits until it has stopped; its outcome is not wanted."""
        self.task.cancel()
        await asyncio.wait({self.task})
        if not self.task.cancelled():
            self.task.exception()
