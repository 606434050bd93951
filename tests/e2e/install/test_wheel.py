"""Layer install: what a new user gets from `pip install 'miles-reconcile[k8s]'` of the wheel.

The wheel is built from a copy of this checkout with pip's own `pip wheel` and installed with its
`[k8s]` extra into a fresh virtualenv in a temporary folder, outside the checkout, with no
`PYTHONPATH`. From there: `--version`, `watch --help`, `env up` and `env down` on the session's
built binaries (`MILES_K8S_BIN_DIR`, so nothing is rebuilt), a build from the pins the wheel
carries into the user's cache folder, and the mistakes a new user makes, each one line and exit 2.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import BinaryPaths, EnvSettings
from miles.utils.k8s_testenv.binaries import checkout_root
from miles.utils.k8s_testenv.client import check_reachable

PIP_TIMEOUT = 600.0
COMMAND_TIMEOUT = 180.0


@dataclass(frozen=True)
class Installed:
    venv: Path
    home: Path
    bin_dir: Path
    go_caches: Mapping[str, str]
    build_output: str
    """What `pip wheel -v` printed, the build backend's own output included."""

    def environ(self, **extra: str) -> dict[str, str]:
        """A user's environment: no PYTHONPATH or virtualenv of the checkout, per-user folders in
        the test's own home, the session's binaries. Go keeps the machine's module and build
        caches, which would otherwise follow `XDG_CACHE_HOME` and start cold."""
        keep = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "TMPDIR"}}
        return {
            **keep,
            **self.go_caches,
            "XDG_STATE_HOME": str(self.home / "state"),
            "XDG_CACHE_HOME": str(self.home / "cache"),
            "MILES_K8S_BIN_DIR": str(self.bin_dir),
            **extra,
        }

    def run(
        self, *argv: str, environ: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs in a session of its own, killed whole (a `go build` included) on a timeout."""
        with subprocess.Popen(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            cwd=self.home,
            env=dict(environ if environ is not None else self.environ()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as process:
            try:
                out, err = process.communicate(timeout=COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _pip(settings: EnvSettings, *argv: str) -> str:
    """Runs pip; returns what it printed, stdout and stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False)
    if done.returncode != 0:
        reason = f"{' '.join(argv[:4])} ... failed:\n{done.stderr[-2000:]}"
        if settings.require:
            pytest.fail(reason)
        pytest.skip(reason)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(
    k8s_settings: EnvSettings,
    k8s_binaries: BinaryPaths,
    tmp_path_factory: pytest.TempPathFactory,
) -> Installed:
    checkout = checkout_root()
    assert checkout is not None, "the install layer builds the wheel of a checkout"
    home = tmp_path_factory.mktemp("install")
    assert checkout not in home.parents
    started = time.monotonic()
    source = _copy_of_the_tree(checkout, home / "source")
    build_output = _pip(k8s_settings, sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                        "-w", str(home / "wheel"), str(source))  # fmt: skip
    built = time.monotonic()
    (wheel,) = (home / "wheel").glob("miles_reconcile-*.whl")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT)
    _pip(k8s_settings, str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
         f"{wheel}[k8s]")  # fmt: skip
    print(
        f"install layer: wheel built in {built - started:.1f}s, installed with [k8s] in "
        f"{time.monotonic() - built:.1f}s ({venv})"
    )
    return Installed(
        venv=venv,
        home=home,
        bin_dir=k8s_binaries.etcd.parent,
        go_caches=_go_caches(),
        build_output=build_output,
    )


def _copy_of_the_tree(checkout: Path, target: Path) -> Path:
    """The checkout's files as they are (committed or not, ignored ones left out), links kept: a
    build in the checkout itself would reuse its `build/` folder, where a deleted module lingers."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=checkout,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = checkout / name
        if not source.exists() and not source.is_symlink():
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name, follow_symlinks=False)
    return target


def _go_caches() -> dict[str, str]:
    go = shutil.which("go")
    if go is None:
        return {}
    names = ("GOCACHE", "GOMODCACHE", "GOPATH")
    values = subprocess.run(
        [go, "env", *names], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    return dict(zip(names, values, strict=True))


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    done = installed.run(
        "python", "-c", "import miles.utils.k8s_testenv as m, sys; print(m.__file__)"
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed.venv)


def test_version_and_watch_help(installed: Installed) -> None:
    done = installed.run("miles-reconcile", "--version")
    assert (done.returncode, done.stdout) == (0, f"miles-reconcile {version('miles-reconcile')}\n")
    done = installed.run("miles-reconcile", "watch", "--help")
    assert done.returncode == 0, done.stderr
    assert "--parent-label" in done.stdout
    done = installed.run("miles-reconcile", "--help")
    assert all(name in done.stdout for name in ("watch", "env", "demo"))


def test_building_the_wheel_warns_of_no_undeclared_package(installed: Installed) -> None:
    """The pin folders are declared packages of data, so setuptools, whose output `-v` shows
    whatever pip's version, warns of no folder it would otherwise leave out (it did, 8 times)."""
    assert "Building wheel" in installed.build_output
    assert "absent from the `packages` configuration" not in installed.build_output
    assert "Package would be ignored" not in installed.build_output


def test_the_wheel_carries_every_pinned_module(installed: Installed) -> None:
    checkout = checkout_root()
    assert checkout is not None
    done = installed.run(
        "python", "-c", "from miles.utils.k8s_testenv.binaries import tools_dir; print(tools_dir())"
    )
    pins = Path(done.stdout.strip())
    assert pins.is_relative_to(installed.venv)
    for go_mod in sorted((checkout / "tools" / "k8s").glob("*/go.mod")):
        module = go_mod.parent
        wanted = sorted(p.name for p in module.iterdir() if p.suffix in {".go", ".mod", ".sum"})
        assert sorted(p.name for p in (pins / module.name).iterdir()) == wanted, module.name
        for name in wanted:
            assert (pins / module.name / name).read_bytes() == (module / name).read_bytes()


def test_env_up_and_down_from_the_installed_command(installed: Installed) -> None:
    started = time.monotonic()
    up = installed.run("miles-reconcile", "env", "up")
    up_seconds = time.monotonic() - started
    assert up.returncode == 0, up.stderr
    assert "building" not in up.stderr, "the binaries of MILES_K8S_BIN_DIR were rebuilt"
    first, export = up.stdout.splitlines()
    name = first.split()[3].rstrip(";")
    kubeconfig = Path(export.removeprefix("export KUBECONFIG="))
    try:
        assert kubeconfig.is_file()
        planes = installed.home / "state" / "miles-reconcile" / "planes"
        assert [p.stem for p in planes.glob("*.json")] == [name]
        asyncio.run(check_reachable(kubeconfig))
    finally:
        down = installed.run("miles-reconcile", "env", "down", name)
    assert (down.returncode, down.stdout) == (0, f"stopped {name} (left running)\n"), down.stderr
    assert not kubeconfig.exists()
    print(f"install layer: env up from the wheel took {up_seconds:.1f}s")


def test_a_build_from_the_wheels_pins_goes_to_the_users_cache(installed: Installed) -> None:
    """The oracle (seconds with a warm Go build cache) stands for every binary: built from the
    wheel's copy of the pins into `$XDG_CACHE_HOME/miles-reconcile/k8s-bin`, with the stamp the
    checkout's build recorded, so both trees pin the same thing."""
    environ = installed.environ()
    del environ["MILES_K8S_BIN_DIR"]
    done = installed.run(
        "python", "-m", "miles.utils.k8s_testenv", "build", "--only", "oracle", environ=environ
    )
    assert done.returncode == 0, done.stderr
    cache = installed.home / "cache" / "miles-reconcile" / "k8s-bin"
    assert (cache / "oracle").is_file()
    stamp = (cache / "oracle.stamp").read_text()
    assert stamp == (installed.bin_dir / "oracle.stamp").read_text()


def test_env_up_without_go_or_binaries_is_one_line(installed: Installed) -> None:
    environ = installed.environ(
        PATH=str(installed.venv / "bin"), MILES_K8S_BIN_DIR=str(installed.home / "empty")
    )
    done = installed.run("miles-reconcile", "env", "up", environ=environ)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "the Go toolchain is not on PATH: install Go" in done.stderr
    assert "MILES_K8S_BIN_DIR" in done.stderr


def test_watch_without_the_k8s_extra_names_it(installed: Installed, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=PIP_TIMEOUT)
    (wheel,) = (installed.home / "wheel").glob("miles_reconcile-*.whl")
    pip = [str(bare / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)]
    subprocess.run(pip, check=True, capture_output=True, timeout=PIP_TIMEOUT)
    done = subprocess.run(
        [str(bare / "bin" / "miles-reconcile"), "watch", "-l", "a=b", "--parent-label", "c"],
        cwd=tmp_path,
        env=installed.environ(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "miles-reconcile: error: kubernetes_asyncio is not installed: "
        "pip install 'miles-reconcile[k8s]'"
    ]


def test_the_wheel_serves_the_model_where_miless_controllers_import_it(
    installed: Installed,
) -> None:
    """`miles.utils.workers.k8s_types` is installed, typed, and the runtime's very classes."""
    probe = (
        "import pathlib\n"
        "import miles.utils.workers.k8s_types as alias\n"
        "from miles.utils.workers.reconcile import k8s_types\n"
        "assert alias.Pod is k8s_types.Pod\n"
        "print((pathlib.Path(alias.__file__).parent / 'py.typed').is_file())\n"
    )
    done = installed.run("python", "-c", probe)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr
