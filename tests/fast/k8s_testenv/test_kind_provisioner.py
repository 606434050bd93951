"""The kind provisioner's pin, download and checksum logic (contract, "Real clusters without
Docker": a `kind` on PATH only at the pinned version, else the pinned release, SHA-256 checked).

Runs against a loopback HTTP server serving a fake kind binary, and fake `kind` scripts on a private
PATH; the real release URL is never reached.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import kind

FAKE_BINARY = b"#!/bin/sh\necho 'kind v0.33.0 go1.26.8 linux/amd64'\n"
ASSET = "kind-linux-amd64"


def _release_handler(
    assets: dict[str, bytes], requests: list[str]
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            body = assets.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def release_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback stand-in for kind.sigs.k8s.io/dl: (base URL, paths requested so far)."""
    requests: list[str] = []
    assets = {f"/{kind.KIND_VERSION}/{ASSET}": FAKE_BINARY}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _release_handler(assets, requests))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _fake_kind_on_path(directory: Path, reported_version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "kind"
    script.write_text(f"#!/bin/sh\necho 'kind {reported_version} go1.26.8 linux/amd64'\n")
    script.chmod(0o755)
    return script


def _download_fake(cache_dir: Path, base_url: str) -> Path:
    """The pinned download of the fake binary, its checksum the right one."""
    return kind.download_pinned_kind(
        cache_dir=cache_dir,
        base_url=base_url,
        asset=ASSET,
        expected_sha256=hashlib.sha256(FAKE_BINARY).hexdigest(),
    )


def test_pins_are_exact_versions_and_digests() -> None:
    """The pin is one release, every asset has a 64-hex SHA-256, the node image is by digest."""
    assert re.fullmatch(r"v\d+\.\d+\.\d+", kind.KIND_VERSION)
    assert set(kind.KIND_SHA256) >= {"kind-linux-amd64", "kind-linux-arm64"}
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in kind.KIND_SHA256.values())
    assert re.fullmatch(r"kindest/node:v1\.\d+\.\d+@sha256:[0-9a-f]{64}", kind.NODE_IMAGE)


def test_download_with_the_right_checksum_is_kept_executable(
    tmp_path: Path, release_server: tuple[str, list[str]]
) -> None:
    base_url, requests = release_server
    binary = _download_fake(tmp_path, base_url)
    assert binary.read_bytes() == FAKE_BINARY
    assert binary.stat().st_mode & 0o111
    assert requests == [f"/{kind.KIND_VERSION}/{ASSET}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [binary.name]


def test_verified_download_is_reused_without_a_second_request(
    tmp_path: Path, release_server: tuple[str, list[str]]
) -> None:
    base_url, requests = release_server
    digest = hashlib.sha256(FAKE_BINARY).hexdigest()
    first = kind.download_pinned_kind(
        cache_dir=tmp_path, base_url=base_url, asset=ASSET, expected_sha256=digest
    )
    second = kind.download_pinned_kind(
        cache_dir=tmp_path, base_url=base_url, asset=ASSET, expected_sha256=digest
    )
    assert first == second
    assert len(requests) == 1


def test_wrong_checksum_is_refused_with_a_clear_message_and_nothing_left(
    tmp_path: Path, release_server: tuple[str, list[str]]
) -> None:
    base_url, _ = release_server
    pinned = "0" * 64
    with pytest.raises(kind.KindChecksumError) as refused:
        kind.download_pinned_kind(
            cache_dir=tmp_path, base_url=base_url, asset=ASSET, expected_sha256=pinned
        )
    message = str(refused.value)
    assert hashlib.sha256(FAKE_BINARY).hexdigest() in message
    assert pinned in message
    assert f"{base_url}/{kind.KIND_VERSION}/{ASSET}" in message
    assert "refusing" in message
    assert list(tmp_path.iterdir()) == []


def test_cached_file_with_a_wrong_checksum_is_replaced_by_a_verified_download(
    tmp_path: Path, release_server: tuple[str, list[str]]
) -> None:
    base_url, requests = release_server
    (tmp_path / f"{ASSET}-{kind.KIND_VERSION}").write_bytes(b"tampered")
    binary = _download_fake(tmp_path, base_url)
    assert binary.read_bytes() == FAKE_BINARY
    assert len(requests) == 1


def test_missing_release_fails_naming_the_url(
    tmp_path: Path, release_server: tuple[str, list[str]]
) -> None:
    base_url, _ = release_server
    with pytest.raises(kind.KindProvisionError, match=r"kind-darwin-arm64: HTTP Error 404"):
        kind.download_pinned_kind(cache_dir=tmp_path, base_url=base_url, asset="kind-darwin-arm64")
    assert list(tmp_path.iterdir()) == []


def test_kind_on_path_is_used_only_at_the_pinned_version(tmp_path: Path) -> None:
    pinned = _fake_kind_on_path(tmp_path / "pinned", kind.KIND_VERSION)
    _fake_kind_on_path(tmp_path / "older", "v0.20.0")
    assert kind.find_pinned_kind_on_path(str(tmp_path / "pinned")) == pinned
    assert kind.find_pinned_kind_on_path(str(tmp_path / "older")) is None
    assert kind.find_pinned_kind_on_path(str(tmp_path / "empty")) is None


def test_wrong_kind_on_path_falls_back_to_the_verified_download(
    tmp_path: Path, release_server: tuple[str, list[str]]
) -> None:
    base_url, requests = release_server
    _fake_kind_on_path(tmp_path / "bin", "v0.20.0")
    binary = kind.ensure_pinned_kind(
        cache_dir=tmp_path / "cache",
        base_url=base_url,
        path=str(tmp_path / "bin"),
        asset=ASSET,
        expected_sha256=hashlib.sha256(FAKE_BINARY).hexdigest(),
    )
    assert binary.parent == tmp_path / "cache"
    assert kind.kind_version_of(binary) == kind.KIND_VERSION
    assert len(requests) == 1


def test_asset_names_follow_the_release_layout() -> None:
    assert kind.kind_asset_name("Linux", "x86_64") == "kind-linux-amd64"
    assert kind.kind_asset_name("Darwin", "arm64") == "kind-darwin-arm64"
    with pytest.raises(kind.KindProvisionError, match="no pinned release for windows"):
        kind.kind_asset_name("Windows", "AMD64")


def _recording_kind(directory: Path, *, exit_code: int = 0) -> tuple[Path, Path]:
    calls = directory / "calls"
    script = directory / "kind"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\necho "kind: simulated failure" >&2\nexit {exit_code}\n'
    )
    script.chmod(0o755)
    return script, calls


def test_cluster_starts_from_the_pinned_node_image_and_is_deleted_after(tmp_path: Path) -> None:
    fake, calls = _recording_kind(tmp_path)
    with kind.kind_cluster(kind=fake, name="c1", work_dir=tmp_path) as kubeconfig:
        assert kubeconfig == tmp_path / "kind-kubeconfig"
        created = calls.read_text().splitlines()
        assert created == [
            f"create cluster --name c1 --image {kind.NODE_IMAGE} --kubeconfig {kubeconfig} "
            "--wait 180s"
        ]
    assert calls.read_text().splitlines()[1:] == [
        f"delete cluster --name c1 --kubeconfig {kubeconfig}"
    ]


def test_cluster_that_fails_to_start_says_so_with_kinds_output(tmp_path: Path) -> None:
    fake, _ = _recording_kind(tmp_path, exit_code=1)
    with (
        pytest.raises(kind.KindProvisionError) as failed,
        kind.kind_cluster(kind=fake, name="c2", work_dir=tmp_path),
    ):
        pytest.fail("a cluster that failed to start must not be yielded")
    assert "creating kind cluster c2: exit code 1" in str(failed.value)
    assert "kind: simulated failure" in str(failed.value)
