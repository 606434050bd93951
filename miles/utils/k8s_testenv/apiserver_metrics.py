"""The apiserver's own ``/metrics``, read through a ``kubernetes_asyncio`` client: what the
real-apiserver tests and the benchmarks count requests by. Go: none (the apiserver's
``apiserver_request_total`` and ``apiserver_longrunning_requests`` series, as ``kubectl get --raw
/metrics`` shows them)."""

from __future__ import annotations

from typing import Any


async def apiserver_metrics(api_client: Any) -> str:
    """The ``/metrics`` text, read with the client's credentials."""
    response = await api_client.call_api(
        "/metrics",
        "GET",
        auth_settings=["BearerToken"],
        response_types_map={},
        _preload_content=False,
    )
    return str((await response.read()).decode())


def series_sum(text: str, name: str, *labels: str) -> float:
    """The sum of the ``name`` samples in the ``/metrics`` ``text`` whose labels include every one
    of ``labels`` (each written as it stands there: ``'verb="LIST"'``)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(f"{name}{{") and all(label in line for label in labels)
    )


async def apiserver_requests(api_client: Any, resource: str, *verbs: str) -> dict[str, int]:
    """``apiserver_request_total`` on ``resource``, summed for each verb."""
    text = await apiserver_metrics(api_client)
    total = "apiserver_request_total"
    return {
        verb: int(series_sum(text, total, f'resource="{resource}"', f'verb="{verb}"'))
        for verb in verbs
    }
