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


async def apiserver_requests(api_client: Any, resource: str, *verbs: str) -> dict[str, int]:
    """``apiserver_request_total`` on ``resource``, summed for each verb."""
    counts = dict.fromkeys(verbs, 0)
    for line in (await apiserver_metrics(api_client)).splitlines():
        if line.startswith("apiserver_request_total{") and f'resource="{resource}"' in line:
            for verb in counts:
                if f'verb="{verb}"' in line:
                    counts[verb] += int(float(line.rsplit(" ", 1)[1]))
    return counts
