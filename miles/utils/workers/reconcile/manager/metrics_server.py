"""``/metrics`` in the Prometheus text exposition format. Go: CR ``pkg/metrics/server``
(``promhttp.HandlerFor(registry)``).

``prometheus_client`` (the ``metrics`` extra) renders the registry the loops report to
(``ReconcileLoop(metrics=registry)``), by default its global ``REGISTRY``, which also carries the
process and platform collectors as Go's registry carries its process and Go collectors. A scraper
that asks for OpenMetrics in ``Accept`` gets it, as ``promhttp`` negotiates. The scrape runs on the
event loop: the loop's collector reads plain counters and costs no I/O.
"""

from __future__ import annotations

from http import HTTPStatus

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from miles.utils.workers.reconcile.manager.http_server import (
    HttpServer,
    Request,
    Response,
    not_found,
)

METRICS_PATH = "/metrics"
DEFAULT_BIND_ADDRESS = ":8080"
"""Go: ``metricsserver.DefaultBindAddress``; ``"0"`` switches the server off."""


class MetricsHandler:
    """Answers ``GET /metrics`` from ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry

    async def __call__(self, request: Request) -> Response:
        if request.path != METRICS_PATH:
            return not_found()
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(HTTPStatus.OK, encoder(self.registry), content_type)


def metrics_server(
    host: str | None, port: int, registry: CollectorRegistry | None = None
) -> HttpServer:
    """CR's metrics server: ``/metrics`` alone on its own port."""
    return HttpServer(MetricsHandler(registry), host=host, port=port, name="metrics")
