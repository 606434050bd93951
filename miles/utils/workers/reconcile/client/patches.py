"""The patches a client sends, one type each. Go: apimachinery ``types.PatchType`` and
controller-runtime's ``client.Patch`` (kube-rs ``Patch::{Merge, Json, Strategic}``).

``MergePatch`` is RFC 7386 (``null`` deletes a key, a list is replaced whole); ``JsonPatch`` is
RFC 6902 (a list of ``add``/``remove``/``replace``/``test``/... operations, applied all or none:
a failed ``test`` fails the whole patch); ``StrategicMergePatch`` merges lists by their patch
merge key, which only built-in kinds declare (the apiserver answers 415 for a custom resource;
the client refuses it before sending). Server-side apply is ``Client.apply``, not a patch value.

A guard makes a patch fail with Conflict when the object changed since it was read:
``JsonPatch.guarded(resource_version, ops)`` leads with a ``test`` of
``/metadata/resourceVersion`` (kopf's and kube-rs' finalizer guard); ``MergePatch(...,
resource_version=...)`` carries ``metadata.resourceVersion``, which the apiserver compares
(controller-runtime's ``MergeFromWithOptimisticLock``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})


@dataclass(frozen=True, slots=True)
class _ObjectPatch:
    """A partial object, ``resource_version`` written into its ``metadata`` as the guard."""

    body: Mapping[str, Any]
    resource_version: str | None = None

    def wire(self) -> Any:
        if self.resource_version is None:
            return self.body
        metadata = dict(self.body.get("metadata") or {})
        metadata["resourceVersion"] = self.resource_version
        return {**self.body, "metadata": metadata}


@dataclass(frozen=True, slots=True)
class MergePatch(_ObjectPatch):
    content_type = MERGE_PATCH


@dataclass(frozen=True, slots=True)
class StrategicMergePatch(_ObjectPatch):
    content_type = STRATEGIC_MERGE_PATCH


@dataclass(frozen=True, slots=True)
class JsonPatch:
    ops: Sequence[Mapping[str, Any]]

    content_type = JSON_PATCH

    def __post_init__(self) -> None:
        for index, op in enumerate(self.ops):
            if op.get("op") not in _OPS or not isinstance(op.get("path"), str):
                raise ValueError(
                    f"JSON patch operation {index} needs an op of {sorted(_OPS)} and a path: {op}"
                )

    @classmethod
    def guarded(cls, resource_version: str, ops: Sequence[Mapping[str, Any]]) -> JsonPatch:
        """``ops`` behind a ``test`` that the object is still at ``resource_version``."""
        if not resource_version:
            raise ValueError(
                "a guarded JSON patch needs the resourceVersion the object was read at"
            )
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
        return cls([test, *ops])

    @property
    def guard(self) -> str | None:
        """The resourceVersion the first op tests, when it is ``guarded``'s test."""
        first = self.ops[0] if self.ops else {}
        if first.get("op") == "test" and first.get("path") == "/metadata/resourceVersion":
            value = first.get("value")
            return value if isinstance(value, str) else None
        return None

    def wire(self) -> Any:
        return [dict(op) for op in self.ops]


Patch = MergePatch | JsonPatch | StrategicMergePatch

BUILT_IN_GROUPS = frozenset(
    {
        "",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "apiregistration.k8s.io",
        "apps",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "autoscaling",
        "batch",
        "certificates.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "internal.apiserver.k8s.io",
        "networking.k8s.io",
        "node.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "resource.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
        "storagemigration.k8s.io",
    }
)
"""The API groups kube-apiserver serves itself (its types declare patch merge keys); a group not
here is taken for a custom resource's, whose strategic merge patch the apiserver refuses with 415
(a CRD's group may end in ``.k8s.io`` too, as the Gateway API's does, so the suffix decides
nothing)."""
