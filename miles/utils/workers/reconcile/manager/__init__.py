"""The process around reconcile loops and the servers it runs. Go: controller-runtime's
``pkg/manager``, with ``pkg/healthz``, ``pkg/metrics/server`` and ``pkg/internal/httpserver``.

``manager`` runs loops with probes, metrics and leader election until a signal
(``Manager``, ``run_until_signalled``); ``healthz`` answers ``/healthz`` and ``/readyz``;
``metrics_server`` serves ``/metrics`` (the ``metrics`` extra, imported only when it serves);
``http_server`` is the small HTTP/1.1 server under both.
"""

from miles.utils.workers.reconcile.manager.healthz import HealthChecks
from miles.utils.workers.reconcile.manager.manager import Manager, ManagerError, run_until_signalled

__all__ = ["HealthChecks", "Manager", "ManagerError", "run_until_signalled"]
