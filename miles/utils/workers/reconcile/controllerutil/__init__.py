"""Helpers a controller's reconcile writes with: a finalizer around the reconcile, and owner
references. Go: controller-runtime ``pkg/controller/controllerutil`` (kube-rs
``runtime::finalizer``)."""

from miles.utils.workers.reconcile.controllerutil.finalizer import (
    Finalizer,
    PatchClient,
    validate_finalizer_name,
)
from miles.utils.workers.reconcile.controllerutil.owner_references import (
    AlreadyOwnedError,
    OwnerReference,
    controller_of,
    set_controller_reference,
    set_owner_reference,
)

__all__ = [
    "AlreadyOwnedError",
    "Finalizer",
    "OwnerReference",
    "PatchClient",
    "controller_of",
    "set_controller_reference",
    "set_owner_reference",
    "validate_finalizer_name",
]
