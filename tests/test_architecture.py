"""The shape of tieredcore/: dependencies point one way (no import cycle between modules or between
packages), and the core imports neither Airflow nor PySpark.

Every import statement counts, wherever it is (module level, inside a function, under TYPE_CHECKING):
a lazy import hides a cycle from the interpreter, not from a reader."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "tieredcore"
GENERATED = "_pb2.py"


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in CORE.rglob("*.py") if not p.name.endswith(GENERATED)}


def imported(path: Path, name: str, known: set[str]) -> Iterator[str]:
    """The modules of `known` that `path` (module `name`) imports; ``from a import b`` imports ``a``
    and, when ``a.b`` is a module, ``a.b``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            candidates = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for c in candidates:
            # `import a.b.c` executes a, a.b and a.b.c; a module's own ancestor packages are not its
            # dependencies (it always runs inside them: a package __init__ may re-export its children)
            parts = c.split(".")
            for i in range(1, len(parts) + 1):
                m = ".".join(parts[:i])
                if m in known and m != name and not name.startswith(m + "."):
                    yield m


def package_of(module: str) -> str:
    """``tieredcore.cold.backends.s3`` -> ``tieredcore.stores``; a top-level module is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def module_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: set(imported(p, m, known)) for m, p in mods.items()}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        for d in deps:
            a, b = package_of(m), package_of(d)
            # the root package's __init__ is empty: importing tieredcore.x passes through it
            if a != b and b != "tieredcore":
                out.setdefault(a, set()).add(b)
    return out


def test_the_walker_sees_modules_and_their_imports():
    graph = module_graph()
    assert {"tieredcore.formats.index", "tieredcore.cold.location", "tieredcore.lifecycle.drain"} <= set(graph)
    assert "tieredcore.cold.blob" in graph["tieredcore.cold.backends.fs"]
    assert "tieredcore.cold.location" in graph["tieredcore.config"]


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    assert cycles(module_graph()) == []


def test_no_import_cycle_between_packages():
    found = cycles(package_graph(module_graph()))
    assert found == [], f"packages that import each other: {found}"


def test_root_package_imports_nothing():
    """So that importing any tieredcore module never executes another one by accident."""
    assert module_graph()["tieredcore"] == set()


def test_a_package_reexporting_its_children_is_not_a_cycle_but_a_child_importing_a_sibling_back_is():
    graph = module_graph()
    assert "tieredcore.formats.block" in graph["tieredcore.formats"]  # the re-export
    assert "tieredcore.formats" not in graph["tieredcore.formats.block"]


@pytest.mark.parametrize("framework", ["airflow", "pyspark"])
def test_core_imports_no_framework(framework):
    offenders = []
    for m, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == framework or n.startswith(framework + ".") for n in names):
                offenders.append(m)
    assert offenders == []
