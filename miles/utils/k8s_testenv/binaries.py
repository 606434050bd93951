"""Builds the pinned Go binaries into a cache folder (Go: envtest's setup-envtest asset store).

Each binary has its own wrapper module under `tools/k8s/<module>/` whose go.mod and go.sum pin it;
the package reads them from `pins/` beside this file (a link to `tools/k8s` in a checkout, package
data in a wheel). A binary is rebuilt only when its stamp (a hash of the module's files, the build
flags and the Go version) differs from the one recorded beside it. The folder is `bin_dir()`:
`MILES_K8S_BIN_DIR`, else the checkout's `.cache/k8s-bin`, else the user's cache folder. The real
node's kubelet, kube-scheduler and kube-controller-manager share one module, `node`; the control
plane's binaries are built on demand, the real node's (`NODE_BINARIES`) only when a real node is
wanted, a tool's (`TOOL_BINARIES`: client-go's leader election) when its run asks for it, or by
`build`, which builds everything.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from miles.utils.k8s_testenv.errors import BuildError, PrerequisiteError
from miles.utils.k8s_testenv.settings import BIN_DIR_ENV, EnvSettings
from miles.utils.k8s_testenv.user_dirs import user_cache_dir

LogFn = Callable[[str], None]

_LOG_TAIL_LINES = 40
PINS_FOLDER = "pins"
_BUILD_FLAGS = ("-trimpath", "-buildvcs=false")


@dataclass(frozen=True)
class BinarySpec:
    """One binary: its wrapper module folder, the package to build, and the module that pins it
    (None for a standard-library-only module of this repository, such as the test images')."""

    name: str
    module_dir: str
    package: str
    pinned_module: str | None
    version_ldflags: tuple[str, ...] = ()


_KUBE_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")

SPECS: tuple[BinarySpec, ...] = (
    BinarySpec(
        name="etcd",
        module_dir="etcd",
        package="go.etcd.io/etcd/server/v3",
        pinned_module="go.etcd.io/etcd/server/v3",
    ),
    BinarySpec(
        name="kube-apiserver",
        module_dir="apiserver",
        package="k8s.io/kubernetes/cmd/kube-apiserver",
        pinned_module="k8s.io/kubernetes",
        version_ldflags=_KUBE_VERSION_PACKAGES,
    ),
    BinarySpec(
        name="kwok",
        module_dir="kwok",
        package="sigs.k8s.io/kwok/cmd/kwok",
        pinned_module="sigs.k8s.io/kwok",
    ),
    BinarySpec(
        name="oracle",
        module_dir="oracle",
        package=".",
        pinned_module="k8s.io/client-go",
    ),
    BinarySpec(
        name="leader-candidate",
        module_dir="leader-candidate",
        package=".",
        pinned_module="k8s.io/client-go",
    ),
    BinarySpec(
        name="write-bench",
        module_dir="write-bench",
        package=".",
        pinned_module="k8s.io/client-go",
    ),
    *(
        BinarySpec(
            name=name,
            module_dir="node",
            package=f"k8s.io/kubernetes/cmd/{name}",
            pinned_module="k8s.io/kubernetes",
            version_ldflags=_KUBE_VERSION_PACKAGES,
        )
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager")
    ),
    BinarySpec(name="pause", module_dir="pause", package=".", pinned_module=None),
    BinarySpec(name="engine", module_dir="engine", package=".", pinned_module=None),
)

PLANE_BINARIES = ("etcd", "kube-apiserver", "kwok", "oracle")
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-controller-manager", "pause", "engine")
TOOL_BINARIES = ("leader-candidate", "write-bench")


@dataclass(frozen=True)
class BinaryPaths:
    etcd: Path
    kube_apiserver: Path
    kwok: Path
    oracle: Path


@dataclass(frozen=True)
class NodeBinaryPaths:
    """The real node's binaries; `pause` and `engine` are packed into the test images."""

    kubelet: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    pause: Path
    engine: Path


def print_stderr(line: str) -> None:
    """The test environment's and the benchmarks' default ``LogFn``: a line on stderr, flushed."""
    print(line, file=sys.stderr, flush=True)


def checkout_root() -> Path | None:
    """The source checkout this package is imported from (an editable install), if it is one."""
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file() and (root / "tools" / "k8s").is_dir():
        return root
    return None


def tools_dir() -> Path:
    """The pinned Go modules: `pins/` beside this file, which is `tools/k8s` in a checkout (a
    symbolic link) and its copy, carried as package data, in an installed wheel."""
    pins = Path(__file__).with_name(PINS_FOLDER)
    if not pins.is_dir():
        raise PrerequisiteError(
            f"the pinned Go modules are missing from the installed package (no {pins}); "
            "reinstall miles-reconcile"
        )
    return pins


def bin_dir(settings: EnvSettings | None = None) -> Path:
    """`MILES_K8S_BIN_DIR` if set; else `.cache/k8s-bin` of the checkout this package is imported
    from; else the user's cache folder (`$XDG_CACHE_HOME/miles-reconcile/k8s-bin`)."""
    settings = settings or EnvSettings.from_env()
    if settings.bin_dir is not None:
        return settings.bin_dir
    checkout = checkout_root()
    if checkout is not None:
        return checkout / ".cache" / "k8s-bin"
    return user_cache_dir() / "k8s-bin"


def pinned_version(go_mod: str, module: str) -> str:
    """The version `go.mod` requires of `module`."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise PrerequisiteError(f"go.mod does not require {module}")
    return match.group(1)


def ldflags(spec: BinarySpec, version: str) -> str:
    flags = ["-s", "-w"]
    if not spec.version_ldflags:
        return " ".join(flags)
    major, minor = version.removeprefix("v").split(".")[:2]
    for package in spec.version_ldflags:
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def go_executable() -> str:
    go = shutil.which("go")
    if go is None:
        raise PrerequisiteError(
            "Go toolchain not found on PATH: it builds etcd, kube-apiserver, kwok and the oracle "
            "from tools/k8s (install Go >= 1.26 or set MILES_K8S_KUBECONFIG to reuse a cluster)"
        )
    return go


def _go_version(go: str) -> str:
    return subprocess.run(
        [go, "env", "GOVERSION"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _module_files(module: Path) -> list[Path]:
    return sorted(
        p for p in module.iterdir() if p.suffix == ".go" or p.name in {"go.mod", "go.sum"}
    )


def build_stamp(spec: BinarySpec, module: Path, flags: str, go_version: str) -> str:
    digest = hashlib.sha256()
    for part in (spec.package, *_BUILD_FLAGS, flags, go_version):
        digest.update(part.encode() + b"\0")
    for path in _module_files(module):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _build_one(spec: BinarySpec, *, go: str, go_version: str, out_dir: Path, log: LogFn) -> Path:
    module = tools_dir() / spec.module_dir
    version = (
        pinned_version((module / "go.mod").read_text(), spec.pinned_module)
        if spec.pinned_module is not None
        else ""
    )
    flags = ldflags(spec, version)
    stamp = build_stamp(spec, module, flags, go_version)
    target = out_dir / spec.name
    stamp_file = out_dir / f"{spec.name}.stamp"
    if target.is_file() and stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        return target
    partial = out_dir / f".{spec.name}.{os.getpid()}.partial"
    argv = [go, "build", *_BUILD_FLAGS, "-ldflags", flags, "-o", str(partial), spec.package]
    source = f"{spec.pinned_module} {version}" if spec.pinned_module else "stdlib only"
    log(f"k8s_testenv: building {spec.name} ({source}) ...")
    started = time.monotonic()
    env = {**os.environ, "CGO_ENABLED": "0"}
    result = subprocess.run(
        argv, cwd=module, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join(result.stdout.splitlines()[-_LOG_TAIL_LINES:])
        raise BuildError(binary=spec.name, argv=argv, log_tail=tail)
    partial.replace(target)
    stamp_file.write_text(stamp + "\n")
    size_mb = target.stat().st_size / 1e6
    log(f"k8s_testenv: built {spec.name} in {time.monotonic() - started:.1f}s ({size_mb:.1f} MB)")
    return target


@contextlib.contextmanager
def _build_lock(out_dir: Path, log: LogFn) -> Iterator[None]:
    """One builder per cache folder at a time; the others wait, then find the binaries built."""
    with (out_dir / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"k8s_testenv: waiting for another build in {out_dir} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_blocker(out_dir: Path) -> tuple[str, str] | None:
    """Why nothing can be built into `out_dir`, and what to do, or None when a build can run."""
    if shutil.which("go") is None:
        return (
            "the Go toolchain is not on PATH",
            f"install Go >= 1.26 to build them from the pins, or point {BIN_DIR_ENV} at a "
            "folder of built binaries",
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{out_dir} cannot be created ({exc.strerror or exc})", _WRITABLE_REMEDY
    if not os.access(out_dir, os.W_OK | os.X_OK):
        return f"{out_dir} is not writable", _WRITABLE_REMEDY
    return None


_WRITABLE_REMEDY = f"set {BIN_DIR_ENV} to a writable folder, or to one of built binaries"


def _require_prebuilt(out_dir: Path, wanted: Iterable[str], blocker: tuple[str, str]) -> None:
    """Where nothing can be built, the binaries present are used as they are (unchecked)."""
    missing = sorted(name for name in wanted if not (out_dir / name).is_file())
    if missing:
        reason, remedy = blocker
        raise PrerequisiteError(
            f"{', '.join(missing)} not built in {out_dir} and {reason}: {remedy}"
        )


def ensure_binaries(
    *,
    names: Iterable[str] | None = None,
    settings: EnvSettings | None = None,
    log: LogFn = print_stderr,
) -> BinaryPaths:
    """Builds every control-plane binary that is missing or stale; returns the paths of all four.

    `names` limits the build to those binaries (the others' paths are returned as they are); it
    may also name real-node binaries, as `build` does to build everything. Without Go, or with a
    folder that cannot be written, the binaries already in the folder are used as they are, so a
    folder built elsewhere (`MILES_K8S_BIN_DIR`) needs no toolchain.
    """
    paths = _ensure(PLANE_BINARIES if names is None else names, settings, log)
    return BinaryPaths(
        etcd=paths["etcd"],
        kube_apiserver=paths["kube-apiserver"],
        kwok=paths["kwok"],
        oracle=paths["oracle"],
    )


def ensure_node_binaries(
    *, settings: EnvSettings | None = None, log: LogFn = print_stderr
) -> NodeBinaryPaths:
    """Builds the real node's binaries that are missing or stale (kubelet alone takes ~10 min
    on two cores from a cold Go build cache); returns their paths."""
    paths = _ensure(NODE_BINARIES, settings, log)
    return NodeBinaryPaths(
        kubelet=paths["kubelet"],
        kube_scheduler=paths["kube-scheduler"],
        kube_controller_manager=paths["kube-controller-manager"],
        pause=paths["pause"],
        engine=paths["engine"],
    )


def ensure_tool_binary(
    name: str, *, settings: EnvSettings | None = None, log: LogFn = print_stderr
) -> Path:
    """Builds one of `TOOL_BINARIES` if it is missing or stale; returns its path."""
    if name not in TOOL_BINARIES:
        raise ValueError(f"{name!r} is not one of {TOOL_BINARIES}")
    return _ensure((name,), settings, log)[name]


def _ensure(names: Iterable[str], settings: EnvSettings | None, log: LogFn) -> dict[str, Path]:
    wanted = set(names)
    unknown = wanted - {spec.name for spec in SPECS}
    if unknown:
        raise ValueError(f"unknown binaries: {sorted(unknown)}")
    out_dir = bin_dir(settings)
    paths = {spec.name: out_dir / spec.name for spec in SPECS}
    blocker = build_blocker(out_dir)
    if blocker is not None:
        _require_prebuilt(out_dir, wanted, blocker)
    else:
        go = go_executable()
        go_version = _go_version(go)
        with _build_lock(out_dir, log):
            for spec in SPECS:
                if spec.name in wanted:
                    paths[spec.name] = _build_one(
                        spec, go=go, go_version=go_version, out_dir=out_dir, log=log
                    )
    return paths
