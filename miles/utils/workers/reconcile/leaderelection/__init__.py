"""Leader election over a coordination.k8s.io/v1 Lease: one candidate of several leads. Go:
client-go's ``tools/leaderelection`` and its ``resourcelock`` (controller-runtime's
``pkg/leaderelection`` configures them for a manager).

``leader_election`` campaigns and renews (``LeaderElector``); ``lease_lock`` reads and writes the
record kept in the Lease (``LeaseLock``) through a ``LeaseApi``, which ``k8s_api`` implements over
the Kubernetes client.
"""

from miles.utils.workers.reconcile.leaderelection.leader_election import LeaderElector
from miles.utils.workers.reconcile.leaderelection.lease_lock import (
    LeaderElectionRecord,
    LeaseApi,
    LeaseConflictError,
    LeaseLock,
    LeaseNotFoundError,
)

__all__ = [
    "LeaderElectionRecord",
    "LeaderElector",
    "LeaseApi",
    "LeaseConflictError",
    "LeaseLock",
    "LeaseNotFoundError",
]
