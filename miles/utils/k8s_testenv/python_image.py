"""An OCI image of this package, its runtime dependencies and the interpreter running this code, for
a controller pod on the real node (Go: none; ko and distroless build such images from a base).

No Docker and no registry: the rootfs is the host's interpreter relocated to ``/usr/local`` (its
binary, ``libpython``, the standard library without its tests and GUI modules), every shared
library ``ldd`` names for it and for each extension module (placed at the path ``ldd`` reports,
``LD_LIBRARY_PATH`` lists their folders), and a site-packages that pip installs from this
package's wheel with the dependency versions of the running environment as constraints. Every
``.py`` is compiled with ``unchecked-hash`` pycs (the layer's mtimes are 0, so timestamp pycs
would all be stale). ``oci_image`` packs it as the node's test images are packed; ``ctr images
import`` takes the archive.

    python -m miles.utils.k8s_testenv.python_image --out DIR [--import-to PLANE_FOLDER]

prints the archive's path, the image's reference and digest, its size and the build's seconds;
``--import-to`` imports it into the real node of that plane (``env up``'s folder).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from miles.utils.k8s_testenv.errors import PrerequisiteError
from miles.utils.k8s_testenv.node_config import NodeLayout
from miles.utils.k8s_testenv.oci_image import ImageSpec, write_oci_archive
from miles.utils.k8s_testenv.real_node import import_image

CONTROLLER_IMAGE = "localhost/miles-reconcile/controller:0.1.0"
PREFIX = "/usr/local"
EXTRAS = "k8s,metrics"
_SKIPPED_STDLIB = frozenset(
    {
        "site-packages",
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "__pycache__",
        "pydoc_data",
    }
)
_LDD_LINE = re.compile(r"(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)")
_EXTRA_LIBRARIES = ("libgcc_s.so.1",)
"""dlopened by glibc, so ldd never names it: thread cancellation needs it."""


def _repository() -> Path:
    return Path(__file__).resolve().parents[3]


def _version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _run(argv: list[str], what: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{what} failed: " + " | ".join(tail))
    return result.stdout


def shared_libraries(elf: Path) -> list[Path]:
    """The libraries the dynamic loader maps for ``elf`` (``ldd``), the loader included."""
    listed = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, check=False)
    return [Path(m.group(1)) for m in map(_LDD_LINE.search, listed.stdout.splitlines()) if m]


def _stdlib_files(stdlib: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(
            d for d in dirs if d not in _SKIPPED_STDLIB and not d.startswith("config-")
        )
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo", ".exe")):
                yield Path(root) / name


def _constraints(path: Path) -> Path:
    pins = sorted(
        f"{dist.metadata['Name']}=={dist.version}"
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"] and dist.metadata["Name"].lower() != "miles-reconcile"
    )
    path.write_text("\n".join(pins) + "\n")
    return path


def build_site_packages(work: Path) -> Path:
    """This package's wheel and its ``k8s`` and ``metrics`` extras, installed by pip into
    ``work/site-packages`` at the running environment's versions."""
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(_repository())], "pip wheel")
    (wheel,) = wheels.glob("miles_reconcile-*.whl")
    site = work / "site-packages"
    _run(
        [
            *pip,
            "install",
            "--no-compile",
            "--target",
            str(site),
            "--constraint",
            str(_constraints(work / "constraints.txt")),
            f"{wheel}[{EXTRAS}]",
        ],
        "pip install",
    )
    shutil.rmtree(site / "bin", ignore_errors=True)
    for direct_url in site.glob("*.dist-info/direct_url.json"):
        # pip records the wheel's temporary path: the one byte that differs between two builds.
        direct_url.unlink()
        record = direct_url.parent / "RECORD"
        kept = [line for line in record.read_text().splitlines() if "direct_url.json" not in line]
        record.write_text("\n".join(kept) + "\n")
    return site


def _compile(tree: Path, image_path: str) -> None:
    """Byte-compiles ``tree`` as if it lay at ``image_path`` (the paths tracebacks show)."""
    argv = [sys.executable, "-m", "compileall", "-q", "-j0", "--invalidation-mode"]
    argv += ["unchecked-hash", "-s", str(tree), "-p", image_path, str(tree)]
    _run(argv, f"compileall {tree}")


def _elves(paths: Iterable[Path]) -> list[Path]:
    return [p for p in paths if p.suffix == ".so" or ".so." in p.name]


def image_spec(work: Path) -> ImageSpec:
    """Stages the rootfs under ``work`` and names every file of it."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    version = _version()
    staged_stdlib = work / "stdlib"
    files: dict[str, Path] = {}
    for source in _stdlib_files(stdlib):
        target = staged_stdlib / source.relative_to(stdlib)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    site = build_site_packages(work)
    lib = f"{PREFIX}/lib/python{version}"
    for tree, root in ((staged_stdlib, lib), (site, f"{lib}/site-packages")):
        _compile(tree, root)
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                files[f"{root}/{path.relative_to(tree)}"] = path
    interpreter = Path(os.path.realpath(sys.executable))
    files[f"{PREFIX}/bin/python{version}"] = interpreter
    libraries: dict[str, Path] = {}
    for elf in [interpreter, *_elves(files.values())]:
        for library in shared_libraries(elf):
            if library.name.startswith("libpython"):
                libraries[f"{PREFIX}/lib/{library.name}"] = library.resolve()
            else:
                libraries.setdefault(str(library), library.resolve())
    folders = sorted({str(Path(path).parent) for path in libraries})
    for name in _EXTRA_LIBRARIES:
        found = next((Path(d) / name for d in folders if (Path(d) / name).exists()), None)
        if found is not None:
            libraries[str(found)] = found.resolve()
    files.update(libraries)
    return ImageSpec(
        reference=CONTROLLER_IMAGE,
        entrypoint=(f"{PREFIX}/bin/python{version}",),
        files=files,
        symlinks={
            f"{PREFIX}/bin/python3": f"python{version}",
            f"{PREFIX}/bin/python": f"python{version}",
        },
        env=(
            f"PATH={PREFIX}/bin:/usr/bin:/bin",
            f"LD_LIBRARY_PATH={':'.join(folders)}",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
            "LANG=C.UTF-8",
            "HOME=/",
        ),
    )


def source_key() -> str:
    """What the image is built from, hashed: the interpreter, the pinned dependency versions and
    every file of this package's source tree (two builds from equal keys are equal images)."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version}\0{os.path.realpath(sys.executable)}\0".encode())
    with tempfile.TemporaryDirectory(prefix="miles-image-key-") as work:
        digest.update(_constraints(Path(work) / "constraints.txt").read_bytes())
    root = _repository()
    sources = [root / "pyproject.toml", *sorted((root / "miles").rglob("*"))]
    for path in sources:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(root)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cached_controller_image(folder: Path) -> Path:
    """The image's OCI archive in ``folder``, built only when no archive of the same
    ``source_key`` is there (the node tests of one run share one build)."""
    archive = folder / f"controller-{source_key()[:16]}.tar"
    if not archive.exists():
        partial = archive.with_suffix(f".partial-{os.getpid()}")
        build_controller_image(partial)
        partial.replace(archive)
    return archive


def build_controller_image(archive: Path) -> str:
    """Writes the image's OCI archive to ``archive``; returns its manifest digest."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="miles-image-") as work:
        return write_oci_archive(image_spec(Path(work)), archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python_image", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the archive")
    parser.add_argument(
        "--import-to",
        type=Path,
        metavar="PLANE_FOLDER",
        help="also `ctr images import` it into the real node of this plane (`env up` prints it)",
    )
    args = parser.parse_args(argv)
    archive = args.out / (CONTROLLER_IMAGE.rsplit("/", 1)[-1].replace(":", "-") + ".tar")
    started = time.monotonic()
    try:
        digest = build_controller_image(archive)
    except (RuntimeError, OSError) as exc:
        print(f"python_image: {exc}", file=sys.stderr)
        return 1
    size = archive.stat().st_size / 2**20
    print(
        f"{archive} {CONTROLLER_IMAGE} {digest} {size:.0f} MiB {time.monotonic() - started:.0f} s"
    )
    if args.import_to is not None:
        return import_into_node(archive, args.import_to)
    return 0


def import_into_node(archive: Path, plane_folder: Path) -> int:
    """``ctr images import`` into the containerd of the real node in ``plane_folder``."""
    layout = NodeLayout(plane_folder / "node")
    socket = layout.containerd_socket
    if not socket.exists():
        print(f"python_image: no real node's containerd at {socket}", file=sys.stderr)
        return 1
    try:
        import_image(layout, archive)
    except (PrerequisiteError, subprocess.TimeoutExpired) as exc:
        print(f"python_image: {exc}", file=sys.stderr)
        return 1
    print(f"imported {CONTROLLER_IMAGE} into {socket}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
