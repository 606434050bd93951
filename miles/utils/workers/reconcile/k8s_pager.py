"""One consistent LIST read in pages and joined into one page. Go: ``tools/pager.ListPager``.

Pages of ``LIST_PAGE_SIZE`` pods follow continue tokens, each decoded as it arrives; the server
serves every continuation from the first page's snapshot, so the pages join into one page at the
last page's resourceVersion. A continue token the server no longer honours (its snapshot was
compacted away: 410, or a Status reason Expired) restarts the paged LIST from its first page; a
second expiry in a row falls back to one unpaged LIST, which has no token to lose. Go's
``FullListIfExpired`` falls back at the first expiry; restarting once first keeps the one-page
memory bound when the expiry was a single slow read.
"""

from __future__ import annotations

import logging
from typing import Any

from miles.utils.workers.reconcile.k8s_api import PagedPodApi
from miles.utils.workers.reconcile.k8s_wire import (
    PodListPage,
    exception_rejects_cursor,
    exception_summary,
)

LIST_PAGE_SIZE = 500
"""Pods per LIST page, client-go's ``pager.defaultPageSize``."""
PAGED_ATTEMPTS = 2
"""Paged LISTs tried before the unpaged one, when each loses its continue token."""


class _ContinueExpired(Exception):
    def __init__(self, pods_read: int, cause: BaseException) -> None:
        super().__init__(f"after {pods_read} pods: {cause}")
        self.pods_read = pods_read
        self.cause = cause


async def list_in_pages(
    api: PagedPodApi,
    *,
    namespace: str,
    label_selector: str,
    log: logging.Logger | logging.LoggerAdapter[Any],
    page_size: int = LIST_PAGE_SIZE,
) -> PodListPage:
    """Every pod of one consistent LIST as one page; raises what the LIST raised otherwise."""
    for attempt in range(1, PAGED_ATTEMPTS + 1):
        try:
            return await _paged(
                api, namespace=namespace, label_selector=label_selector, page_size=page_size
            )
        except _ContinueExpired as expired:
            log.warning(
                "pod LIST continue token expired after %d pods (%s), %s",
                expired.pods_read,
                exception_summary(expired.cause),
                "relisting from the first page"
                if attempt < PAGED_ATTEMPTS
                else "falling back to one unpaged LIST",
            )
    return await api.list_pod_page(namespace=namespace, label_selector=label_selector, limit=None)


async def _paged(
    api: PagedPodApi, *, namespace: str, label_selector: str, page_size: int
) -> PodListPage:
    pods: list[Any] = []
    page = await api.list_pod_page(
        namespace=namespace, label_selector=label_selector, limit=page_size
    )
    while True:
        pods.extend(page.pods)
        if not page.continue_token:
            return PodListPage(tuple(pods), page.resource_version)
        try:
            page = await api.list_pod_page(
                namespace=namespace,
                label_selector=label_selector,
                limit=page_size,
                continue_token=page.continue_token,
            )
        except Exception as err:
            if not exception_rejects_cursor(err):
                raise
            raise _ContinueExpired(len(pods), err) from err
