"""Fast tests of the real node's pieces that need no root and touch no host state: the OCI packer,
the generated configuration, the one-node-per-machine lock, the binary groups and settings."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import EnvSettings, PrerequisiteError, python_image
from miles.utils.k8s_testenv.binaries import (
    NODE_BINARIES,
    PLANE_BINARIES,
    SPECS,
    TOOL_BINARIES,
    ensure_tool_binary,
    ldflags,
)
from miles.utils.k8s_testenv.certs import generate_serving_pair
from miles.utils.k8s_testenv.host_state import (
    KUBELET_START_SYSCTLS,
    ROUTE_LOCALNET,
    SYSCTLS,
    HostSnapshot,
)
from miles.utils.k8s_testenv.node_config import (
    NodeLayout,
    cni_conflist,
    containerd_toml,
    kubelet_configuration,
    kubernetes_service_nft,
)
from miles.utils.k8s_testenv.node_images import ENGINE_IMAGE, PAUSE_IMAGE
from miles.utils.k8s_testenv.node_lock import NodeLock
from miles.utils.k8s_testenv.oci_image import ImageSpec, write_oci_archive
from miles.utils.k8s_testenv.ports import KUBERNETES_SERVICE_IP, SERVICE_CLUSTER_IP_RANGE
from miles.utils.k8s_testenv.python_image import shared_libraries
from miles.utils.k8s_testenv.real_node import check_prerequisites


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


@pytest.fixture
def engine_spec(tmp_path: Path) -> ImageSpec:
    binary = tmp_path / "engine"
    binary.write_bytes(b"\x7fELF not really")
    return ImageSpec(
        reference=ENGINE_IMAGE,
        entrypoint=("/bin/engine",),
        files={"bin/engine": binary},
        symlinks={"bin/kill": "engine"},
    )


def test_oci_archive_is_reproducible_and_names_the_image(
    engine_spec: ImageSpec, tmp_path: Path
) -> None:
    first = write_oci_archive(engine_spec, tmp_path / "a.tar")
    second = write_oci_archive(engine_spec, tmp_path / "b.tar")
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    members = _members(tmp_path / "a.tar")
    index = json.loads(members["index.json"])
    (manifest_descriptor,) = index["manifests"]
    assert manifest_descriptor["digest"] == first
    assert manifest_descriptor["annotations"]["io.containerd.image.name"] == ENGINE_IMAGE
    for name, blob in members.items():
        if name.startswith("blobs/sha256/"):
            assert name.removeprefix("blobs/sha256/") == hashlib.sha256(blob).hexdigest()
    manifest = json.loads(members[f"blobs/sha256/{first.removeprefix('sha256:')}"])
    config_digest = manifest["config"]["digest"].removeprefix("sha256:")
    config = json.loads(members[f"blobs/sha256/{config_digest}"])
    assert config["config"]["Entrypoint"] == ["/bin/engine"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]


def test_oci_layer_holds_the_binary_executable_and_the_kill_symlink(
    engine_spec: ImageSpec, tmp_path: Path
) -> None:
    write_oci_archive(engine_spec, tmp_path / "a.tar")
    members = _members(tmp_path / "a.tar")
    index = json.loads(members["index.json"])
    manifest = json.loads(
        members["blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:")]
    )
    layer = members["blobs/sha256/" + manifest["layers"][0]["digest"].removeprefix("sha256:")]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    assert entries["bin/engine"].mode == 0o755
    assert entries["bin/kill"].issym()
    assert entries["bin/kill"].linkname == "engine"
    assert entries["tmp"].mode == 0o1777
    assert all(m.mtime == 0 and m.uid == 0 for m in entries.values())
    assert list(entries) == sorted(entries)


def test_containerd_config_keeps_everything_in_the_node_folder(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path / "node")
    config = tomllib.loads(
        containerd_toml(layout, runc="/usr/sbin/runc", cni_bin_dir=Path("/usr/lib/cni"))
    )
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"
    paths = (config["root"], config["state"], config["grpc"]["address"], cri["cni"]["conf_dir"])
    for path in paths:
        assert Path(path).is_relative_to(layout.root)
    assert len(str(layout.containerd_socket)) < 108


def test_kubelet_configuration_avoids_host_rules_and_paths(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path / "node")
    config = kubelet_configuration(layout, port=10250, healthz_port=10248)
    assert config["failCgroupV1"] is False
    assert config["makeIPTablesUtilChains"] is False
    assert config["imageGCHighThresholdPercent"] == 100
    assert Path(config["volumePluginDir"]).is_relative_to(layout.root)
    assert config["address"] == "127.0.0.1"
    cni = cni_conflist(layout)["plugins"][0]
    assert cni["ipMasq"] is False
    assert Path(cni["ipam"]["dataDir"]).is_relative_to(layout.root)


def test_a_second_real_node_is_refused_in_one_line(tmp_path: Path) -> None:
    lock_path = tmp_path / "node.lock"
    first = NodeLock(lock_path)
    first.acquire(tmp_path / "one")
    with pytest.raises(PrerequisiteError) as refused:
        NodeLock(lock_path).acquire(tmp_path / "two")
    message = str(refused.value)
    assert "\n" not in message
    assert "already running on this machine" in message
    assert f"owner pid {os.getpid()}" in message
    first.release()
    second = NodeLock(lock_path)
    second.acquire(tmp_path / "two")
    second.release()


def test_a_node_left_by_a_killed_run_is_refused_naming_down(tmp_path: Path) -> None:
    lock_path = tmp_path / "node.lock"
    killed = NodeLock(lock_path)
    killed.acquire(tmp_path / "killed")
    killed.record_snapshot(
        HostSnapshot(sysctls={}, absent_paths=(), cgroups={}, links=(), nft_tables=())
    )
    assert killed._handle is not None
    killed._handle.close()
    killed._handle = None
    with pytest.raises(PrerequisiteError) as refused:
        NodeLock(lock_path).acquire(tmp_path / "next")
    message = str(refused.value)
    assert "\n" not in message
    assert "left by a killed run" in message
    assert "python -m miles.utils.k8s_testenv down" in message


def test_node_and_tool_binaries_are_built_apart_from_the_control_plane() -> None:
    groups = [set(PLANE_BINARIES), set(NODE_BINARIES), set(TOOL_BINARIES)]
    assert set.union(*groups) == {spec.name for spec in SPECS}
    assert sum(map(len, groups)) == len(SPECS)
    with pytest.raises(ValueError, match="'kubelet' is not one of"):
        ensure_tool_binary("kubelet")
    kubelet = next(spec for spec in SPECS if spec.name == "kubelet")
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.3" in ldflags(kubelet, "v1.36.3")
    pause = next(spec for spec in SPECS if spec.name == "pause")
    assert ldflags(pause, "") == "-s -w"


def test_node_setting_accepts_the_three_backends_and_names_a_bad_one() -> None:
    assert EnvSettings.from_env({}).node == "auto"
    assert EnvSettings.from_env({"MILES_K8S_NODE": "KWOK"}).node == "kwok"
    with pytest.raises(ValueError, match=r"MILES_K8S_NODE='docker': expected one of auto"):
        EnvSettings.from_env({"MILES_K8S_NODE": "docker"})


def test_real_node_without_root_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PrerequisiteError, match=r"needs root .* MILES_K8S_NODE=kwok"):
        check_prerequisites()


def test_the_kubernetes_service_reaches_the_loopback_apiserver_and_the_certificate_names_it(
    tmp_path: Path,
) -> None:
    network = ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)
    assert str(network[1]) == KUBERNETES_SERVICE_IP
    rules = kubernetes_service_nft(apiserver_port=41234)
    assert f"ip daddr {KUBERNETES_SERVICE_IP} tcp dport 443 dnat to 127.0.0.1:41234" in rules
    assert "hook prerouting" in rules
    assert ROUTE_LOCALNET in SYSCTLS
    assert ROUTE_LOCALNET not in KUBELET_START_SYSCTLS
    pair = generate_serving_pair(tmp_path)
    names = subprocess.run(
        ["openssl", "x509", "-in", str(pair.serving_cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in ("IP Address:127.0.0.1", f"IP Address:{KUBERNETES_SERVICE_IP}"):
        assert name in names
    assert "DNS:kubernetes.default.svc" in names


def test_the_python_image_finds_the_interpreters_libraries_and_skips_the_test_suite(
    tmp_path: Path,
) -> None:
    interpreter = Path(os.path.realpath(sys.executable))
    libraries = shared_libraries(interpreter)
    assert any(library.name.startswith("libc.so") for library in libraries)
    assert all(library.is_absolute() for library in libraries)
    stdlib = tmp_path / "lib"
    for name in ("os.py", "test/test_os.py", "encodings/utf_8.py", "site-packages/x.py"):
        (stdlib / name).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / name).write_text("")
    (stdlib / "__pycache__").mkdir()
    (stdlib / "__pycache__" / "os.cpython-311.pyc").write_bytes(b"")
    files = sorted(str(p.relative_to(stdlib)) for p in python_image._stdlib_files(stdlib))
    assert files == ["encodings/utf_8.py", "os.py"]
