"""Fast layer: ``KubernetesAsyncioResourceApi(metadata_only=True)`` asks for
``PartialObjectMetadata`` as client-go's metadata client does; without it, plain JSON."""

from __future__ import annotations

from typing import Any

import pytest

from miles.utils.workers.reconcile.k8s_api import (
    METADATA_LIST_ACCEPT,
    METADATA_WATCH_ACCEPT,
    KubernetesAsyncioResourceApi,
)
from miles.utils.workers.reconcile.k8s_objects import PartialObjectMetadata
from miles.utils.workers.reconcile.resource import PODS


class _Recording:
    def __init__(self) -> None:
        self.accepts: list[str] = []

    def call_api(self, path: str, method: str, **kwargs: Any) -> None:
        self.accepts.append(kwargs["header_params"]["Accept"])


@pytest.mark.parametrize(
    ("metadata_only", "watch", "accept"),
    [
        (True, True, METADATA_WATCH_ACCEPT),
        (True, False, METADATA_LIST_ACCEPT),
        (False, True, "application/json"),
        (False, False, "application/json"),
    ],
)
def test_the_accept_header_asks_for_metadata_alone(
    metadata_only: bool, watch: bool, accept: str
) -> None:
    client = _Recording()
    api = KubernetesAsyncioResourceApi(
        api_client=client, resource=PODS, model=PartialObjectMetadata, metadata_only=metadata_only
    )
    options: dict[str, Any] = {"watch": True} if watch else {}
    api._get("ns", _preload_content=False, _request_timeout=None, **options)
    assert client.accepts == [accept]
    assert "as=PartialObjectMetadata" in METADATA_WATCH_ACCEPT
    assert "as=PartialObjectMetadataList;g=meta.k8s.io;v=v1" in METADATA_LIST_ACCEPT
