"""The real node's two images, packed from binaries built here from `tools/k8s/{pause,engine}`
(Go: none; upstream pulls registry.k8s.io/pause). Pods use them with `imagePullPolicy: Never`.
"""

from __future__ import annotations

from pathlib import Path

from miles.utils.k8s_testenv.binaries import NodeBinaryPaths
from miles.utils.k8s_testenv.oci_image import ImageSpec, write_oci_archive

PAUSE_IMAGE = "localhost/miles-test/pause:1.0"
ENGINE_IMAGE = "localhost/miles-test/engine:1.0"
ENGINE_PORT = 8080


def image_specs(binaries: NodeBinaryPaths) -> list[ImageSpec]:
    return [
        ImageSpec(reference=PAUSE_IMAGE, entrypoint=("/pause",), files={"pause": binaries.pause}),
        ImageSpec(
            reference=ENGINE_IMAGE,
            entrypoint=("/bin/engine",),
            files={"bin/engine": binaries.engine},
            symlinks={"bin/kill": "engine"},
        ),
    ]


def write_image_archives(binaries: NodeBinaryPaths, directory: Path) -> list[Path]:
    """One OCI archive per image in `directory`, ready for `ctr images import`."""
    directory.mkdir(parents=True, exist_ok=True)
    archives = []
    for spec in image_specs(binaries):
        archive = directory / (spec.reference.rsplit("/", 1)[-1].replace(":", "-") + ".tar")
        write_oci_archive(spec, archive)
        archives.append(archive)
    return archives
