"""The package's shape: a few wings at the top, no import cycles, no module over 450 lines (walked from the AST
and the file tree, not a list); and the tests', which mirror it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "toolaudit"
MAX_LINES = 450
# The wings that show the flow (collect -> ingest -> validate -> compare -> analysis; replay beside compare;
# engines, store, report, serve, cli), with __init__.py and __main__.py: a newcomer reads the flow off the
# folder list.
MAX_TOP_LEVEL = 14  # __init__, __main__ and twelve wings (api: the Python API the CLI stands on)
TESTS = Path(__file__).resolve().parent
# tests/ mirrors the package: a wing's tests in tests/<wing>/. Beside the wings' folders, the folders that test
# across them (the canary history, the real instrumentation libraries' spans, CUDA) and the plug-in distributions
# the tests install; at the top, the support modules the folders share and a few tests that cut across wings
# (this one; secrets, which follows a key through every wing).
CROSS_CUTTING_FOLDERS = {"history", "tracing", "gpu", "plugins", "scripts"}
MAX_TOP_LEVEL_TESTS = 3


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


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of modules that reach each other through the graph."""
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

    return sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})


def test_no_import_cycles():
    cycles = _cycles(_imports(_modules()))
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_over_450_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_top_level_is_a_few_wings():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL, f"{len(entries)} entries at the top of toolaudit/: {entries}"
    loose = [e for e in entries if e.endswith(".py") and e not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside a wing: {loose}"


def test_the_tests_mirror_the_package():
    """Each wing's tests in tests/<wing>/, a package (its own `__init__.py`, so `tests/compare/test_logs.py` and
    `tests/collect/test_logs.py` import as `compare.test_logs` and `collect.test_logs`), every test folder a wing or
    one of the few that cut across them, and the top of tests/ its support modules and a few tests at most."""
    wings = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert wings <= folders, f"wings without a tests/<wing>/ folder: {sorted(wings - folders)}"
    strays = sorted(folders - wings - CROSS_CUTTING_FOLDERS)
    assert not strays, f"test folders that are no wing of toolaudit/: {strays}"
    no_init = sorted(str(d.relative_to(TESTS)) for d in {t.parent for t in TESTS.rglob("test_*.py")}
                     if d != TESTS and "plugins" not in d.relative_to(TESTS).parts and not (d / "__init__.py").exists())
    assert not no_init, f"test folders without an __init__.py: {no_init}"
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert len(loose) <= MAX_TOP_LEVEL_TESTS, (
        f"{len(loose)} test files at the top of tests/ (move each into the folder of the wing it tests): {loose}")


def test_the_library_does_not_import_click():
    """click belongs to the CLI; the library raises typed errors instead."""
    graph_sources = {name: path.read_text() for name, path in _modules().items()
                     if not name.startswith("toolaudit.cli")}
    users = [name for name, text in graph_sources.items() if "import click" in text]
    assert not users, f"library modules importing click: {users}"


# SQL statements as this code base writes them (keywords in capitals; prose in messages is lower case).
_SQL = re.compile(r"""^\s*(SELECT|WITH)\s | \bSELECT\b[\s\S]*\bFROM\b | \bINSERT\s+INTO\b | \bUPDATE\s+\S+\s+SET\b
    | \bDELETE\s+FROM\b | \bCREATE\s+(OR\s+REPLACE\s+)?(TEMP\s+|TEMPORARY\s+)?(TABLE|VIEW|SEQUENCE|MACRO|INDEX)\b
    | \bDROP\s+(TABLE|VIEW|SEQUENCE|MACRO)\b | \bALTER\s+TABLE\b | ^\s*(BEGIN|COMMIT|ROLLBACK|CHECKPOINT)\b
    | \b(ATTACH|DETACH)\s | \bCOPY\s*\( | ^\s*(SET|RESET|PRAGMA|INSTALL|LOAD)\s+\w""", re.X)


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant outside docstrings, an f-string as its literal parts with `{}` between them."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            found.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}"
                                               for v in node.values)))
    found += [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
              and isinstance(node.value, str) and id(node) not in skip]
    return found


def test_sql_and_transactions_live_in_the_store():
    """The store owns every SQL statement and transaction: no SQL text in a module outside `toolaudit/store/`,
    and no module outside it reaches the DuckDB connection (`.con`). The user's own `toolaudit sql` passes
    their text through `Store.query`."""
    assert _SQL.search("SELECT run_id FROM runs") and _SQL.search("BEGIN TRANSACTION")
    assert _SQL.search("INSERT INTO {} BY NAME SELECT * FROM _rows") and not _SQL.search("select a run to update")
    store = PACKAGE / "store"
    found, reached = [], []
    for path in sorted(_modules().values()):
        if store in path.parents:
            continue
        tree = ast.parse(path.read_text())
        where = path.relative_to(PACKAGE.parent)
        found += [f"{where}:{line}: {text.strip()[:60]!r}" for line, text in _strings(tree) if _SQL.search(text)]
        reached += [f"{where}:{node.lineno}" for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and node.attr == "con"]
    assert not found, "SQL outside toolaudit/store/ (move it into a store module):\n" + "\n".join(found)
    assert not reached, "the DuckDB connection used outside toolaudit/store/:\n" + "\n".join(reached)


def test_no_import_cycles_through_package_inits():
    """Importing `a.b.c` first runs `a/b/__init__.py`: a cycle through a package's `__init__` (it was
    analysis.budgets -> report.output, which ran report/__init__ -> report.data -> analysis.budgets) breaks
    depending on which module a process imports first (`pytest tests/compare/test_matrix.py` alone failed)."""
    mods = _modules()
    graph = _imports(mods)
    for name, targets in graph.items():
        inits = {".".join(t.split(".")[:i]) for t in targets for i in range(2, len(t.split(".")))}
        targets |= {p for p in inits if p in mods and p != name and not name.startswith(p + ".")}
    cycles = _cycles(graph)
    assert not cycles, f"import cycles through package __init__ modules: {cycles}"


ENGINE_DRIVERS = ("toolaudit.replay", "toolaudit.serve", "toolaudit.cli", "toolaudit.engines.base",
                  "toolaudit.engines.registry", "toolaudit.engines.local", "toolaudit.engines.logs")


def test_engines_keep_one_contract_and_nobody_probes_them():
    """Every registered engine (built-in or plug-in) is an `Engine` subclass declaring its spec's name and
    capabilities; code that drives engines asks them through that contract, never with getattr/hasattr; and no
    engine package imports another's (what engines share lives beside them, in toolaudit.engines)."""
    from toolaudit.engines import ENGINES, Engine

    assert not ENGINES.problems, ENGINES.problems
    for name, spec in ENGINES.items():
        factory = spec.load_factory()
        assert isinstance(factory, type) and issubclass(factory, Engine), f"engine {name}: {spec.factory}"
        assert (factory.name, factory.capabilities) == (name, spec.capabilities), f"engine {name}"

    mods = _modules()
    probes = []
    for name, path in mods.items():
        if name.startswith(ENGINE_DRIVERS):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                        "getattr", "hasattr"):
                    probes.append(f"{name}:{node.lineno} {node.func.id}")
    assert not probes, f"attribute probing where engines are driven: {probes}"

    engine_packages = {n for n, p in mods.items() if n.count(".") == 2 and n.startswith("toolaudit.engines.")
                       and p.name == "__init__.py"}
    crossing = sorted((name, target) for name, targets in _imports(mods).items() for target in targets
                      for pkg in engine_packages for other in engine_packages
                      if pkg != other and (name + ".").startswith(pkg + ".")
                      and (target + ".").startswith(other + "."))
    assert not crossing, f"engine packages importing each other: {crossing}"


def test_the_store_imports_nothing_from_the_wings_above_it():
    """The store owns what the database holds (its vocabulary included): the wings that decide verdicts and read
    figures import it, never the other way round (the arrow `compare/vocabulary.py` once ran back up)."""
    above = ("toolaudit.compare", "toolaudit.replay", "toolaudit.analysis", "toolaudit.report", "toolaudit.cli",
             "toolaudit.engines", "toolaudit.serve", "toolaudit.collect", "toolaudit.validate")
    graph = _imports(_modules())
    upward = sorted((m, t) for m, targets in graph.items() if m.startswith("toolaudit.store")
                    for t in targets if t.startswith(above))
    assert not upward, f"store modules importing wings above the store: {upward}"
