"""Fast layer: packaging per the contract; the loop imports without ``kubernetes_asyncio``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

_CORE_MODULES = [
    "clock",
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


def test_loop_imports_in_an_environment_without_kubernetes_asyncio(tmp_path: Path) -> None:
    """Packaging: ``kubernetes_asyncio`` is an optional extra, so the runtime core (and
    ``import miles.utils.workers.reconcile.loop``) must import with it blocked."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_WITHOUT_KUBERNETES, *_CORE_MODULES],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported ReconcileLoop"


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
