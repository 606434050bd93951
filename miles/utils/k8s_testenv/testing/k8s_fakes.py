"""Kubernetes adapter doubles: a realistic pod, wire frames, a scripted ``KubernetesPodApi``.

``realistic_pod`` is the ~3.5 KB pod the decode benchmarks measure (``bench/decode.py``); it carries
what a controller-created pod carries on a real cluster: labels, annotations, an owner reference,
``managedFields``, one container with env and resources, and a full status. With
``init_container=True`` it also carries every other field ``k8s_types`` reads: a node selector, a
subdomain, and a completed init container.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from miles.utils.workers.reconcile.k8s_types import Pod
from miles.utils.workers.reconcile.k8s_values import ListOptions, PodListPage, PodWatchEvent

PARENT_LABEL = "miles.io/cell"
GATE = "miles.io/paired"

T = TypeVar("T")


def realistic_pod(
    name: str,
    parent: str = "cell-0",
    *,
    namespace: str = "default",
    resource_version: str = "1000",
    phase: str = "Running",
    restart_count: int = 0,
    padding: int = 0,
    init_container: bool = False,
) -> dict[str, Any]:
    """A camelCase pod as the apiserver serves it; ``padding`` bytes go into one annotation."""
    started = "2026-11-30T04:00:05Z"
    created = "2026-11-30T04:00:00Z"
    extra_spec, extra_status = (
        _init_container(parent, created, started) if init_container else ({}, {})
    )
    annotations = {
        "miles.io/config-hash": "9f3c2a4e51b7d08c6a1e2f3b4c5d6e7f",
        "kubectl.kubernetes.io/default-container": "engine",
    }
    if padding:
        annotations["miles.io/padding"] = "x" * padding
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": f"{parent}-",
            "namespace": namespace,
            "uid": f"6b1c4a52-{zlib.crc32(name.encode()) % 10**4:04d}-4f1e-9a7b-1c2d3e4f5a6b",
            "resourceVersion": resource_version,
            "creationTimestamp": created,
            "labels": {
                PARENT_LABEL: parent,
                "app.kubernetes.io/name": "sglang-engine",
                "app.kubernetes.io/managed-by": "miles",
                "pod-template-hash": "7d9f8c6b5",
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{parent}-7d9f8c6b5",
                    "uid": "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": created,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:generateName": {},
                            "f:labels": {".": {}, f"f:{PARENT_LABEL}": {}},
                            "f:ownerReferences": {".": {}, 'k:{"uid":"0a1b2c3d"}': {}},
                        },
                        "f:spec": {
                            "f:containers": {'k:{"name":"engine"}': {".": {}, "f:env": {}}},
                            "f:restartPolicy": {},
                            "f:schedulerName": {},
                        },
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": started,
                    "fieldsType": "FieldsV1",
                    "subresource": "status",
                    "fieldsV1": {
                        "f:status": {
                            "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}},
                            "f:containerStatuses": {},
                            "f:podIP": {},
                            "f:startTime": {},
                        }
                    },
                },
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.example.com/miles/sglang:0.4.9-cu124",
                    "args": ["--model-path", "/models/qwen", "--port", "30000", "--tp", "8"],
                    "ports": [{"name": "http", "containerPort": 30000, "protocol": "TCP"}],
                    "env": [
                        {"name": "MILES_CELL", "value": parent},
                        {"name": "NCCL_DEBUG", "value": "WARN"},
                        {
                            "name": "POD_IP",
                            "valueFrom": {
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}
                            },
                        },
                    ],
                    "resources": {
                        "limits": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "8"},
                        "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "8"},
                    },
                    "volumeMounts": [
                        {"name": "models", "mountPath": "/models", "readOnly": True},
                        {
                            "name": "kube-api-access-x7k2p",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        },
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": "gpu-node-17",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "enableServiceLinks": True,
            **extra_spec,
        },
        "status": {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
            ]
            + [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": created,
                }
            ],
            "hostIP": "10.0.3.17",
            "hostIPs": [{"ip": "10.0.3.17"}],
            "podIP": "10.244.17.42",
            "podIPs": [{"ip": "10.244.17.42"}],
            "startTime": created,
            "containerStatuses": [
                {
                    "name": "engine",
                    "state": {"running": {"startedAt": started}},
                    "lastState": {},
                    "ready": phase == "Running",
                    "restartCount": restart_count,
                    "image": "registry.example.com/miles/sglang:0.4.9-cu124",
                    "imageID": "registry.example.com/miles/sglang@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + "cd" * 32,
                    "started": True,
                }
            ],
            "qosClass": "Guaranteed",
            **extra_status,
        },
    }


def _init_container(
    parent: str, created: str, started: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    image = "registry.example.com/miles/fetch-weights:1.2"
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": "gpu-node-17"},
        "subdomain": parent,
        "initContainers": [
            {"name": "fetch-weights", "image": image, "args": ["--to", "/models/qwen"]}
        ],
    }
    container_id = "containerd://" + "ef" * 32
    status = {
        "initContainerStatuses": [
            {
                "name": "fetch-weights",
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": created,
                        "finishedAt": started,
                        "containerID": container_id,
                    }
                },
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": image,
                "imageID": "registry.example.com/miles/fetch-weights@sha256:" + "12" * 32,
                "containerID": container_id,
                "started": False,
            }
        ]
    }
    return spec, status


def every_field_pod() -> dict[str, Any]:
    """The realistic pod, init container and a sidecar included, after one kill by a signal, and
    with a status reason."""
    wire = realistic_pod("engine-0", "cell-3", restart_count=2, init_container=True)
    wire["spec"]["initContainers"].append(
        {"name": "log-shipper", "image": "registry.example.com/logs:2", "restartPolicy": "Always"}
    )
    wire["status"]["reason"] = "NodePressure"
    wire["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {
            "exitCode": 137,
            "reason": "OOMKilled",
            "message": "memory limit 128Gi reached",
            "signal": 9,
            "startedAt": "2026-11-30T04:00:00Z",
            "finishedAt": "2026-11-30T04:00:05Z",
            "containerID": "containerd://" + "aa" * 32,
        }
    }
    return wire


def gated_pod() -> dict[str, Any]:
    """An inference pod the scheduler has not seen: gated, no node, no container started yet."""
    wire = realistic_pod("infer-0", "cell-3", phase="Pending")
    del wire["spec"]["nodeName"]
    wire["spec"]["schedulingGates"] = [{"name": GATE}]
    wire["metadata"]["deletionTimestamp"] = "2026-11-30T05:00:00Z"
    wire["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
            }
        ],
        "containerStatuses": [
            {
                "name": "engine",
                "state": {"waiting": {"reason": "ContainerCreating", "message": "pulling"}},
                "ready": False,
                "restartCount": 0,
                "image": "registry.example.com/miles/sglang:0.4.9-cu124",
                "imageID": "",
            }
        ],
    }
    return wire


def pod_bytes(pod: dict[str, Any]) -> bytes:
    return json.dumps(pod, separators=(",", ":")).encode()


def frame(event_type: str, obj: Any) -> bytes:
    """One watch line, newline included, as the apiserver writes it."""
    return pod_bytes({"type": event_type, "object": obj}) + b"\n"


def bookmark(resource_version: str) -> bytes:
    return frame("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": resource_version}})


def status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or reason,
        "reason": reason,
        "code": code,
    }


def list_body(
    pods: Iterable[dict[str, Any]], resource_version: str, continue_token: str | None = None
) -> bytes:
    metadata = {"resourceVersion": resource_version}
    if continue_token is not None:
        metadata["continue"] = continue_token
    return pod_bytes(
        {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": list(pods)}
    )


def pod(name: str, parent: str = "cell-0", resource_version: str = "1000", **kw: Any) -> Pod:
    return Pod.model_validate(realistic_pod(name, parent, resource_version=resource_version, **kw))


@dataclass
class ProbeCall:
    """One LIST that carried a ``resource_version``: the reflector's cursor probe."""

    namespace: str
    label_selector: str
    resource_version: str
    limit: int | None


@dataclass
class PageCall:
    """One LIST without a ``resource_version``: a first page or a continuation."""

    limit: int | None
    continue_token: str | None


@dataclass
class WatchCall:
    namespace: str
    label_selector: str
    resource_version: str
    timeout_seconds: int


Step = PodWatchEvent | BaseException | Callable[[], Any]
"""One scripted watch step: yield an event, raise an exception, or await a callable's result."""
Script = list[Step] | BaseException
"""A scripted watch: its steps (ending the list closes the stream cleanly), or an exception raised
when it opens."""


@dataclass
class ContractPodApi:
    """A scripted ``KubernetesPodApi`` with exactly the contract's two methods and parameters, and
    nothing else: each LIST pops ``lists``, each WATCH pops ``watches``; a dry queue parks the call
    forever, so a test sees exactly the calls it scripted."""

    lists: list[PodListPage | BaseException] = field(default_factory=list)
    watches: list[Script] = field(default_factory=list)
    list_calls: list[tuple[str, str]] = field(default_factory=list)
    watch_calls: list[WatchCall] = field(default_factory=list)

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        self.list_calls.append((namespace, label_selector))
        return await next_scripted(self.lists)

    async def stream_pods(
        self,
        *,
        namespace: str,
        label_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> AsyncIterator[PodWatchEvent]:
        self.watch_calls.append(
            WatchCall(namespace, label_selector, resource_version, timeout_seconds)
        )
        async for event in _play(self.watches):
            yield event


@dataclass
class FakePodApi(ContractPodApi):
    """A scripted ``KubernetesPodApi`` that is also a ``PagedPodApi``: each consistent LIST page
    pops ``lists``, each LIST carrying a ``resource_version`` (a cursor probe) pops ``probes``.
    ``list_calls`` has one entry per LIST started (a first page), ``page_calls`` one per page.

    A list or probe entry is a ``PodListPage`` or an exception to raise. A probe with ``probes``
    empty is accepted (an empty page at the cursor), so a test scripts only the probes it means.
    """

    probes: list[PodListPage | BaseException] = field(default_factory=list)
    probe_calls: list[ProbeCall] = field(default_factory=list)
    page_calls: list[PageCall] = field(default_factory=list)

    async def list_pods(self, *, namespace: str, label_selector: str) -> PodListPage:
        return await self.list_pod_page(ListOptions(namespace, label_selector))

    async def list_pod_page(self, options: ListOptions) -> PodListPage:
        if options.resource_version is None:
            if options.continue_token is None:
                self.list_calls.append((options.namespace, options.label_selector))
            self.page_calls.append(PageCall(options.limit, options.continue_token))
            return await next_scripted(self.lists)
        assert options.continue_token is None, "a continuation never carries a resourceVersion"
        self.probe_calls.append(
            ProbeCall(
                options.namespace, options.label_selector, options.resource_version, options.limit
            )
        )
        if not self.probes:
            return PodListPage((), options.resource_version)
        return await next_scripted(self.probes)


@dataclass
class StreamingFakePodApi(FakePodApi):
    """``FakePodApi`` that can also stream a list: each streaming list pops ``stream_lists``."""

    stream_lists: list[Script] = field(default_factory=list)
    stream_list_calls: int = 0

    async def stream_pod_list(
        self, *, namespace: str, label_selector: str, timeout_seconds: int
    ) -> AsyncIterator[PodWatchEvent]:
        self.stream_list_calls += 1
        async for event in _play(self.stream_lists):
            yield event


async def _play(scripts: list[Script]) -> AsyncIterator[PodWatchEvent]:
    if not scripts:
        await asyncio.Event().wait()
    entry = scripts.pop(0)
    if isinstance(entry, BaseException):
        raise entry
    for step in entry:
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, PodWatchEvent):
            yield step
        else:
            await step()


async def next_scripted(queue: list[T | BaseException]) -> T:
    """The next scripted answer, raised when it is an exception; a dry queue parks the call."""
    if not queue:
        await asyncio.Event().wait()
    entry = queue.pop(0)
    if isinstance(entry, BaseException):
        raise entry
    return entry
