"""The package's shape: no import cycles and no module over 500 lines (walked from the AST, not a list)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "toolaudit"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets.update([base] + [f"{base}.{a.name}" for a in node.names])
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def test_no_import_cycles():
    graph = _imports(_modules())

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in graph[node]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_over_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_library_does_not_import_click():
    """click belongs to the CLI; the library raises typed errors instead."""
    graph_sources = {name: path.read_text() for name, path in _modules().items()
                     if not name.startswith("toolaudit.cli")}
    users = [name for name, text in graph_sources.items() if "import click" in text]
    assert not users, f"library modules importing click: {users}"


def test_no_import_cycles_through_package_inits():
    """Importing `a.b.c` first runs `a/b/__init__.py`: a cycle through a package's `__init__` (it was
    analysis.budgets -> report.output, which ran report/__init__ -> report.data -> analysis.budgets) breaks
    depending on which module a process imports first (`pytest tests/test_matrix.py` alone failed)."""
    mods = _modules()
    graph = _imports(mods)
    for name, targets in graph.items():
        inits = {".".join(t.split(".")[:i]) for t in targets for i in range(2, len(t.split(".")))}
        targets |= {p for p in inits if p in mods and p != name and not name.startswith(p + ".")}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert not cycles, f"import cycles through package __init__ modules: {cycles}"
