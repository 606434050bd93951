"""resource.Resource: the request paths and names of a served resource."""

from __future__ import annotations

import pytest

from miles.utils.workers.reconcile.resource import (
    DEPLOYMENTS,
    NODES,
    PODS,
    Resource,
)


def test_core_group_paths_are_under_api() -> None:
    assert PODS.api_version == "v1"
    assert PODS.path(namespace="train") == "/api/v1/namespaces/train/pods"
    assert PODS.path(namespace="train", name="p-0", subresource="status") == (
        "/api/v1/namespaces/train/pods/p-0/status"
    )
    assert PODS.path() == "/api/v1/pods"


def test_named_groups_are_under_apis() -> None:
    assert DEPLOYMENTS.api_version == "apps/v1"
    assert DEPLOYMENTS.group_kind == "Deployment.apps"
    assert DEPLOYMENTS.path(namespace="ns", name="d") == "/apis/apps/v1/namespaces/ns/deployments/d"


def test_cluster_scoped_refuses_a_namespace() -> None:
    assert NODES.path(name="n1") == "/api/v1/nodes/n1"
    with pytest.raises(ValueError, match="cluster-scoped"):
        NODES.path(namespace="ns")


def test_custom_resource_needs_a_group_and_valid_names() -> None:
    pools = Resource.custom(
        group="miles.io", version="v1alpha1", plural="enginepools", kind="EnginePool"
    )
    assert pools.path(namespace="a") == "/apis/miles.io/v1alpha1/namespaces/a/enginepools"
    assert str(pools) == "enginepools.v1alpha1.miles.io"
    assert pools.group_resource == "enginepools.miles.io"
    with pytest.raises(ValueError, match="group"):
        Resource.custom(group="", version="v1", plural="xs", kind="X")
    with pytest.raises(ValueError, match="plural"):
        Resource(group="a.io", version="v1", plural="Xs", kind="X")
    with pytest.raises(ValueError, match="version"):
        Resource(group="a.io", version="1", plural="xs", kind="X")


def test_names_are_escaped_and_an_empty_one_refused() -> None:
    assert PODS.path(namespace="n", name="a b") == "/api/v1/namespaces/n/pods/a%20b"
    with pytest.raises(ValueError, match="empty name"):
        PODS.path(namespace="n", name="")
    with pytest.raises(ValueError, match="needs an object name"):
        PODS.path(namespace="n", subresource="status")
