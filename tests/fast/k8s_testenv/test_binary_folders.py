"""Fast layer: where the test environment finds its pins and keeps its binaries, and the one-line
mistakes when it can build nothing (no Go, a folder that cannot be written)."""

from __future__ import annotations

import fnmatch
import importlib
import io
import tomllib
from pathlib import Path

import pytest

from miles.utils.k8s_testenv import EnvSettings
from miles.utils.k8s_testenv.binaries import bin_dir, checkout_root, ensure_binaries, tools_dir
from miles.utils.workers.reconcile import cli

CHECKOUT = checkout_root()


def test_in_a_checkout_the_pins_are_tools_k8s_and_binaries_go_to_its_cache() -> None:
    assert CHECKOUT is not None
    assert tools_dir().resolve() == (CHECKOUT / "tools" / "k8s").resolve()
    assert bin_dir(EnvSettings()) == CHECKOUT / ".cache" / "k8s-bin"


def test_the_binary_folder_variable_wins(tmp_path: Path) -> None:
    settings = EnvSettings.from_env({"MILES_K8S_BIN_DIR": str(tmp_path)})
    assert bin_dir(settings) == tmp_path


def test_the_wheel_carries_every_file_of_every_pinned_module() -> None:
    """Package data: every folder of tools/k8s with a go.mod (the stamp hashes its .go, go.mod
    and go.sum) is a package setuptools finds under `pins` (declared, so the build warns of none),
    and each of those files matches the package data every package ships."""
    assert CHECKOUT is not None
    pyproject = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    setuptools_config = pyproject["tool"]["setuptools"]
    patterns = setuptools_config["package-data"]["*"]
    find = setuptools_config["packages"]["find"]
    setuptools = importlib.import_module("setuptools")  # its stubs are not a test dependency
    found = set(
        setuptools.find_namespace_packages(
            where=str(CHECKOUT), include=find["include"], exclude=find.get("exclude", ())
        )
    )
    modules = sorted((CHECKOUT / "tools" / "k8s").glob("*/go.mod"))
    assert len(modules) >= 4
    for go_mod in modules:
        assert f"miles.utils.k8s_testenv.pins.{go_mod.parent.name}" in found, go_mod.parent.name
        for path in go_mod.parent.iterdir():
            if path.suffix in {".go", ".mod", ".sum"}:
                assert any(fnmatch.fnmatch(path.name, p) for p in patterns), path


def _without_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def _with_fake_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without_go(monkeypatch, tmp_path)
    go = tmp_path / "path" / "go"
    go.write_text("#!/bin/sh\nexit 99\n")
    go.chmod(0o755)


def test_without_go_the_binaries_present_are_used_as_they_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without_go(monkeypatch, tmp_path)
    for name in ("etcd", "kube-apiserver"):
        (tmp_path / name).write_text("built elsewhere")
    paths = ensure_binaries(
        names=("etcd", "kube-apiserver"), settings=EnvSettings(bin_dir=tmp_path)
    )
    assert (paths.etcd, paths.kube_apiserver) == (tmp_path / "etcd", tmp_path / "kube-apiserver")


def _env_up_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bin_dir: Path
) -> list[str]:
    """`env up` with MILES_K8S_BIN_DIR at `bin_dir`: exits 2; returns the lines of its stderr."""
    monkeypatch.setenv("MILES_K8S_BIN_DIR", str(bin_dir))
    code = cli.main(["env", "up"], out=io.StringIO())
    assert code == 2
    return capsys.readouterr().err.splitlines()


def test_env_up_without_go_or_binaries_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_go(monkeypatch, tmp_path)
    assert _env_up_fails(monkeypatch, capsys, tmp_path / "bin") == [
        f"miles-reconcile: error: etcd, kube-apiserver not built in {tmp_path / 'bin'} and the "
        "Go toolchain is not on PATH: install Go >= 1.26 to build them from the pins, or point "
        "MILES_K8S_BIN_DIR at a folder of built binaries"
    ]


def test_env_up_with_a_binary_folder_that_cannot_be_created_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_fake_go(monkeypatch, tmp_path)
    (tmp_path / "a-file").write_text("")
    folder = tmp_path / "a-file" / "bin"
    assert _env_up_fails(monkeypatch, capsys, folder) == [
        f"miles-reconcile: error: etcd, kube-apiserver not built in {folder} and {folder} cannot "
        "be created (Not a directory): set MILES_K8S_BIN_DIR to a writable folder, or to one of "
        "built binaries"
    ]
