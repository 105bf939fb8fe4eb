"""The layering of docs/architecture.md, read from the source with `ast`: imports go down only
(resultstore <- study, analysis <- sweep), and no import cycle exists, lazy and `if
TYPE_CHECKING:` imports included. And the sizes a reader can hold: no module over 500 lines, no
function over 100."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("resultstore", "study", "sweep", "analysis")

FORBIDDEN = {
    "resultstore": {"study", "sweep", "analysis", "torch", "ray"},
    "study": {"sweep", "analysis", "ray"},
    "analysis": {"study", "sweep", "torch", "ray"},
    "sweep": set(),
    # corpus preparation: an offline tool (numpy, tokenizers), reading of study only the format
    "sweep.prepare": {"study", "analysis", "torch", "ray"},
}
"""A layer (a package, or a sub-package with rules of its own) -> what it never imports."""
ALLOWED = {"sweep.prepare": {"study.corpus.format"}}
"""Exceptions to FORBIDDEN: the corpus format is the leaf study and the preparer share."""
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, *, top_level_only: bool, type_checking: bool = False) -> set[str]:
    """Absolute names this module imports (`from a import b` gives `a.b`, which may be a module
    or a name in `a`). Top level only: not inside functions. `if TYPE_CHECKING:` imports only
    with `type_checking` (the cycles: a loop that only type checkers see is still one)."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{module}: relative import (the project imports absolutely)"
                base = node.module or ""
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit((node.body if type_checking else []) + node.orelse)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and top_level_only:
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])

    visit(tree.body)  # type: ignore[attr-defined]
    return found


@pytest.fixture(scope="module")
def sources() -> dict[str, ast.AST]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in _modules().items()}


def _within(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _upward(sources: dict[str, ast.AST], layer: str) -> list[str]:
    """`module imports name` for each import of `layer`'s modules that its rules forbid."""
    bad = []
    for module, tree in sources.items():
        if not _within(module, {layer}):
            continue
        for name in _imports(tree, module, top_level_only=False):
            if _within(name, FORBIDDEN[layer]) and not _within(name, ALLOWED.get(layer, set())):
                bad.append(f"{module} imports {name}")
    return sorted(set(bad))


@pytest.mark.parametrize("layer", FORBIDDEN)
def test_imports_go_down_only(sources: dict[str, ast.AST], layer: str) -> None:
    """Anywhere in a module, lazy imports included: a layer never reaches up."""
    bad = _upward(sources, layer)
    assert not bad, "\n".join(bad)


def _graph(sources: dict[str, ast.AST]) -> dict[str, set[str]]:
    """Imports between project modules, lazy ones included (a cycle through a function-level
    import is still two modules that need each other); a name in a package resolves to the
    package, a submodule to itself."""
    graph: dict[str, set[str]] = {}
    for module, tree in sources.items():
        edges = set()
        for name in _imports(tree, module, top_level_only=False, type_checking=True):
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.add(name)
        graph[module] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A package imported by its own submodule is the package's __init__ running first;
            # importing a submodule from its package's __init__ is not a cycle either way.
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle(sources: dict[str, ast.AST]) -> None:
    cycle = _cycle(_graph(sources))
    assert cycle is None, " -> ".join(cycle or [])


def test_the_checks_see_a_violation() -> None:
    """The reader of imports and the cycle finder catch what they exist to catch."""
    upward = ast.parse("import os\nfrom study.model import Transformer\ndef f():\n    import ray\n")
    assert {"study.model", "study.model.Transformer", "ray"} <= _imports(upward, "resultstore.x", top_level_only=False)
    assert "ray" not in _imports(upward, "resultstore.x", top_level_only=True)
    guarded = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n")
    assert "torch" not in _imports(guarded, "analysis.x", top_level_only=False)
    assert "torch" in _imports(guarded, "analysis.x", top_level_only=False, type_checking=True)
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x", "a.y", "a.z", "a.x"]
    assert _cycle({"a": {"a.x"}, "a.x": {"a"}}) is None
    loop = {"a.x": ast.parse("from a.y import Y\n"),
            "a.y": ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.x import X\n")}
    assert _cycle(_graph(loop)) == ["a.x", "a.y", "a.x"]
    offline = {"sweep.prepare.x": ast.parse("from study.corpus.format import MANIFEST\nfrom study.data import load_corpus\n")}
    assert _upward(offline, "sweep.prepare") == ["sweep.prepare.x imports study.data", "sweep.prepare.x imports study.data.load_corpus"]
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert _long_functions({"a.x": ast.parse(long_function)}) == [f"a.x.f: {MAX_FUNCTION_LINES + 1} lines"]


def _long_functions(sources: dict[str, ast.AST]) -> list[str]:
    """`module.function: N lines` for each function (or method) over MAX_FUNCTION_LINES."""
    return sorted(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
                  for module, tree in sources.items() for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES)


def test_no_module_is_over_500_lines() -> None:
    """A module a reader can hold: split by what its parts do before it grows past this."""
    long = sorted(f"{name}: {n} lines" for name, path in _modules().items()
                  if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES)
    assert not long, "\n".join(long)


def test_no_function_is_over_100_lines(sources: dict[str, ast.AST]) -> None:
    """A function reads as its steps: past this, name the steps as functions of their own."""
    long = _long_functions(sources)
    assert not long, "\n".join(long)


def test_every_module_says_what_it_exports(sources: dict[str, ast.AST]) -> None:
    """An explicit `__all__` in every module: the public names are a decision, not an accident."""
    def declares(tree: ast.AST) -> bool:
        return any(isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in
                   {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
                   for node in tree.body) or any(
                   isinstance(node, ast.ImportFrom) and any(a.name == "__all__" for a in node.names) for node in tree.body)
    missing = sorted(m for m, tree in sources.items() if not declares(tree))
    assert not missing, missing
