"""The machinery behind tests/test_architecture.py: read every import statement of a source tree and check
declared rules over them.

Every import statement counts, wherever it is (module level, inside a function, under TYPE_CHECKING): a
lazy import hides a dependency from the interpreter, not from a reader. Each checker takes a loaded
`Tree`, so the same checks run over the repository and over a temporary copy with a planted import, and
returns `Violation`s that name the file, the line, the importing module, the imported module and the rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

GENERATED = "_pb2.py"  # protoc output: generated, never edited, not checked

PACKAGE = "package"  # an area whose directory is a package: tieredcore/a/b.py is tieredcore.a.b
ON_PATH = "on the path"  # an area whose directory is on sys.path (Airflow's dags/, plugins/): dags/x.py is x


# -- the declarations' types -------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """One layer of an ordered list, low to high: a module may import modules of its own layer or of a
    lower one, never of a higher one.

    A member is a module name (``tieredcore.errors``) or a name ending in ``.*`` for a module and every
    module under it (``tieredcore.cold.*``). In a package's own order the names are relative to the
    package (``backends.*`` in ``tieredcore.cold``)."""

    name: str
    members: tuple[str, ...]
    # peers: modules of different members of this layer must not import each other...
    peers: bool = False
    # ...except these: a member -> the members of this layer it may import (declared shared helpers)
    shared: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Allowed:
    """One import that a layer order forbids, allowed on purpose, and only where it is written."""

    importer: str
    imported: str  # a module name, or ``x.*`` for x and everything under it
    inside: str  # the qualified name of the function it must sit in ("" = anywhere in the module)
    why: str


# -- reading a tree -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str
    path: Path  # relative to the tree's root
    area: str  # the top directory it lives in (tieredcore, spark_jobs, dags, plugins)


@dataclass(frozen=True)
class Import:
    """One name brought in by an import statement (relative imports resolved)."""

    importer: str
    path: str
    line: int
    scope: str  # qualified name of the enclosing function or class; "" at module level
    module: str  # `import a.b` and `from a.b import c`: "a.b"
    name: str | None  # `from a.b import c`: "c"; `import a.b`: None


@dataclass(frozen=True)
class Edge:
    """`importer` executes `imported` (both modules of the tree) through the statement `via`."""

    importer: str
    imported: str
    via: Import


@dataclass(frozen=True, order=True)
class Violation:
    path: str
    line: int
    importer: str
    imported: str
    rule: str
    why: str  # what the rule says about this import and what to move

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported} -- [{self.rule}] {self.why}"


def module_name(relative: Path, how: str) -> str:
    parts = relative.with_suffix("").parts
    if how == ON_PATH:
        parts = parts[1:]  # the directory itself is on sys.path
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Imports(ast.NodeVisitor):
    """The import statements of one module, each with the function or class it sits in."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
        self.scope: list[str] = []
        self.found: list[Import] = []

    def _nested(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _nested

    def _add(self, node: ast.stmt, module: str, name: str | None) -> None:
        self.found.append(Import(self.module.name, self.module.path.as_posix(), node.lineno,
                                 ".".join(self.scope), module, name))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name, None)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            anchor = parts[: len(parts) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            self._add(node, base, alias.name)


@dataclass
class Tree:
    """The product code under `root`: its modules, by the name they are imported under, and every import."""

    root: Path
    modules: dict[str, Module]
    imports: list[Import]

    @classmethod
    def load(cls, root: Path, areas: Mapping[str, str]) -> Tree:
        modules: dict[str, Module] = {}
        for area, how in areas.items():
            for p in sorted((root / area).rglob("*.py")):
                if p.name.endswith(GENERATED) or "__pycache__" in p.parts:
                    continue
                rel = p.relative_to(root)
                m = Module(module_name(rel, how), rel, area)
                if m.name in modules:  # dags/ and plugins/ share one namespace on Airflow's path
                    raise ValueError(f"{rel} and {modules[m.name].path} are both module {m.name}")
                modules[m.name] = m
        imports: list[Import] = []
        for m in modules.values():
            visitor = _Imports(m)
            visitor.visit(ast.parse((root / m.path).read_text(), str(m.path)))
            imports.extend(visitor.found)
        return cls(root, modules, imports)

    def in_area(self, area: str) -> set[str]:
        return {name for name, m in self.modules.items() if m.area == area}

    @cached_property
    def edges(self) -> list[Edge]:
        """``import a.b.c`` executes a, a.b and a.b.c; ``from a import b`` executes a and, when a.b is a
        module, a.b. A module's own ancestor packages are not its dependencies (it always runs inside them,
        and a package __init__ may re-export its children)."""
        out: dict[tuple[str, str, int], Edge] = {}
        for imp in self.imports:
            candidates = [imp.module] + ([f"{imp.module}.{imp.name}"] if imp.name and imp.name != "*" else [])
            for c in candidates:
                parts = c.split(".")
                for i in range(1, len(parts) + 1):
                    m = ".".join(parts[:i])
                    if m in self.modules and m != imp.importer and not imp.importer.startswith(m + "."):
                        out.setdefault((imp.importer, m, imp.line), Edge(imp.importer, m, imp))
        return list(out.values())

    def graph(self) -> dict[str, set[str]]:
        g: dict[str, set[str]] = {m: set() for m in self.modules}
        for e in self.edges:
            g[e.importer].add(e.imported)
        return g


def _violation(e: Edge, rule: str, why: str) -> Violation:
    return Violation(e.via.path, e.via.line, e.importer, e.imported, rule, why)


def _deepest(found: Iterable[Violation]) -> list[Violation]:
    """`from a.b.c import x` executes the packages a.b and a.b.c: when both break the same rule on the same
    line, name only the module the statement is about."""
    found = set(found)
    return sorted(v for v in found if not any(
        w.imported.startswith(v.imported + ".") and (w.path, w.line, w.importer, w.rule) ==
        (v.path, v.line, v.importer, v.rule) for w in found))


# -- cycles -------------------------------------------------------------------------------------------


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
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
    return sorted(out)


def check_module_cycles(tree: Tree) -> list[Violation]:
    """Every import inside an import cycle, named with the whole cycle."""
    found = []
    for comp in cycles(tree.graph()):
        members = set(comp)
        for e in tree.edges:
            if e.importer in members and e.imported in members:
                found.append(_violation(e, "no import cycle", (
                    f"the modules {', '.join(comp)} import each other; "
                    "move what they share down into a module they all import")))
    return _deepest(found)


def package_of(module: str) -> str:
    """``tieredcore.cold.backends.s3`` -> ``tieredcore.cold``; a top-level module is its own node."""
    return ".".join(module.split(".")[:2])


def check_package_cycles(tree: Tree, area: str) -> list[Violation]:
    """No two packages (or top-level modules) of `area` import each other, through any of their modules.
    The root package's __init__ is skipped as a target: importing area.x always passes through it."""
    core = tree.in_area(area)
    graph: dict[str, set[str]] = {}
    for e in tree.edges:
        a, b = package_of(e.importer), package_of(e.imported)
        if e.importer in core and e.imported in core and a != b and b != area:
            graph.setdefault(a, set()).add(b)
    found = []
    for comp in cycles(graph):
        members = set(comp)
        for e in tree.edges:
            a, b = package_of(e.importer), package_of(e.imported)
            if a != b and a in members and b in members:
                found.append(_violation(e, "no import cycle between packages",
                                        f"the packages {', '.join(comp)} import each other; one of them must "
                                        "stop depending on the other (move the shared part down)"))
    return _deepest(found)


def check_imports_nothing(tree: Tree, module: str) -> list[Violation]:
    return [_violation(e, "the root package imports nothing",
                       "so that importing any module never executes another one by accident; "
                       "import it where it is used instead")
            for e in tree.edges if e.importer == module]


# -- layers -------------------------------------------------------------------------------------------


def matches(pattern: str, module: str) -> bool:
    if pattern.endswith(".*"):
        base = pattern[:-2]
        return module == base or module.startswith(base + ".")
    return module == pattern


def _absolute(package: str, name: str) -> str:
    return f"{package}.{name}" if package else name


def _scope(tree: Tree, package: str) -> set[str]:
    """The modules a layer order places: every core module (package ""), or every module strictly under
    `package` (the package's own __init__ sits above its modules: it may re-export them)."""
    if not package:
        return set(tree.modules)
    return {m for m in tree.modules if m.startswith(package + ".")}


def placement(tree: Tree, layers: Sequence[Layer], package: str = "", area: str | None = None) -> list[str]:
    """What is wrong with the declaration itself: a module no layer names, a module two members name, a
    member that names no module."""
    problems = []
    scope = _scope(tree, package)
    if area is not None:
        scope &= tree.in_area(area)
    members = [(layer.name, _absolute(package, p)) for layer in layers for p in layer.members]
    where = f"{package}'s order" if package else "the core layers"
    for m in sorted(scope):
        hits = [f"{name} ({pattern})" for name, pattern in members if matches(pattern, m)]
        if not hits:
            problems.append(f"{m} ({tree.modules[m].path}) is in no layer of {where}: add it to the layer it "
                            "belongs to (it may import that layer and lower ones)")
        elif len(hits) > 1:
            problems.append(f"{m} is in more than one layer of {where}: {', '.join(hits)}")
    for name, pattern in members:
        if not any(matches(pattern, m) for m in scope):
            problems.append(f"layer {name!r} of {where} names {pattern}, which is no module: "
                            "remove or rename it")
    return problems


def _where(layers: Sequence[Layer], package: str, module: str) -> tuple[int, str] | None:
    for i, layer in enumerate(layers):
        for p in layer.members:
            if matches(_absolute(package, p), module):
                return i, p
    return None


def _allowed(allowed: Iterable[Allowed], e: Edge) -> bool:
    return any(a.importer == e.importer and matches(a.imported, e.imported)
               and (not a.inside or e.via.scope == a.inside or e.via.scope.startswith(a.inside + "."))
               for a in allowed)


def check_layers(tree: Tree, layers: Sequence[Layer], rule: str, package: str = "",
                 allowed: Iterable[Allowed] = ()) -> list[Violation]:
    """Imports from a layer to a higher one, and between peers that are not declared shared helpers."""
    allowed = tuple(allowed)
    scope = _scope(tree, package)
    found = []
    for e in tree.edges:
        if e.importer not in scope or e.imported not in scope:
            continue
        a, b = _where(layers, package, e.importer), _where(layers, package, e.imported)
        if a is None or b is None or _allowed(allowed, e):
            continue  # unplaced modules are reported by placement()
        (ia, pa), (ib, pb) = a, b
        low, high = layers[ia], layers[ib]
        if ib > ia:
            where = [a.inside for a in allowed
                     if a.importer == e.importer and matches(a.imported, e.imported)]
            found.append(_violation(e, rule, (
                f"layer {low.name!r} may import its own layer or lower ones; {e.imported} is in the higher "
                f"layer {high.name!r}. Move what {e.importer} needs down to {low.name!r} or lower, or move "
                f"{e.importer} up"
                + (f" (ALLOWED permits it only inside {', '.join(where)})" if where else ""))))
        elif ia == ib and low.peers and pa != pb and pb not in low.shared.get(pa, ()):
            helpers = low.shared.get(pa, ())
            found.append(_violation(e, rule, (
                f"the members of layer {low.name!r} are peers that do not import each other"
                + (f" ({pa} may import only its declared helpers {', '.join(helpers)})" if helpers else "")
                + f"; move what {e.importer} needs from {e.imported} to a lower layer")))
    return _deepest(found)


def unused_allowances(tree: Tree, layers: Sequence[Layer], package: str,
                      allowed: Iterable[Allowed]) -> list[Allowed]:
    """Declared exceptions that no import needs any more (they would hide a future import)."""
    needed = {(v.importer, v.imported, v.line) for v in check_layers(tree, layers, "", package)}
    edges = [e for e in tree.edges if (e.importer, e.imported, e.via.line) in needed]
    return [a for a in allowed if not any(_allowed((a,), e) for e in edges)]


# -- private names ------------------------------------------------------------------------------------


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(importer: str, package: str) -> bool:
    return bool(package) and (importer == package or importer.startswith(package + "."))


def check_private(tree: Tree) -> list[Violation]:
    """No module imports another module's ``_private`` names, nor a ``_private`` module from outside the
    package it belongs to. A module's own names, and a package's own private modules, are its business."""
    rule = "no private imports"
    found = []
    for imp in tree.imports:
        parts = imp.module.split(".")
        for i, part in enumerate(parts):
            owner = ".".join(parts[:i])
            if is_private(part) and not _inside(imp.importer, owner):
                found.append(Violation(imp.path, imp.line, imp.importer, ".".join(parts[: i + 1]), rule, (
                    f"{part} is a private module of {owner or 'its top level'}; make it public (drop the "
                    f"underscore) or import what it offers through a public module")))
                break
        else:
            if imp.name is None or not is_private(imp.name):
                continue
            target = f"{imp.module}.{imp.name}"
            if target in tree.modules:
                if not _inside(imp.importer, imp.module):
                    found.append(Violation(imp.path, imp.line, imp.importer, target, rule, (
                        f"{imp.name} is a private module of {imp.module}; only modules inside {imp.module} "
                        "import it: make it public or import through a public module")))
            elif imp.importer != imp.module:
                found.append(Violation(imp.path, imp.line, imp.importer, target, rule, (
                    f"{imp.name} is a private name of {imp.module}; make it public there (drop the "
                    "underscore; if several modules share it, move it to a module that owns it)")))
    return sorted(set(found))


# -- frameworks and entry points ----------------------------------------------------------------------


def check_frameworks(tree: Tree, forbidden: Mapping[str, Sequence[str]]) -> list[Violation]:
    """`forbidden`: area -> top-level packages its modules never import."""
    found = []
    for imp in tree.imports:
        area = tree.modules[imp.importer].area
        for fw in forbidden.get(area, ()):
            if imp.module == fw or imp.module.startswith(fw + "."):
                rule = f"{area} imports no {fw}"
                found.append(Violation(imp.path, imp.line, imp.importer, imp.module, rule, (
                    f"{area}/ runs where {fw} may not be installed; move this code to the entry point that "
                    f"runs under {fw}")))
    return sorted(set(found))


def defines_dag(tree: Tree, module: str) -> bool:
    """A DAG file: at module level it opens a ``with ...:`` block (``with DAG(...)``, ``with
    tiered_dag(...)``), builds ``DAG(...)`` or decorates a function with ``@dag``."""
    body = ast.parse((tree.root / tree.modules[module].path).read_text()).body

    def named(node: ast.expr, names: set[str]) -> bool:
        node = node.func if isinstance(node, ast.Call) else node
        return (isinstance(node, ast.Name) and node.id in names) or (
            isinstance(node, ast.Attribute) and node.attr in names)

    for stmt in body:
        if isinstance(stmt, ast.With):
            return True
        if isinstance(stmt, ast.FunctionDef) and any(named(d, {"dag"}) for d in stmt.decorator_list):
            return True
        if isinstance(stmt, ast.Assign | ast.Expr) and isinstance(stmt.value, ast.Call) \
                and named(stmt.value, {"DAG"}):
            return True
    return False


def check_core_imports_no_entry_point(tree: Tree, core: str) -> list[Violation]:
    found = [_violation(e, "the core imports no entry point", (
        f"{tree.modules[e.imported].area}/ is above the core; move what {e.importer} needs into {core}/ "
        "(the entry point may then import it from there)"))
        for e in tree.edges
        if tree.modules[e.importer].area == core and tree.modules[e.imported].area != core]
    return _deepest(found)


def check_entry_points(tree: Tree, core: str, may_import: Mapping[str, set[str]],
                       not_for_entry_points: Sequence[str]) -> list[Violation]:
    """An entry point imports the core (except `not_for_entry_points`) and, of the entry points, only the
    modules `may_import[its area]` names (its declared helpers)."""
    found = []
    for e in tree.edges:
        area, target = tree.modules[e.importer].area, tree.modules[e.imported].area
        if area == core:
            continue
        if target == core:
            bad = [p for p in not_for_entry_points if matches(p, e.imported)]
            if bad:
                found.append(_violation(e, "entry points use the core below the CLI", (
                    f"{bad[0]} is the command line, an entry point like {area}/; move what {e.importer} "
                    "needs from it into the core layer below it")))
        elif e.imported not in may_import.get(area, set()):
            helpers = ", ".join(sorted(may_import.get(area, set()))) or "nothing"
            found.append(_violation(e, "entry points import only declared helpers", (
                f"{e.imported} ({target}/) is not a helper that {area}/ modules may import (they may import: "
                f"{helpers}); move what {e.importer} needs into a declared helper or into the core")))
    return _deepest(found)
