"""Fast layer: packaging per the contract; the loop imports without ``kubernetes_asyncio``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import miles.utils.workers.reconcile as runtime
from miles.utils.workers.reconcile import (
    k8s_api,
    k8s_config,
    k8s_errors,
    k8s_interfaces,
    k8s_values,
)

_CORE_MODULES = [
    "clock",
    "k8s_values",
    "k8s_errors",
    "k8s_wire",
    "k8s_framing",
    "k8s_interfaces",
    "k8s_pager",
    "k8s_reflector",
    "k8s_api",
    "source_event",
    "object_store",
    "work_queue",
    "retry_scheduler",
    "source_stream_driver",
    "loop",
]

_IMPORT_WITHOUT_KUBERNETES = textwrap.dedent(
    """
    import importlib
    import sys

    class BlockKubernetes:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "kubernetes_asyncio":
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, BlockKubernetes())
    try:
        import kubernetes_asyncio
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("the blocker did not block")
    for module in sys.argv[1:]:
        importlib.import_module("miles.utils.workers.reconcile." + module)
    from miles.utils.workers.reconcile.loop import ReconcileLoop
    assert not [name for name in sys.modules if name.startswith("kubernetes_asyncio")]
    print("imported", ReconcileLoop.__name__)
    """
)


def _python(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -c ...` in `cwd`, its output captured, bounded at a minute."""
    return subprocess.run(
        [sys.executable, "-c", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_loop_imports_in_an_environment_without_kubernetes_asyncio(tmp_path: Path) -> None:
    """Packaging: ``kubernetes_asyncio`` is an optional extra, so the runtime core (and
    ``import miles.utils.workers.reconcile.loop``) must import with it blocked."""
    done = _python(tmp_path, _IMPORT_WITHOUT_KUBERNETES, *_CORE_MODULES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported ReconcileLoop"


_IMPORT_WITHOUT_TESTENV = textwrap.dedent(
    """
    import contextlib
    import importlib
    import io
    import pkgutil
    import sys

    class BlockTestenv:
        def find_spec(self, name, path=None, target=None):
            if name == "miles.utils.k8s_testenv" or name.startswith("miles.utils.k8s_testenv."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, BlockTestenv())
    import miles.utils.workers.reconcile as runtime

    modules = [m.name for m in pkgutil.walk_packages(runtime.__path__, runtime.__name__ + ".")]
    for module in modules:
        importlib.import_module(module)
    from miles.utils.workers.reconcile import cli

    printed = {}
    for argv in (("watch", "--help"), ("--help",), ("--version",)):
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
            cli.main(list(argv))
        printed[argv] = out.getvalue()
    assert "--parent-label" in printed[("watch", "--help")]
    assert "(cannot be loaded: ModuleNotFoundError)" in printed[("--help",)]
    assert printed[("--version",)].startswith("miles-reconcile ")
    leaked = [name for name in sys.modules if name.startswith("miles.utils.k8s_testenv")]
    assert not leaked, leaked
    print(len(modules), "modules")
    """
)


def test_the_runtime_and_its_command_line_never_import_the_test_environment(
    tmp_path: Path,
) -> None:
    """Packaging: what ships as the runtime (every module under ``miles.utils.workers.reconcile``,
    its command line included, with ``watch --help``, ``--help`` and ``--version`` run) imports
    with ``miles.utils.k8s_testenv`` blocked; ``env`` and ``demo`` arrive as entry points."""
    done = _python(tmp_path, _IMPORT_WITHOUT_TESTENV)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) >= 12, done.stdout


def test_the_provisioner_imports_nothing_from_the_runtime(tmp_path: Path) -> None:
    """Packaging: every module of ``miles.utils.k8s_testenv`` but the two that join it to the
    runtime (``commands``, ``testing``) imports without ``miles.utils.workers``."""
    probe = textwrap.dedent(
        """
        import importlib, pathlib, sys
        import miles.utils.k8s_testenv as env

        root = pathlib.Path(env.__file__).parent
        joins = {"commands", "testing"}
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[0] not in joins:
                importlib.import_module(".".join((env.__name__, *parts)).removesuffix(".__init__"))
        print([m for m in sys.modules if m.startswith("miles.utils.workers")])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_miles_prefixes_are_namespace_packages() -> None:
    """Packaging: ``miles``, ``miles.utils`` and ``miles.utils.workers`` have no ``__init__.py``,
    so this distribution installs beside other code under the same prefix."""
    for name in ("miles", "miles.utils", "miles.utils.workers"):
        spec = importlib.util.find_spec(name)
        assert spec is not None
        assert spec.origin is None, f"{name} is a regular package at {spec.origin}"
    spec = importlib.util.find_spec("miles.utils.workers.reconcile")
    assert spec is not None
    assert spec.origin is not None
    assert (Path(spec.origin).parent / "py.typed").is_file()


def test_the_wheel_ships_the_model_where_miless_controllers_import_it() -> None:
    """Packaging: ``miles.utils.workers.k8s_types`` (a package, so its ``py.typed`` marks it typed
    inside the namespace) is in what setuptools finds from ``pyproject.toml``, and the namespace
    ``miles.utils.workers`` itself stays unowned."""
    root = Path(__file__).resolve().parents[5]
    setuptools_config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setuptools_config["packages"]["find"]["include"]
    setuptools = importlib.import_module("setuptools")  # its stubs are not a test dependency
    found = set(setuptools.find_namespace_packages(where=str(root), include=include))
    assert {"miles.utils.workers.reconcile", "miles.utils.workers.k8s_types"} <= found
    assert not found & {"miles", "miles.utils", "miles.utils.workers"}
    assert "py.typed" in setuptools_config["package-data"]["miles.utils.workers.k8s_types"]
    assert (root / "miles/utils/workers/k8s_types/py.typed").is_file()


_REPOSITORY = Path(__file__).resolve().parents[5]
_RUNTIME = Path(runtime.__path__[0])


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("PodListPage", k8s_values),
        ("PodWatchEvent", k8s_values),
        ("KubernetesPodApi", k8s_interfaces),
        ("exception_rejects_cursor", k8s_errors),
        ("ServiceAccountToken", k8s_config),
        ("in_cluster_possible", k8s_config),
    ],
)
def test_the_contracts_names_stay_importable_from_the_transport(name: str, home: object) -> None:
    """The contract's old shape: ``from ...k8s_api import PodListPage`` (and the rest, the
    service account's token among them) still gives the one class or function, whose home is its
    own module."""
    assert name in k8s_api.__all__
    assert getattr(k8s_api, name) is getattr(home, name)
    assert getattr(k8s_api, name).__module__ == home.__name__  # type: ignore[attr-defined]
    assert callable(k8s_api.PodWatchEvent.from_frame)


def _imports_from(module: str, path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    ]


def test_every_import_of_an_adapter_name_goes_to_its_home() -> None:
    """No re-export shims: inside the repository, the transport is imported only for what it
    defines (this file's test of the contract's old shape aside)."""
    own = {
        name
        for name, value in vars(k8s_api).items()
        if getattr(value, "__module__", None) == k8s_api.__name__ or name.isupper()
    }
    borrowed = [
        f"{path.relative_to(_REPOSITORY)}:{line} imports {name}"
        for root in ("miles", "tests", "bench")
        for path in sorted((_REPOSITORY / root).rglob("*.py"))
        if path != Path(__file__).resolve()
        for line, name in _imports_from(k8s_api.__name__, path)
        if name not in own
    ]
    assert borrowed == []


def test_the_examples_import_nothing_from_the_command() -> None:
    """Layers: an example connects as any controller does (``k8s_config``, ``k8s_api``), never
    through the command's parts."""
    command = {_module_name(path) for path in (_RUNTIME / "cli").rglob("*.py")}
    pool_loop = _RUNTIME / "cli" / "pool_loop.py"
    assert _imports_of(pool_loop, _module_name(pool_loop), command), "a late import is seen"
    examples = sorted((_RUNTIME / "examples").rglob("*.py"))
    found = [
        f"{path.name} imports {name}"
        for path in examples
        for name in sorted(_imports_of(path, _module_name(path), command))
    ]
    assert len(examples) >= 3
    assert found == []


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(_REPOSITORY).with_suffix("").parts).removesuffix(".__init__")


def _imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere: at the top, inside a function,
    or under ``TYPE_CHECKING``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
    return (named & modules) - {module}


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            if cycle := visit(imported):
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if cycle := visit(module):
            return cycle
    return None


def test_the_import_graph_of_what_ships_has_no_cycle() -> None:
    """Packaging: no module under ``miles`` imports, however late, a module that imports it back
    (``loop`` reports to ``metrics`` through ``metrics_provider`` and is never imported by it)."""
    paths = {_module_name(path): path for path in sorted((_REPOSITORY / "miles").rglob("*.py"))}
    graph = {module: _imports_of(path, module, set(paths)) for module, path in paths.items()}
    loop = "miles.utils.workers.reconcile.loop"
    assert "miles.utils.workers.reconcile.metrics" in graph[loop], "the lazy import is seen"
    assert _a_cycle(graph) is None, " -> ".join(_a_cycle(graph) or [])
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


_CLIENT_ROOTS = frozenset({"kubernetes_asyncio", "aiohttp"})


def _client_imports(path: Path) -> list[tuple[int, bool]]:
    """Each import of the Kubernetes client or aiohttp in ``path``: its line and whether it sits
    inside a function."""
    found: list[tuple[int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if node.level == 0
                else []
            )
            if any(name.split(".")[0] in _CLIENT_ROOTS for name in names):
                found.append((node.lineno, in_function))
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def test_only_the_transport_imports_the_kubernetes_client_and_only_inside_functions() -> None:
    """Row ``k8s_api.py``: in every module of the runtime, its command line and its
    examples, ``kubernetes_asyncio`` and aiohttp are imported by ``k8s_api.py`` alone, lazily."""
    transport = Path(k8s_api.__file__).resolve()
    imports = {path: _client_imports(path) for path in sorted(_RUNTIME.rglob("*.py"))}
    elsewhere = [
        f"{path.relative_to(_RUNTIME)}:{line}"
        for path, found in imports.items()
        if path != transport
        for line, _ in found
    ]
    at_module_level = [line for line, in_function in imports[transport] if not in_function]
    assert elsewhere == []
    assert at_module_level == []
    assert imports[transport], "the scan found no import in the transport at all"
