"""Fast layer: the README's example is code that type-checks against the runtime as it is.

The block under `## Example` is extracted and checked by mypy --strict in a process of its own,
so a renamed module, class or argument fails here, not in a user's hands.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[5]
CACHE = ROOT / ".cache" / "mypy-readme-example"
"""Kept between runs (`.cache/` is ignored), so only the first run analyses the runtime."""
MYPY_CONFIG = """\
[mypy]
strict = True
python_version = 3.11
namespace_packages = True
explicit_package_bases = True
mypy_path = {root}

[mypy-kubernetes_asyncio.*]
ignore_missing_imports = True
"""


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.index("\n## Example\n")
    start = readme.index("```python\n", section) + len("```python\n")
    return readme[start : readme.index("```\n", start)]


def _mypy(work: Path, **sources: str) -> str:
    """mypy --strict over each source as a module of that name; what it printed."""
    (work / "mypy.ini").write_text(MYPY_CONFIG.format(root=ROOT))
    for name, code in sources.items():
        (work / f"{name}.py").write_text(code)
    command = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(CACHE)]
    done = subprocess.run(
        [*command, *(f"{name}.py" for name in sources)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def test_the_readme_example_type_checks(tmp_path: Path) -> None:
    """And the check can fail: the same example calling a method the loop does not have is
    checked in the same run and reported."""
    example = readme_example()
    assert "ReconcileLoop(" in example
    wrong = example.replace("loop.get_by_parent(", "loop.get_by_parents(")
    printed = _mypy(tmp_path, readme_example=example, wrong_example=wrong)
    errors = [line for line in printed.splitlines() if ": error:" in line]
    assert len(errors) == 1, printed
    assert errors[0].startswith("wrong_example.py:")
    assert '"ReconcileLoop" has no attribute "get_by_parents"' in errors[0]
