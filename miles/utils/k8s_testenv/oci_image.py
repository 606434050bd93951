"""Packs static binaries into an OCI image archive that `ctr images import` accepts (Go:
go-containerregistry's `layout` + `tarball`, reduced to one uncompressed layer).

The archive is reproducible: tar entries are sorted with mtime 0 and owner 0, JSON has sorted keys,
so the same binaries give the same digests. `io.containerd.image.name` in `index.json` names the
image exactly as pods refer to it, so they never pull.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_DIRS = {"bin": 0o755, "etc": 0o755, "tmp": 0o1777, "dev": 0o755, "proc": 0o755, "sys": 0o755}
_LAYER = "application/vnd.oci.image.layer.v1.tar"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class ImageSpec:
    """One image: `files` maps a path in the image to a host file; `symlinks` maps a path to its
    target."""

    reference: str
    entrypoint: tuple[str, ...]
    files: Mapping[str, Path]
    symlinks: Mapping[str, str] = field(default_factory=dict)
    env: tuple[str, ...] = ("PATH=/bin",)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, blob: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
        "size": len(blob),
        **extra,
    }


def _info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def layer_tar(spec: ImageSpec) -> bytes:
    dirs = dict(_DIRS)
    for path in [*spec.files, *spec.symlinks]:
        for parent in _parents(path.strip("/")):
            dirs.setdefault(parent, 0o755)
    entries: list[tuple[str, tarfile.TarInfo, bytes | None]] = [
        (name, _info(name, tarfile.DIRTYPE, mode), None) for name, mode in dirs.items()
    ]
    for path, source in spec.files.items():
        data = source.read_bytes()
        name = path.strip("/")
        entries.append((name, _info(name, tarfile.REGTYPE, 0o755, len(data)), data))
    for path, target in spec.symlinks.items():
        name = path.strip("/")
        info = _info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        entries.append((name, info, None))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _, entry, content in sorted(entries, key=lambda entry: entry[0]):
            tar.addfile(entry, io.BytesIO(content) if content is not None else None)
    return out.getvalue()


def _config(spec: ImageSpec, layer_digest: str) -> bytes:
    return _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Entrypoint": list(spec.entrypoint),
                "Env": list(spec.env),
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "miles k8s_testenv"}],
        }
    )


def write_oci_archive(spec: ImageSpec, archive: Path) -> str:
    """Writes the image as an OCI layout tar at `archive`; returns the manifest digest."""
    layer = layer_tar(spec)
    layer_descriptor = _descriptor(_LAYER, layer)
    config = _config(spec, layer_descriptor["digest"])
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": _descriptor(_CONFIG, config),
            "layers": [layer_descriptor],
        }
    )
    tag = spec.reference.rsplit(":", 1)[-1]
    manifest_descriptor = _descriptor(
        _MANIFEST,
        manifest,
        platform={"architecture": "amd64", "os": "linux"},
        annotations={
            "io.containerd.image.name": spec.reference,
            "org.opencontainers.image.ref.name": tag,
        },
    )
    index = _json({"schemaVersion": 2, "mediaType": _INDEX, "manifests": [manifest_descriptor]})
    blobs: Sequence[bytes] = (layer, config, manifest)
    files = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        **{f"blobs/sha256/{hashlib.sha256(b).hexdigest()}": b for b in blobs},
    }
    with tarfile.open(archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("blobs", "blobs/sha256"):
            tar.addfile(_info(name, tarfile.DIRTYPE, 0o755))
        for name, data in sorted(files.items()):
            tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    digest: str = manifest_descriptor["digest"]
    return digest
