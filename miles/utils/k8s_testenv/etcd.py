"""A single-member etcd on loopback ports (Go: envtest's `controlplane.Etcd`)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from miles.utils.k8s_testenv.http import get_status, post_json
from miles.utils.k8s_testenv.ports import LOOPBACK
from miles.utils.k8s_testenv.process import ManagedProcess


class Etcd:
    """etcd with fsync off and auto-compaction off, so tests decide when history is compacted."""

    def __init__(
        self, *, binary: Path, data_dir: Path, log_path: Path, client_port: int, peer_port: int
    ) -> None:
        self.client_url = f"http://{LOOPBACK}:{client_port}"
        self.data_dir = data_dir
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        argv = [
            str(binary),
            "--name=default",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=0",
        ]
        self.process = ManagedProcess(name="etcd", argv=argv, log_path=log_path, ready=self._ready)

    def _ready(self) -> bool:
        return get_status(f"{self.client_url}/health") == 200

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def snapshot(self, target: Path) -> Path:
        """Copies the data folder into `target` while etcd is stopped, then starts it again: an
        offline backup, as `etcdutl backup` takes one."""
        self.stop()
        try:
            shutil.copytree(self.data_dir, target)
        finally:
            self.start()
        return target

    def restore(self, snapshot: Path) -> None:
        """Stops etcd, puts the data folder of `snapshot` back in place and starts it again: the
        store and its revision go back to when the snapshot was taken."""
        self.stop()
        try:
            shutil.rmtree(self.data_dir)
            shutil.copytree(snapshot, self.data_dir)
        finally:
            self.start()

    def revision(self) -> int:
        """The store's current revision (`header.revision` of a count-only range)."""
        body = {"key": base64.b64encode(b"/").decode(), "count_only": True}
        response = post_json(f"{self.client_url}/v3/kv/range", body)
        return int(response["header"]["revision"])

    def compact(self, revision: int) -> None:
        post_json(
            f"{self.client_url}/v3/kv/compaction",
            {"revision": str(revision), "physical": True},
        )

    def compact_to_head(self) -> int:
        """Compacts every revision before the current one away; returns that revision."""
        head = self.revision()
        try:
            self.compact(head)
        except OSError as err:
            if "required revision has been compacted" not in _error_body(err):
                raise
        return head


def _error_body(err: OSError) -> str:
    read = getattr(err, "read", None)
    if read is None:
        return str(err)
    try:
        return json.dumps(json.loads(read()))
    except ValueError:
        return str(err)
