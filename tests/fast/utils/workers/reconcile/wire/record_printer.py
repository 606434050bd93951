"""Re-records ``printer_pods.json``: pods in every state ``kubectl get pods`` names, as a real
kube-apiserver returns them, each with the apiserver's own table row for it.

``.venv/bin/python -m tests.fast.utils.workers.reconcile.wire.record_printer [KUBECONFIG [NODE]]``:
with a kubeconfig, records on that cluster; without, starts a local control plane (k8s_testenv's
pins). Most cases are a pod created on a node no kubelet runs, its status written through
``pods/status`` as a kubelet writes it. With ``NODE`` (a KWOK node, as ``env up`` starts), the
``kwok-*`` cases are bound to it and their status is written by KWOK's stages (ready, restarts,
completion, a graceful delete). With ``--kubelet NODE`` (the real node ``env up`` starts), the
``kubelet-*`` cases run the engine image on it and the kubelet writes their status: a crash loop,
an init container running and one failing, a completion and an error (the engine's ``/exit``), a
pod that ignores SIGTERM while it terminates. The expected READY, STATUS and RESTARTS come from the
apiserver's server-side printing (``Accept: application/json;as=Table``), which is what ``kubectl
get pods`` shows: the same ``printPod`` that ``cli/pod_columns.py`` ports.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from miles.utils.k8s_testenv.client import api_client

HERE = Path(__file__).parent
NAMESPACE = f"printer-{uuid.uuid4().hex[:6]}"
"""Fresh per run: without a namespace controller, a deleted namespace never goes away."""
NODE = "printer-node"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def _ago(minutes: float) -> str:
    moment = datetime.now(UTC) - timedelta(minutes=minutes)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _running(name: str, *, ready: bool = True, restarts: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "image": "miles/engine:test",
        "imageID": "",
        "ready": ready,
        "started": True,
        "restartCount": restarts,
        "state": {"running": {"startedAt": _ago(1)}},
    }


def _waiting(name: str, reason: str, *, restarts: int = 0, last_exit: int = 1) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": name,
        "image": "miles/engine:test",
        "imageID": "",
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": reason}},
    }
    if restarts:
        status["lastState"] = {
            "terminated": {
                "exitCode": last_exit,
                "reason": "Error",
                "startedAt": _ago(14),
                "finishedAt": _ago(12.5),
            }
        }
    return status


def _terminated(
    name: str, exit_code: int, reason: str | None = None, signal: int | None = None
) -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "startedAt": _ago(3),
        "finishedAt": _ago(2),
    }
    if reason:
        terminated["reason"] = reason
    if signal:
        terminated["signal"] = signal
    return {
        "name": name,
        "image": "miles/engine:test",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }


def _condition(kind: str, status: str, reason: str | None = None) -> dict[str, Any]:
    condition = {"type": kind, "status": status, "lastTransitionTime": _ago(1)}
    if reason:
        condition["reason"] = reason
    return condition


READY = [_condition("Initialized", "True"), _condition("Ready", "True")]
NOT_INITIALIZED = [_condition("Initialized", "False", "ContainersNotInitialized")]

CASES: list[dict[str, Any]] = [
    {"case": "pending-unscheduled", "node": None, "status": {}},
    {"case": "pending-no-status", "status": {"phase": "Pending"}},
    {
        "case": "container-creating",
        "status": {
            "phase": "Pending",
            "containerStatuses": [_waiting("engine", "ContainerCreating")],
        },
    },
    {
        "case": "running",
        "status": {
            "phase": "Running",
            "podIP": "10.9.0.1",
            "podIPs": [{"ip": "10.9.0.1"}],
            "conditions": READY,
            "containerStatuses": [_running("engine")],
        },
    },
    {
        "case": "running-not-ready",
        "status": {
            "phase": "Running",
            "podIP": "10.9.0.2",
            "containerStatuses": [_running("engine", ready=False)],
        },
    },
    {
        "case": "crash-loop",
        "status": {
            "phase": "Running",
            "podIP": "10.9.0.3",
            "containerStatuses": [_waiting("engine", "CrashLoopBackOff", restarts=3)],
        },
    },
    {
        "case": "error",
        "status": {"phase": "Failed", "containerStatuses": [_terminated("engine", 1, "Error")]},
    },
    {
        "case": "completed",
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [_terminated("engine", 0, "Completed")],
        },
    },
    {
        "case": "oom-killed",
        "status": {
            "phase": "Running",
            "containerStatuses": [_terminated("engine", 137, "OOMKilled")],
        },
    },
    {
        "case": "signal-no-reason",
        "status": {"phase": "Failed", "containerStatuses": [_terminated("engine", 0, signal=9)]},
    },
    {
        "case": "exit-code-no-reason",
        "status": {"phase": "Failed", "containerStatuses": [_terminated("engine", 3)]},
    },
    {
        "case": "evicted",
        "status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"},
    },
    {
        "case": "not-ready-one-completed",
        "containers": ["engine", "helper"],
        "status": {
            "phase": "Running",
            "containerStatuses": [_running("engine"), _terminated("helper", 0, "Completed")],
        },
    },
    {
        "case": "running-one-completed-ready",
        "containers": ["engine", "helper"],
        "status": {
            "phase": "Running",
            "conditions": READY,
            "containerStatuses": [_running("engine"), _terminated("helper", 0, "Completed")],
        },
    },
    {
        "case": "error-one-failed",
        "containers": ["engine", "helper"],
        "status": {
            "phase": "Running",
            "containerStatuses": [_running("engine"), _terminated("helper", 2, "Completed")],
        },
    },
    {
        "case": "init-1-of-2",
        "init": ["fetch", "warm"],
        "status": {
            "phase": "Pending",
            "conditions": NOT_INITIALIZED,
            "initContainerStatuses": [
                _terminated("fetch", 0, "Completed"),
                _running("warm", ready=False),
            ],
            "containerStatuses": [_waiting("engine", "PodInitializing")],
        },
    },
    {
        "case": "init-0-of-2-waiting",
        "init": ["fetch", "warm"],
        "status": {
            "phase": "Pending",
            "conditions": NOT_INITIALIZED,
            "initContainerStatuses": [
                _waiting("fetch", "PodInitializing"),
                _waiting("warm", "PodInitializing"),
            ],
        },
    },
    {
        "case": "init-crash-loop",
        "init": ["fetch"],
        "status": {
            "phase": "Pending",
            "conditions": NOT_INITIALIZED,
            "initContainerStatuses": [_waiting("fetch", "CrashLoopBackOff", restarts=4)],
        },
    },
    {
        "case": "init-exit-code",
        "init": ["fetch"],
        "status": {
            "phase": "Pending",
            "conditions": NOT_INITIALIZED,
            "initContainerStatuses": [_terminated("fetch", 2)],
        },
    },
    {
        "case": "init-error-reason",
        "init": ["fetch"],
        "status": {
            "phase": "Failed",
            "conditions": NOT_INITIALIZED,
            "initContainerStatuses": [_terminated("fetch", 1, "Error")],
        },
    },
    {
        "case": "sidecar-running",
        "sidecars": ["proxy"],
        "status": {
            "phase": "Running",
            "conditions": READY,
            "initContainerStatuses": [_running("proxy", restarts=1)],
            "containerStatuses": [_running("engine")],
        },
    },
    {
        "case": "scheduling-gated",
        "node": None,
        "gates": ["miles.test/wait"],
        "status": {
            "phase": "Pending",
            "conditions": [_condition("PodScheduled", "False", "SchedulingGated")],
        },
    },
    {
        "case": "terminating",
        "delete": True,
        "status": {
            "phase": "Running",
            "conditions": READY,
            "containerStatuses": [_running("engine")],
        },
    },
    {
        "case": "terminating-completed",
        "delete": True,
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [_terminated("engine", 0, "Completed")],
        },
    },
    {
        "case": "node-lost-terminating",
        "delete": True,
        "status": {"phase": "Running", "reason": "NodeLost"},
    },
    {
        "case": "restarted-running",
        "status": {
            "phase": "Running",
            "conditions": READY,
            "containerStatuses": [
                {
                    **_running("engine", restarts=2),
                    "lastState": _waiting("x", "y", restarts=1)["lastState"],
                }
            ],
        },
    },
]


KWOK_CASES: list[dict[str, Any]] = [
    {"case": "kwok-running", "status": {}, "wait": "Running"},
    {
        "case": "kwok-restarted",
        "status": {},
        "annotations": {"kwok.miles.local/restart-count": "2"},
        "wait": "restarts=2",
    },
    {
        "case": "kwok-completed",
        "status": {},
        "restart_policy": "Never",
        "annotations": {"kwok.miles.local/complete": "true"},
        "wait": "Succeeded",
    },
    {"case": "kwok-terminating", "status": {}, "wait": "Running", "delete": True},
]


def _kubelet_cases() -> list[dict[str, Any]]:
    unlistenable = {"PORT": "-1"}
    """The engine exits 3 when it cannot listen: a container that crashes at once."""
    return [
        {"case": "kubelet-running", "wait": "Running"},
        {"case": "kubelet-init-running", "init_engine": {}, "wait": "init=running"},
        {
            "case": "kubelet-init-error",
            "init_engine": unlistenable,
            "restart_policy": "Never",
            "wait": "Failed",
        },
        {"case": "kubelet-completed", "restart_policy": "Never", "exit": 0, "wait": "Succeeded"},
        {"case": "kubelet-error", "restart_policy": "Never", "exit": 1, "wait": "Failed"},
        {"case": "kubelet-terminating", "ignore_term": True, "wait": "Running", "delete": True},
        # Last, so the table is read inside the 40 s back-off that follows the third crash.
        {"case": "kubelet-crash-loop", "engine": unlistenable, "wait": "crash-loop=3"},
    ]


def _kubelet_manifest(case: dict[str, Any], node: str) -> dict[str, Any]:
    from miles.utils.k8s_testenv.kubelet import engine_container

    container = engine_container(
        term_delay_seconds=-1 if case.get("ignore_term") else 0.2,
        env=case.get("engine") or None,
    )
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [container],
        "terminationGracePeriodSeconds": 300 if case.get("ignore_term") else 2,
    }
    if "init_engine" in case:
        init = engine_container(name="warm", env=case["init_engine"] or None)
        init.pop("ports", None)
        spec["initContainers"] = [init]
    if case.get("restart_policy"):
        spec["restartPolicy"] = case["restart_policy"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": case["case"], "labels": {"miles.test/printer": "yes"}},
        "spec": spec,
    }


def _manifest(case: dict[str, Any], node: str = NODE) -> dict[str, Any]:
    containers = case.get("containers", ["engine"])
    spec: dict[str, Any] = {
        "containers": [{"name": c, "image": "miles/engine:test"} for c in containers],
        "terminationGracePeriodSeconds": 3600,
    }
    if case.get("node", NODE):
        spec["nodeName"] = node
    if case.get("restart_policy"):
        spec["restartPolicy"] = case["restart_policy"]
    init = [{"name": c, "image": "miles/init:test"} for c in case.get("init", [])]
    init += [
        {"name": c, "image": "miles/proxy:test", "restartPolicy": "Always"}
        for c in case.get("sidecars", [])
    ]
    if init:
        spec["initContainers"] = init
    if case.get("gates"):
        spec["schedulingGates"] = [{"name": g} for g in case["gates"]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": case["case"],
            "labels": {"miles.test/printer": "yes", "cell": "cell-0"},
            "annotations": case.get("annotations", {}),
            "finalizers": [] if case.get("writer") else ["miles.test/keep"],
        },
        "spec": spec,
    }


async def _get(api: Any, path: str, accept: str = "application/json") -> Any:
    response = await api.call_api(
        path,
        "GET",
        header_params={"Accept": accept},
        _preload_content=False,
        auth_settings=["BearerToken"],
    )
    response = response[0] if isinstance(response, tuple) else response
    try:
        return json.loads(await response.read())
    finally:
        response.release()


def _reached(pod: Any, wait: str) -> bool:
    if wait.startswith(("waiting=", "init=")):
        kind, value = wait.split("=")
        statuses = (
            pod.status.init_container_statuses if kind == "init" else pod.status.container_statuses
        ) or []
        if kind == "init":
            return any(c.state.running for c in statuses)
        return any(c.state.waiting and c.state.waiting.reason == value for c in statuses)
    if wait.startswith("crash-loop="):
        statuses = pod.status.container_statuses or []
        return any(
            c.restart_count >= int(wait.split("=")[1])
            and c.state.waiting
            and c.state.waiting.reason == "CrashLoopBackOff"
            for c in statuses
        )
    if wait.startswith("restarts="):
        statuses = pod.status.container_statuses or []
        restarts: int = sum(c.restart_count for c in statuses)
        return restarts >= int(wait.split("=")[1])
    return bool(pod.status.phase == wait)


async def _wait_until(core: Any, case: dict[str, Any]) -> None:
    for _ in range(600):
        if _reached(await core.read_namespaced_pod(case["case"], NAMESPACE), case["wait"]):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{case['case']} did not reach {case['wait']} within 120s")


async def _create(core: Any, case: dict[str, Any], node: str | None) -> None:
    if case.get("writer") == "kubelet" and node:
        await core.create_namespaced_pod(NAMESPACE, _kubelet_manifest(case, node))
    else:
        await core.create_namespaced_pod(NAMESPACE, _manifest(case, node or NODE))
    if "exit" in case:
        from miles.utils.k8s_testenv.kubelet import crash_engine

        await _wait_until(core, {**case, "wait": "Running"})
        await crash_engine(core, namespace=NAMESPACE, name=case["case"], exit_code=case["exit"])
    if case.get("writer") in ("kwok", "kubelet"):
        await _wait_until(core, case)


async def record(
    kubeconfig: Path, kwok_node: str | None = None, kubelet_node: str | None = None
) -> None:
    from kubernetes_asyncio import client

    cases = [
        *CASES,
        *({**c, "writer": "kwok"} for c in KWOK_CASES if kwok_node),
        *({**c, "writer": "kubelet"} for c in (_kubelet_cases() if kubelet_node else [])),
    ]
    async with api_client(kubeconfig) as api:
        core: Any = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": NAMESPACE}})
        for case in cases:
            node = {"kwok": kwok_node, "kubelet": kubelet_node}.get(case.get("writer", ""))
            await _create(core, case, node)
            if case.get("status"):
                await core.patch_namespaced_pod_status(
                    case["case"], NAMESPACE, {"status": case["status"]}
                )
            if case.get("delete"):
                await core.delete_namespaced_pod(case["case"], NAMESPACE)
        await asyncio.sleep(1)
        base = f"/api/v1/namespaces/{NAMESPACE}/pods"
        pods = await _get(api, base)
        table = await _get(api, base, TABLE)
        recorded_at = datetime.now(UTC).isoformat()
        columns = [c["name"] for c in table["columnDefinitions"]]
        rows = {
            row["cells"][0]: dict(zip(columns, row["cells"], strict=True)) for row in table["rows"]
        }
        writers = {c["case"]: c.get("writer", "pods/status") for c in cases}
        fixture = [
            {
                "case": pod["metadata"]["name"],
                "writer": writers[pod["metadata"]["name"]],
                "pod": pod,
                "kubectl": rows[pod["metadata"]["name"]],
            }
            for pod in pods["items"]
        ]
        for pod in pods["items"]:
            await core.patch_namespaced_pod(
                pod["metadata"]["name"], NAMESPACE, {"metadata": {"finalizers": None}}
            )
            if not pod["metadata"].get("deletionTimestamp"):
                await core.delete_namespaced_pod(
                    pod["metadata"]["name"], NAMESPACE, grace_period_seconds=0
                )
        await core.delete_namespace(NAMESPACE)
    for entry in fixture:
        entry["recordedAt"] = recorded_at
    _save(fixture)


def _save(fixture: list[dict[str, Any]]) -> None:
    """Write ``fixture``, keeping the entries of earlier runs by writers this run did not use
    (KWOK and the real node are not on one plane together)."""
    path = HERE / "printer_pods.json"
    written = {entry["writer"] for entry in fixture}
    kept = []
    if path.exists():
        earlier = json.loads(path.read_text())
        kept = [
            {"recordedAt": earlier["recordedAt"], **entry}
            for entry in earlier["pods"]
            if entry.get("writer") not in written
        ]
    pods = sorted([*kept, *fixture], key=lambda entry: str(entry["case"]))
    recorded_at = max(str(entry["recordedAt"]) for entry in pods)
    document = {"recordedAt": recorded_at, "server": "kube-apiserver", "pods": pods}
    path.write_text(json.dumps(document, indent=1) + "\n")


def main() -> None:
    args = sys.argv[1:]
    kubelet = args[args.index("--kubelet") + 1] if "--kubelet" in args else None
    args = [a for a in args if a not in ("--kubelet", kubelet)]
    if args:
        asyncio.run(record(Path(args[0]), args[1] if len(args) > 1 else None, kubelet))
    else:
        from miles.utils.k8s_testenv.control_plane import LocalControlPlane

        with LocalControlPlane(keep=False) as plane:
            asyncio.run(record(plane.cached_kubeconfig))
    document = json.loads((HERE / "printer_pods.json").read_text())
    for entry in document["pods"]:
        cells = entry["kubectl"]
        status, restarts = cells["Status"], cells["Restarts"]
        print(f"{entry['case']:28} {entry['writer']:12} {cells['Ready']:5} {status:24} {restarts}")


if __name__ == "__main__":
    main()
