"""Fast layer: the repository reads without the tracker. No code, test, benchmark or document cites
a numbered issue a reader cannot open (the line states its reason or names the record's row), and
the record ``docs/reconcile-loop.md`` stays in its wrapped shape, so a changed row is a short diff.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("miles", "tests", "bench", "docs", "README.md")
RECORD = ROOT / "docs" / "reconcile-loop.md"
WIDTH = 100

# A number after "issue(s)" (N, N.M, #N), "issue item N", "test_issue_Ns", across a line break.
_ISSUE_CITATION = re.compile(r"(?<![A-Za-z])issues?[\s_]+(?:item[\s_]+)?#?\d", re.IGNORECASE)
_URL = re.compile(r"https?://\S+")


def _scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*"))
        files += [
            path
            for path in candidates
            if path.is_file()
            and "__pycache__" not in path.parts
            and path.suffix not in {".pyc", ".png", ".svg"}
            and path.resolve() != Path(__file__).resolve()
        ]
    return files


def _citations(path: Path) -> list[str]:
    text = path.read_bytes().decode("utf-8", errors="replace")
    found = []
    for match in _ISSUE_CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"{path.relative_to(ROOT)}:{line}: {' '.join(match.group().split())}")
    return found


def test_the_scan_reaches_code_tests_benchmarks_and_documents() -> None:
    scanned = {path.relative_to(ROOT).parts[0] for path in _scanned_files()}
    assert scanned == set(SCANNED)
    number = "26.1"  # kept apart from the word, so this sample is no citation itself
    assert _ISSUE_CITATION.search(f"a guard (see Issue {number})")
    assert _ISSUE_CITATION.search("def test_issue_16s_pod() -> None:")
    assert _ISSUE_CITATION.search("the fault campaign of issue\n    26")
    assert not _ISSUE_CITATION.search("the issue's bound; tissue 3")


def test_nothing_cites_a_numbered_issue() -> None:
    citations = [found for path in _scanned_files() for found in _citations(path)]
    assert not citations, (
        "state the reason, or name the row of docs/reconcile-loop.md, instead of citing an issue:\n"
        + "\n".join(citations)
    )


def _too_long(line: str) -> bool:
    """Over the width, unless one URL is what makes it longer (a link cannot be broken)."""
    urls = _URL.findall(line)
    return len(line) > WIDTH and not (len(urls) == 1 and len(line) - len(urls[0]) <= WIDTH)


def test_the_record_wraps_at_100_columns_and_has_no_table_rows() -> None:
    lines = RECORD.read_text(encoding="utf-8").splitlines()
    long_lines = [
        f"{number}: {line[:60]}..." for number, line in enumerate(lines, 1) if _too_long(line)
    ]
    table_rows = [
        f"{number}: {line[:60]}" for number, line in enumerate(lines, 1) if line.startswith("|")
    ]
    assert not long_lines, (
        "wrap at 100 characters (the format is at the top of the record):\n" + "\n".join(long_lines)
    )
    assert not table_rows, (
        "a row is a list entry, not a table row (see the top of the record):\n"
        + "\n".join(table_rows)
    )
    assert _too_long("x" * 101)
    assert not _too_long(
        "    [`Reflector`](https://github.com/kubernetes/client-go/blob/master/" + "x" * 90 + ")"
    )
