"""A Kubernetes resource as a value: where the apiserver serves a kind, and what it is called.
Go: apimachinery ``schema.GroupVersionResource`` + ``meta.RESTMapping`` (kube-rs ``ApiResource``).

A ``Resource`` names a served resource completely (group, version, plural, kind, scope), so
nothing has to ask the apiserver's discovery to build a request path: client-go learns the plural
and the scope from a ``RESTMapper``, kube-rs from ``ApiResource::from_gvk_with_plural``; here the
caller states them once, and the ready-made values below hold them for the kinds controllers read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VERSION = re.compile(r"^v[0-9]+((alpha|beta)[0-9]+)?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch
"""What ``quote(..., safe="")`` leaves as it is: every valid name, which skips the quoting."""


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource the apiserver serves: ``group`` (``""`` for the core group), ``version``,
    ``plural`` (the path segment, lowercase), ``kind`` and whether it is ``namespaced``.

    ``api_version`` is what objects carry (``v1``, ``apps/v1``); ``path(...)`` is where a request
    goes: ``/api/v1/...`` for the core group, ``/apis/GROUP/VERSION/...`` for every other.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    def __post_init__(self) -> None:
        if self.group and not _DNS_SUBDOMAIN.match(self.group):
            raise ValueError(f"Resource group {self.group!r} is not a DNS subdomain")
        if not _VERSION.match(self.version):
            raise ValueError(f"Resource version {self.version!r} is not a Kubernetes version")
        if not _DNS_LABEL.match(self.plural):
            raise ValueError(f"Resource plural {self.plural!r} is not a lowercase DNS label")
        if not _KIND.match(self.kind):
            raise ValueError(f"Resource kind {self.kind!r} is not a CamelCase name")

    @classmethod
    def custom(
        cls, *, group: str, version: str, plural: str, kind: str, namespaced: bool = True
    ) -> Resource:
        """A custom resource, as its CustomResourceDefinition declares it."""
        if not group:
            raise ValueError("a custom resource has a group (the core group holds no CRDs)")
        return cls(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_kind(self) -> str:
        """``Kind.group`` (``Pod``, ``Deployment.apps``), as Go's ``GroupKind`` prints it."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def group_resource(self) -> str:
        """``plural.group`` (``pods``, ``deployments.apps``), as RBAC and error messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self, *, namespace: str | None = None, name: str | None = None, subresource: str = ""
    ) -> str:
        """The request path: the collection (``name`` None) or one object, in ``namespace`` or, for
        a namespaced resource with ``namespace`` None or ``""``, across every namespace.
        A cluster-scoped resource refuses a namespace."""
        if not self.namespaced and namespace:
            raise ValueError(f"{self.group_resource} is cluster-scoped: no namespace")
        if subresource and name is None:
            raise ValueError(f"subresource {subresource!r} needs an object name")
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if namespace:
            parts.append(f"namespaces/{_segment(namespace)}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError(f"an empty name for one {self.kind}")
            parts.append(_segment(name))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    def __str__(self) -> str:
        return (
            self.group_resource if not self.group else f"{self.plural}.{self.version}.{self.group}"
        )


def _segment(text: str) -> str:
    return text if _UNQUOTED(text) else quote(text, safe="")


PODS = Resource(group="", version="v1", plural="pods", kind="Pod")
EVENTS = Resource(group="", version="v1", plural="events", kind="Event")
CONFIG_MAPS = Resource(group="", version="v1", plural="configmaps", kind="ConfigMap")
SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret")
SERVICES = Resource(group="", version="v1", plural="services", kind="Service")
NODES = Resource(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
NAMESPACES = Resource(
    group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False
)
JOBS = Resource(group="batch", version="v1", plural="jobs", kind="Job")
DEPLOYMENTS = Resource(group="apps", version="v1", plural="deployments", kind="Deployment")
STATEFUL_SETS = Resource(group="apps", version="v1", plural="statefulsets", kind="StatefulSet")
LEASES = Resource(group="coordination.k8s.io", version="v1", plural="leases", kind="Lease")
EVENTS_V1 = Resource(group="events.k8s.io", version="v1", plural="events", kind="Event")
CUSTOM_RESOURCE_DEFINITIONS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
)
