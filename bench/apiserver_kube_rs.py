"""The kube-rs contender of ``bench/apiserver.py``: ``tools/kube-rs-oracle``, built on first use.

Rust counterpart: ``kube::runtime::watcher`` and ``reflector::store`` themselves (see the crate's
``src/main.rs``). The crate pins every dependency in its committed ``Cargo.lock``; it is built with
``cargo build --release --locked`` into ``.cache/kube-rs-oracle`` and rebuilt only when its sources,
lock file or the toolchain change. A contender that cannot be built is skipped: ``ensure_kube_rs``
raises ``ContenderUnavailable`` with one line saying why, and the bench goes on without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench.apiserver_proc import REPO_ROOT

CRATE_DIR = REPO_ROOT / "tools" / "kube-rs-oracle"
BINARY_NAME = "kube-rs-oracle"
CARGO_ENV = "MILES_BENCH_CARGO"
BUILD_TIMEOUT = 1800.0


class ContenderUnavailable(Exception):
    """A contender that cannot run here; the message is the one line the bench prints."""


def cache_dir() -> Path:
    return REPO_ROOT / ".cache" / "kube-rs-oracle"


def find_cargo() -> str:
    configured = os.environ.get(CARGO_ENV)
    if configured is not None:
        if shutil.which(configured) is None:
            raise ContenderUnavailable(f"{CARGO_ENV}={configured} is not an executable")
        return configured
    found = shutil.which("cargo") or shutil.which(Path.home() / ".cargo" / "bin" / "cargo")
    if found is None:
        raise ContenderUnavailable("no cargo on PATH (install Rust >= 1.89 to build it)")
    return found


def source_stamp(crate: Path, toolchain: str) -> str:
    digest = hashlib.sha256(toolchain.encode())
    for path in sorted([crate / "Cargo.toml", crate / "Cargo.lock", *crate.glob("src/**/*.rs")]):
        digest.update(path.relative_to(crate).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def ensure_kube_rs(
    progress: Callable[[str], None], *, crate: Path = CRATE_DIR, cache: Path | None = None
) -> Path:
    """The binary, built first if its stamp is stale; ``ContenderUnavailable`` if it cannot be."""
    cache = cache or cache_dir()
    cargo = find_cargo()
    toolchain = _run([cargo, "--version"], cwd=crate, timeout=60.0).strip()
    stamp = source_stamp(crate, toolchain)
    binary = cache / "target" / "release" / BINARY_NAME
    stamp_file = cache / "stamp"
    if binary.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "build.log"
    progress(f"building the kube-rs contender with {toolchain} (first use; minutes), log {log}")
    command = [cargo, "build", "--release", "--locked", "--target-dir", str(cache / "target")]
    output = _run(command, cwd=crate, timeout=BUILD_TIMEOUT, log=log)
    if not binary.exists():
        raise ContenderUnavailable(f"cargo built no {binary}: {_last_line(output)}")
    stamp_file.write_text(stamp)
    return binary


def _run(command: list[str], *, cwd: Path, timeout: float, log: Path | None = None) -> str:
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ContenderUnavailable(f"{Path(command[0]).name} {command[1]}: {err}") from None
    output = done.stdout + done.stderr
    if log is not None:
        log.write_text(output)
    if done.returncode != 0:
        where = f" (full log: {log})" if log is not None else ""
        raise ContenderUnavailable(
            f"{Path(command[0]).name} {command[1]} exited with {done.returncode}:"
            f" {_last_line(output)}{where}"
        )
    return output


def _last_line(output: str) -> str:
    """The first ``error`` line cargo printed, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error")]
    return (errors or lines or ["no output"])[0 if errors else -1]
