"""KWOK playing the kubelet of one fake node, against a running kube-apiserver.

Go counterpart: kwokctl's kwok-controller component (sigs.k8s.io/kwok `pkg/kwokctl/components`),
run out of cluster as `docs/user/kwok-out-cluster.md` describes.

The node is created before kwok starts, annotated so `--manage-nodes-with-annotation-selector`
picks it up; kwok's `node-initialize` stage then reports it Ready. Every transition comes from the
explicit Stage configuration in `kwok_stages.yaml` (kwok v0.8.0 has no built-in stages), and kwok
runs with `HOME` set to its work folder so a `~/.kwok/kwok.yaml` on the machine cannot add more.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miles.utils.k8s_testenv.component import Component
from miles.utils.k8s_testenv.errors import ComponentStartError, PrerequisiteError
from miles.utils.k8s_testenv.process import ManagedProcess, log_tail

if TYPE_CHECKING:
    from miles.utils.k8s_testenv.control_plane import LocalControlPlane

logger = logging.getLogger(__name__)

STAGES_PATH = Path(__file__).with_name("kwok_stages.yaml")
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"
DEFAULT_NODE_NAME = "kwok-node-0"
RESTART_COUNT_ANNOTATION = "kwok.miles.local/restart-count"
"""The restartCount kwok's `pod-container-restart` stage raises every container to, one per step."""
COMPLETE_ANNOTATION = "kwok.miles.local/complete"
"""`"true"` on a Running pod with restartPolicy Never/OnFailure: `pod-complete` ends it."""

_REQUEST_TIMEOUT = 5.0


@dataclass(frozen=True)
class ApiAccess:
    """Just enough of a token kubeconfig to make blocking JSON calls to its apiserver."""

    server: str
    token: str
    tls: ssl.SSLContext

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ApiAccess:
        """Reads the current context of a JSON kubeconfig with a bearer token, as `write_kubeconfig`
        writes it; any other shape is refused by name."""
        try:
            config = json.loads(path.read_text())
            context_name = config["current-context"]
            context = _named(config["contexts"], context_name)["context"]
            cluster = _named(config["clusters"], context["cluster"])["cluster"]
            user = _named(config["users"], context["user"])["user"]
            ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
            return cls(
                server=cluster["server"].rstrip("/"),
                token=user["token"],
                tls=ssl.create_default_context(cadata=ca_pem),
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise PrerequisiteError(
                f"kubeconfig {path} is not JSON with a CA and a bearer token: {error!r}"
            ) from error

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer; raises `urllib.error.HTTPError` for non-2xx, OSError if down."""
        request = urllib.request.Request(
            self.server + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT, context=self.tls) as answer:
            return json.load(answer)


def _named(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(entry for entry in entries if entry["name"] == name)


def fake_node_manifest(name: str, *, selector_value: str = FAKE_NODE_VALUE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: selector_value},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
        },
    }


def node_ready(api: ApiAccess, name: str) -> bool:
    """Whether node `name` reports condition Ready=True; False while it cannot be read."""
    try:
        node = api.request("GET", f"/api/v1/nodes/{name}")
    except OSError:
        return False
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def kwok_argv(
    *, binary: Path, kubeconfig: Path, stages: Path, selector_value: str = FAKE_NODE_VALUE
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={selector_value}",
    ]


class Kwok(Component):
    """kwok managing one fake node, as a context manager: on entry the node exists and is Ready.

    Fails with `PrerequisiteError` when the binary is missing, and with `ComponentStartError`
    (naming the node it waited for, how long, the command line and kwok's log tail) when kwok
    exits or the node is not Ready within `start_timeout` seconds. kwok manages every node
    annotated `kwok.x-k8s.io/node=<selector_value>`, so two instances need two values.
    """

    def __init__(
        self,
        *,
        binary: Path,
        kubeconfig: Path,
        work_dir: Path,
        node_name: str = DEFAULT_NODE_NAME,
        stages: Path = STAGES_PATH,
        selector_value: str = FAKE_NODE_VALUE,
        start_timeout: float = 60.0,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.stages = stages
        self.log_path = work_dir / "kwok.log"
        self._work_dir = work_dir
        self._start_timeout = start_timeout
        self._process: ManagedProcess | None = None
        self._selector_value = selector_value
        self._argv = kwok_argv(
            binary=binary, kubeconfig=kubeconfig, stages=stages, selector_value=selector_value
        )

    def start(self) -> None:
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise PrerequisiteError(
                f"kwok binary not found at {self.binary}: "
                "build it with `python -m miles.utils.k8s_testenv build`"
            )
        self._work_dir.mkdir(parents=True, exist_ok=True)
        api = ApiAccess.from_kubeconfig(self.kubeconfig)
        self._create_node(api)
        self._process = ManagedProcess(
            name=f"kwok (waiting for fake node {self.node_name} to report Ready)",
            argv=self._argv,
            log_path=self.log_path,
            ready=lambda: node_ready(api, self.node_name),
            start_timeout=self._start_timeout,
            env={**os.environ, "HOME": str(self._work_dir)},
        )
        self._process.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def failure(self) -> str | None:
        """Why kwok is not running any more (with its log tail), or None while it runs."""
        if self._process is None or self._process.running:
            return None
        return f"kwok is not running\n  log (tail):\n{log_tail(self.log_path)}"

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def _create_node(self, api: ApiAccess) -> None:
        try:
            manifest = fake_node_manifest(self.node_name, selector_value=self._selector_value)
            api.request("POST", "/api/v1/nodes", manifest)
        except urllib.error.HTTPError as error:
            if error.code != 409:
                raise self._start_error(f"creating node {self.node_name}: {error}") from error
        except OSError as error:
            raise self._start_error(
                f"creating node {self.node_name} at {api.server}: {error}"
            ) from error

    def _start_error(self, reason: str) -> ComponentStartError:
        return ComponentStartError(
            component="kwok", reason=reason, argv=self._argv, log_tail="    (kwok not started)"
        )


class KwokAddon:
    """`ControlPlaneAddon` running `Kwok` against the cached apiserver of a `LocalControlPlane`:
    `LocalControlPlane(addons=[KwokAddon()])` starts it after the apiservers, stops it first."""

    def __init__(self, *, node_name: str = DEFAULT_NODE_NAME, start_timeout: float = 60.0) -> None:
        self.node_name = node_name
        self._start_timeout = start_timeout
        self.kwok: Kwok | None = None

    def start(self, plane: LocalControlPlane) -> None:
        self.kwok = Kwok(
            binary=plane.binaries.kwok,
            kubeconfig=plane.cached_kubeconfig,
            work_dir=plane.work_dir / "kwok",
            node_name=self.node_name,
            start_timeout=self._start_timeout,
        )
        self.kwok.start()

    def stop(self) -> None:
        if self.kwok is not None:
            self.kwok.stop()
            self.kwok = None
