"""docs/architecture.md's "Where to add", held to the tree (issue 47): every kind of addition a
newcomer makes has its bullet, each bullet names the test that adds one end to end (and that test
exists), and every file, folder and module-level name a bullet points at is where it says."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
KINDS = {
    "optimiser": r"An optimiser",
    "runs column": r"A runs column",
    "chart": r"A chart in the report",
    "report table": r"A table in the report",
    "metric": r"A metric",
    "store table": r"A table\b(?! in)",
    "axis": r"An axis",
    "spec field": r"A spec field",
}
"""Each kind of addition and the title its bullet starts with."""


def bullets(text: str | None = None) -> dict[str, str]:
    """The "Where to add" section's bullets, by their bold title."""
    text = text if text is not None else (ROOT / "docs" / "architecture.md").read_text()
    section = re.search(r"^## Where to add\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "docs/architecture.md has no '## Where to add' section"
    return {m.group(1): m.group(0) for m in re.finditer(r"^- \*\*(.+?)\*\*.*?(?=^- \*\*|\Z)", section.group(1), re.M | re.S)}


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (and, for a test file, its test functions)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def problems(text: str | None = None) -> list[str]:
    """What in "Where to add" does not match the tree."""
    found = bullets(text)
    out = []
    for kind, title in KINDS.items():
        bullet = next((b for t, b in found.items() if re.match(title, t)), None)
        if bullet is None:
            out.append(f"{kind}: no bullet titled like {title!r}")
            continue
        one = " ".join(bullet.split())
        tests = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", one)
        if not tests:
            out.append(f"{kind}: names no `tests/test_x.py::test_name` that adds one end to end")
        for file, name in tests:
            if not (ROOT / file).exists() or name not in _defined(ROOT / file):
                out.append(f"{kind}: {file}::{name} does not exist")
    for title, bullet in found.items():
        one = " ".join(bullet.split())
        for path in re.findall(r"`((?:study|sweep|analysis|resultstore|tests|benchmarks|tools|specs)/[\w/.]*)", one):
            if not (ROOT / path.rstrip("/")).exists():
                out.append(f"{title}: `{path}` is not in the tree")
        for file, name in re.findall(r"`([\w/]+\.py)`'s `(\w+)`", one):
            if (ROOT / file).exists() and name not in _defined(ROOT / file):
                out.append(f"{title}: {file} defines no {name}")
    return out


def test_where_to_add_matches_the_tree():
    assert problems() == []


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("- **An axis**", "- **A new axis**"), "axis: no bullet"),
    (lambda t: t.replace("tests/test_axes.py::test_a_new_axis_is_one_entry", "tests/test_axes.py::test_gone"),
     "axis: tests/test_axes.py::test_gone does not exist"),
    (lambda t: t.replace("`study/optim/twins.py`", "`study/optim/twin.py`", 1), "`study/optim/twin.py` is not in the tree"),
    (lambda t: t.replace("`resultstore/schema.py`'s `CORE_COLUMNS`", "`resultstore/schema.py`'s `CORE_COLUMN`", 1),
     "resultstore/schema.py defines no CORE_COLUMN"),
])
def test_the_check_sees_a_stale_bullet(edit, expected):
    text = (ROOT / "docs" / "architecture.md").read_text()
    stale = edit(text)
    assert stale != text, "the edit no longer applies: update this test's edits"
    assert any(expected in p for p in problems(stale)), problems(stale)
