"""Shared informers: one watch and one store for every loop reading the same resource.
Go: client-go ``tools/cache.SharedIndexInformer`` + ``informers.SharedInformerFactory``."""

from miles.utils.workers.reconcile.informer.factory import SharedInformerFactory
from miles.utils.workers.reconcile.informer.shared_informer import SharedInformer, Subscription

__all__ = ["SharedInformer", "SharedInformerFactory", "Subscription"]
