"""One consistent LIST read in pages and joined into one page. Go: ``tools/pager.ListPager``.

Pages of ``LIST_PAGE_SIZE`` pods follow continue tokens, each decoded as it arrives; the server
serves every continuation from the first page's snapshot, so the pages join into one page at the
last page's resourceVersion. A continue token the server no longer honours (its snapshot was
compacted away: 410, or a Status reason Expired) restarts the paged LIST from its first page; a
second expiry in a row falls back to one unpaged LIST, which has no token to lose. Go's
``FullListIfExpired`` falls back at the first expiry; restarting once first keeps the one-page
memory bound when the expiry was a single slow read.

With a ``PrefetchPagedPodApi``, page n+1 is requested as soon as page n's first bytes are in (its
continue token is read from the bytes before its items), so the apiserver serves it while page n
still streams and decodes; page n+2 is requested only after page n has decoded, so at most one
page is read ahead, and a LIST that fails or is cancelled cancels it. Go's pager reads its pages
one after another, as ours does over a plain ``PagedPodApi``.

The whole LIST runs inside ``list_memory.listing()``, which owns what it does to memory (the
collector's pause, the aging of what it built, the heap trim).
"""

from __future__ import annotations

import asyncio
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
    def read(token: str | None) -> _Read:
        head: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        asked = options if token is None else options.continued(token)
        task = asyncio.create_task(read_page(asked, on_head=partial(_resolve, head)))
        return _Read(token, task, head)

    pods: list[Any] = []
    current, ahead = read(None), None
    try:
        while True:
            hint = await current.head_or_none()
            ahead = read(hint) if hint else None
            with _continuation(len(pods)) if current.token else nullcontext():
                undecoded = await current.task
            if ahead is not None:
                await ahead.head_or_none()
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
    """One page being read: its continue token, and its own token once the head is in."""

    token: str | None
    task: asyncio.Task[UndecodedPodPage]
    head: asyncio.Future[str | None]

    async def head_or_none(self) -> str | None:
        """The continue token read from the page's first bytes, once they are in (so its request
        is on the wire and its server answering); ``None`` if the read ended without them."""
        await first_of(self.task, self.head)
        return self.head.result() if self.head.done() else None

    async def discard(self) -> None:
        """Cancels the read and waits until it has stopped; its outcome is not wanted."""
        self.task.cancel()
        await asyncio.wait({self.task})
        if not self.task.cancelled():
            self.task.exception()
