"""The pinned kind provisioner, for machines with a Docker daemon.

Go counterpart: none in-process; it is the release-checksum recipe of kubernetes-sigs/kind
(`hack/release/build/cross.sh` writes `<asset>.sha256sum`) followed by `kind create cluster`.

A `kind` found on PATH is used only when it reports exactly `KIND_VERSION`; otherwise the pinned
release asset is downloaded into a cache folder and kept only if its SHA-256 equals the pin.
Clusters always start from `NODE_IMAGE`, a node image named by digest as kind's release notes
require ("You *must* use the @sha256 digest to guarantee an image built for this release").
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from miles.utils.k8s_testenv.errors import PrerequisiteError

logger = logging.getLogger(__name__)

KIND_VERSION = "v0.33.0"

# SHA-256 of the v0.33.0 release assets. Not read from the release page itself (this machine reaches
# no GitHub): taken from repositories that pin the same release independently of each other,
# read on 2026-11-30: kubernetes-sigs/cluster-api `hack/ensure-kind.sh` (all four), and two
# unrelated install scripts agreeing on linux-amd64. Re-check against
# https://github.com/kubernetes-sigs/kind/releases/download/v0.33.0/<asset>.sha256sum when bumping.
KIND_SHA256: Mapping[str, str] = {
    "kind-linux-amd64": "aee6151561422756b764a4ae28e7f44cda5af5a9eead3cc9985112b1de8d8e0d",
    "kind-linux-arm64": "20022bee6cfcd5086cb7234d218e3454e6090022f2a8f55d1fa7fcf42c3867a2",
    "kind-darwin-amd64": "5a99f26f57246dc9319dd294803313197a0f34d33c525b3ea8b655db5916ece0",
    "kind-darwin-arm64": "0c8c7dbe5e23594a198b786c4bc13dacc101fa6196b0cb0b23a1ca44e61f4b4f",
}

# The 1.36 image built for kind v0.33.0 (its release notes' "Images pre-built for this release",
# quoted in polarsquad/krops#112 and pinned by several unrelated repositories). The project pins
# Kubernetes 1.36 for its own binaries; kind publishes v1.36.4 for this release.
NODE_IMAGE = (
    "kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed"
)

KIND_DOWNLOAD_BASE_URL = "https://kind.sigs.k8s.io/dl"

_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_VERSION_PATTERN = re.compile(r"v?(\d+\.\d+\.\d+)")
_CHUNK = 1 << 20


class KindProvisionError(PrerequisiteError):
    """kind could not be provided at the pinned version."""


class KindChecksumError(KindProvisionError):
    """A downloaded kind binary does not match its pinned SHA-256."""


def kind_asset_name(system: str | None = None, machine: str | None = None) -> str:
    system = (system or platform.system()).lower()
    machine = (machine or platform.machine()).lower()
    arch = _ARCHITECTURES.get(machine)
    if system not in ("linux", "darwin") or arch is None:
        raise KindProvisionError(
            f"kind {KIND_VERSION} has no pinned release for {system}/{machine}"
        )
    return f"kind-{system}-{arch}"


def kind_version_of(binary: Path) -> str | None:
    """The version `binary version` reports, as `vX.Y.Z`, or None if it cannot tell."""
    try:
        result = subprocess.run(
            [str(binary), "version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.info("kind at %s did not report a version: %s", binary, error)
        return None
    match = _VERSION_PATTERN.search(result.stdout)
    return f"v{match.group(1)}" if result.returncode == 0 and match else None


def find_pinned_kind_on_path(path: str | None = None) -> Path | None:
    """The `kind` on PATH if it is exactly `KIND_VERSION`, else None (and one log line why)."""
    found = shutil.which("kind", path=path)
    if found is None:
        return None
    version = kind_version_of(Path(found))
    if version != KIND_VERSION:
        logger.info("ignoring kind at %s: version %s, pinned %s", found, version, KIND_VERSION)
        return None
    return Path(found)


def download_pinned_kind(
    *,
    cache_dir: Path,
    base_url: str = KIND_DOWNLOAD_BASE_URL,
    asset: str | None = None,
    expected_sha256: str | None = None,
    timeout_seconds: float = 120.0,
) -> Path:
    """The pinned kind release in `cache_dir`, downloaded and verified if not already there.

    A download whose SHA-256 differs from the pin is deleted before `KindChecksumError` is raised,
    so nothing unverified is ever left where a later run could pick it up.
    """
    asset = asset or kind_asset_name()
    expected = expected_sha256 or KIND_SHA256.get(asset)
    if expected is None:
        raise KindProvisionError(f"no pinned SHA-256 for {asset} of kind {KIND_VERSION}")
    target = cache_dir / f"{asset}-{KIND_VERSION}"
    if target.is_file() and _sha256_of(target) == expected:
        return target
    url = f"{base_url.rstrip('/')}/{KIND_VERSION}/{asset}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _scratch_file(cache_dir) as scratch:
        actual = _download(url, scratch, timeout_seconds)
        if actual != expected:
            raise KindChecksumError(
                f"kind {KIND_VERSION} downloaded from {url} has SHA-256 {actual}, "
                f"but the pin is {expected}: refusing it, nothing was kept"
            )
        scratch.chmod(0o755)
        os.replace(scratch, target)
    return target


def ensure_pinned_kind(
    *,
    cache_dir: Path,
    base_url: str = KIND_DOWNLOAD_BASE_URL,
    path: str | None = None,
    asset: str | None = None,
    expected_sha256: str | None = None,
) -> Path:
    """The pinned kind: from PATH when it reports `KIND_VERSION`, else the verified download."""
    return find_pinned_kind_on_path(path) or download_pinned_kind(
        cache_dir=cache_dir, base_url=base_url, asset=asset, expected_sha256=expected_sha256
    )


def docker_daemon_available() -> bool:
    """Whether `docker info` answers: kind needs a running daemon, not only the CLI."""
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(
            ["docker", "info"], capture_output=True, text=True, timeout=15, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


@contextlib.contextmanager
def kind_cluster(
    *,
    kind: Path,
    name: str,
    work_dir: Path,
    node_image: str = NODE_IMAGE,
    keep: bool = False,
    wait_seconds: int = 180,
) -> Iterator[Path]:
    """A kind cluster from `node_image`: yields its kubeconfig, deletes it unless `keep`."""
    kubeconfig = work_dir / "kind-kubeconfig"
    create = [str(kind), "create", "cluster", "--name", name, "--image", node_image]
    create += ["--kubeconfig", str(kubeconfig), "--wait", f"{wait_seconds}s"]
    _run_kind(create, timeout_seconds=wait_seconds + 300, what=f"creating kind cluster {name}")
    try:
        yield kubeconfig
    finally:
        if keep:
            logger.info("MILES_K8S_KEEP: leaving kind cluster %s up (%s)", name, kubeconfig)
        else:
            delete = [str(kind), "delete", "cluster", "--name", name]
            _run_kind(
                [*delete, "--kubeconfig", str(kubeconfig)],
                timeout_seconds=180,
                what=f"deleting kind cluster {name}",
            )


def _run_kind(command: list[str], *, timeout_seconds: float, what: str) -> None:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_seconds, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise KindProvisionError(f"{what}: no result after {timeout_seconds:.0f} s") from error
    if result.returncode != 0:
        raise KindProvisionError(
            f"{what}: exit code {result.returncode}: {result.stderr.strip()[-2000:]}"
        )


@contextlib.contextmanager
def _scratch_file(directory: Path) -> Iterator[Path]:
    handle, name = tempfile.mkstemp(prefix=".kind-download-", dir=directory)
    os.close(handle)
    scratch = Path(name)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def _download(url: str, destination: Path, timeout_seconds: float) -> str:
    digest = hashlib.sha256()
    try:
        with (
            urllib.request.urlopen(url, timeout=timeout_seconds) as response,
            destination.open("wb") as out,
        ):
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except OSError as error:
        raise KindProvisionError(f"downloading kind {KIND_VERSION} from {url}: {error}") from error
    return digest.hexdigest()


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
