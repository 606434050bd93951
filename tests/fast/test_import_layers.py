"""Fast layer: the runtime's layers stay enforced. ``pyproject.toml`` keeps its import-linter
contracts (the layers of the package docstring, exhaustive, so a new module must be placed; the
runtime apart from the test environment, the tests and the benchmarks), ``.ci/run`` runs them,
they hold on this checkout, and the package docstring's map names every module."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = "miles.utils.workers.reconcile"


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def test_pyproject_keeps_the_layers_and_the_forbidden_imports() -> None:
    contracts = _contracts()
    layers = contracts["layers"]
    assert (layers["type"], layers["containers"], layers["exhaustive"]) == (
        "layers",
        [RUNTIME],
        True,
    )
    placed = [name.strip() for layer in layers["layers"] for name in layer.split(":")]
    assert placed[:2] == ["cli", "examples"], "the command and the examples are the top layer"
    for core in ("loop", "object_store", "work_queue", "retry_scheduler", "source_stream_driver"):
        assert placed.index(core) > placed.index("k8s_reflector"), f"{core} sits below the adapter"
    forbidden = contracts["runtime-alone"]
    assert forbidden["source_modules"] == ["miles.utils.workers"]
    assert set(forbidden["forbidden_modules"]) == {"miles.utils.k8s_testenv", "tests", "bench"}


def test_ci_runs_lint_imports_after_mypy() -> None:
    steps = (ROOT / ".ci" / "run").read_text().splitlines()
    assert steps.index(".venv/bin/lint-imports --no-logo") > steps.index(".venv/bin/mypy --strict")


def test_the_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in done.stdout


def test_the_package_docstring_names_every_module_and_subpackage() -> None:
    """The map stays whole: the package docstring names each module of the runtime, and each
    subpackage with its trailing slash, in double backquotes."""
    package = ROOT / "miles" / "utils" / "workers" / "reconcile"
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = {
        f"``{path.stem}``" if path.is_file() else f"``{path.name}/``"
        for path in package.iterdir()
        if (path.suffix == ".py" and not path.stem.startswith("__"))
        or (path / "__init__.py").is_file()
    }
    assert sorted(name for name in named if name not in doc) == []
