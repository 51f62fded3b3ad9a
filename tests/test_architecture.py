"""The shape of the product code, declared as data and checked.

The declarations come first: the core's layers (low to high), the order inside its packages, what the
entry points (spark_jobs/, dags/, plugins/) may import of each other, which frameworks each part never
imports. The checks follow: no import cycle, the root package imports nothing, every import points down
a declared order, stores do not know each other, nobody imports another module's ``_private`` names.
Every import statement counts, wherever it is (module level, inside a function, under TYPE_CHECKING): a
lazy import hides a dependency from the interpreter, not from a reader. The machinery is in
tests/support/architecture.py; a failure names the file, line, module, imported module and the rule.

To place a new module, add it to the layer it belongs to below (a test fails until every module is in
exactly one layer). To allow an import a rule forbids, declare it in ALLOWED, with the reason.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.support.architecture import (
    ON_PATH,
    PACKAGE,
    Allowed,
    Layer,
    Tree,
    Violation,
    check_core_imports_no_entry_point,
    check_entry_points,
    check_frameworks,
    check_imports_nothing,
    check_layers,
    check_module_cycles,
    check_package_cycles,
    check_private,
    cycles,
    defines_dag,
    placement,
    unused_allowances,
)

ROOT = Path(__file__).resolve().parents[1]

# -- where the product code lives ---------------------------------------------------------------------

CORE = "tieredcore"
AREAS = {
    CORE: PACKAGE,  # tieredcore/a/b.py is tieredcore.a.b
    "spark_jobs": PACKAGE,  # spark-submit ships the package; jobs import spark_jobs._jobkit
    "dags": ON_PATH,  # Airflow puts dags/ and plugins/ on sys.path: dags/tiered_common.py is tiered_common
    "plugins": ON_PATH,
}

# -- 1. the core's layers, low to high: a module imports its own layer or lower ones --------------------

CORE_LAYERS = (
    Layer("base", ("tieredcore", "tieredcore.errors", "tieredcore.model", "tieredcore.names",
                   "tieredcore.units", "tieredcore.clock", "tieredcore.fileio", "tieredcore.outcomes",
                   "tieredcore.reports", "tieredcore.run_totals", "tieredcore.usage")),
    Layer("formats", ("tieredcore.formats.*",)),
    # the three stores do not know each other
    Layer("stores", ("tieredcore.hot.*", "tieredcore.cold.*", "tieredcore.meta.*"), peers=True),
    Layer("settings", ("tieredcore.policy", "tieredcore.config", "tieredcore.pulsar_policies")),
    Layer("protocol", ("tieredcore.offload.*",)),
    Layer("topics", ("tieredcore.topic.*", "tieredcore.workspace", "tieredcore.attach")),
    Layer("the archive as data", ("tieredcore.query.*",)),
    Layer("jobs", ("tieredcore.lifecycle.*",)),
    Layer("cli", ("tieredcore.cli.*",)),
)

# -- 2. the order inside packages (names relative to the package; its __init__ sits above them all) -----

PACKAGE_LAYERS = {
    "tieredcore.formats": (
        Layer("constants and codecs", ("constants", "proto.*", "chunks", "compression", "keys", "native",
                                         "transform", "uuids")),
        Layer("metadata records and messages", ("trailer", "ledger_metadata", "messages", "mlinfo", "manifest", "topic_manifest",
                                                  "frame_ranges")),
        Layer("topic compaction's rules over messages", ("compacted",)),
        Layer("the index", ("index",)),
        Layer("blocks", ("block", "offsets")),
        Layer("segments", ("segment",)),
    ),
    "tieredcore.hot": (
        Layer("the tier seam, the byte format, file chores, a tier holding nothing",
              ("tier", "format", "files", "empty")),
        Layer("Pulsar's BookKeeper (attached: holds nothing), a read replica's (none)", ("bookkeeper", "replica"),
              peers=True),
        Layer("the local store's writer and read handle", ("writer", "handle"), peers=True),
        Layer("the local store", ("local",)),
    ),
    "tieredcore.cold": (
        Layer("the seam and its parts", ("blob", "chunk_cache", "client_settings", "drivers", "failures",
                                         "keyring", "requests")),
        Layer("locations and the store factory", ("location",)),
        Layer("guards over opened stores: liveness, read-only", ("liveness", "read_only")),
        Layer("the transformed store", ("transformed",)),
        # backends use the seam; the seam never imports a backend (one exception: ALLOWED)
        Layer("backends", ("backends", "backends.azure", "backends.cloud", "backends.fs",
                           "backends.fs_multipart", "backends.fs_util", "backends.gcs", "backends.s3"),
              peers=True,
              shared={"backends.azure": ("backends.cloud",),
                      "backends.gcs": ("backends.cloud",),
                      "backends.fs": ("backends.fs_util", "backends.fs_multipart"),
                      "backends.fs_multipart": ("backends.fs_util",)}),
    ),
    "tieredcore.meta": (
        Layer("the seam", ("store", "reasons")),
        Layer("records kept in a store, the read-only store", ("deletion_log", "leases", "managed_ledgers", "pulsar",
                                                                "read_only")),
        Layer("implementations", ("sqlite", "zookeeper"), peers=True),
    ),
    "tieredcore.offload": (
        Layer("records", ("context", "compacted_state")),
        Layer("the compare-and-set step", ("transaction",)),
        Layer("caches and ownership", ("buffers", "cache", "manifests", "ownership", "sidecar")),
        Layer("reading", ("reader",)),
        Layer("proving hot frames as they are read", ("frame_check",)),
        Layer("writing one ledger", ("offloader",)),
        Layer("segments", ("segments",)),
        Layer("checking and listing copies", ("copies", "message_audit", "verify")),
        Layer("what a compaction batch is", ("batches",)),
        Layer("jobs that write", ("compaction", "deletion", "managed", "streaming"), peers=True),
    ),
    "tieredcore.lifecycle": (
        Layer("plans and work items", ("drain_report", "planner", "shards", "work")),
        Layer("jobs", ("compaction", "drain", "keys", "reconcile.*", "recover", "retention", "scrub", "sweep",
                         "topic_compaction")),
        Layer("running jobs, the overview, read replicas", ("compaction_run", "overview", "recover_run", "replica",
                                                            "runner", "status", "topic_compaction_run")),
        Layer("settings of a run", ("compaction_settings",)),
        Layer("the Iceberg export", ("export",)),
        Layer("the attached cluster's view", ("attached_view",)),
    ),
    "tieredcore.query": (
        Layer("rows and statistics", ("rows", "stats"), peers=True),
        Layer("plans and reads", ("scan",)),
    ),
    "tieredcore.lifecycle.reconcile": (
        Layer("listing and references", ("listing", "references")),
        Layer("orphans", ("orphans",)),
        Layer("the report", ("report",)),
        Layer("the run", ("run",)),
    ),
    "tieredcore.cli": (
        Layer("shared", ("common", "workload")),
        Layer("commands", ("compact", "data", "deletions", "export", "init", "keys", "offload", "policies", "read",
                           "recover", "replica", "scrub", "topic_compaction", "topics", "verify_messages")),
        Layer("the entry", ("main",)),
    ),
}

# imports an order forbids, allowed where they are written, with the reason
ALLOWED = {
    "tieredcore.cold": (
        Allowed("tieredcore.cold.location", "tieredcore.cold.backends.*", inside="StoreLocation.open",
                why="the store factory opens the backend its URL names, importing it only then, so that a "
                    "backend's client library is needed only by the stores that use it"),
    ),
}

# -- 3. entry points: above the whole core; of each other they import only declared helpers ---------------

NOT_FOR_ENTRY_POINTS = ("tieredcore.cli.*",)  # the command line is an entry point too
SPARK_HELPERS = ("spark_jobs", "spark_jobs._jobkit", "spark_jobs._topic_shuffle", "spark_jobs.datasource")  # what a Spark job may import of the entry points
# every plugins/ module (they import each other freely)
PLUGINS = ("tiered_airflow", "tiered_hooks", "tiered_pages", "tiered_plugin", "tiered_report_pages", "tiered_timetables",
           "tiered_units", "tiered_views", "tiered_web")
PLUGINS_FOR_DAGS = ("tiered_airflow", "tiered_hooks", "tiered_timetables")  # the plugin modules DAG files use
# DAG helpers are the dags/ modules that define no DAG (defines_dag: no module-level `with ...:`, `DAG(...)`
# or `@dag`): DAG files and DAG helpers may import them; no module imports a DAG file.


def entry_point_imports(tree: Tree) -> dict[str, set[str]]:
    """Area -> the entry-point modules its modules may import."""
    dag_helpers = {m for m in tree.in_area("dags") if not defines_dag(tree, m)}
    return {"spark_jobs": set(SPARK_HELPERS), "dags": dag_helpers | set(PLUGINS_FOR_DAGS),
            "plugins": set(PLUGINS)}


# -- 4. frameworks: what each part never imports -----------------------------------------------------------

FRAMEWORKS = {
    CORE: ("airflow", "pyspark"),
    "spark_jobs": ("airflow",),  # Spark executors have no Airflow
    "dags": ("pyspark",),  # Airflow workers submit Spark jobs, they do not run Spark
    "plugins": ("pyspark",),
}

# -- the checks ------------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[Tree], list[Violation]]] = {
    "no import cycle between modules": check_module_cycles,
    "no import cycle between core packages": lambda t: check_package_cycles(t, CORE),
    "the root package imports nothing": lambda t: check_imports_nothing(t, CORE),
    "core layers": lambda t: check_layers(t, CORE_LAYERS, "core layers"),
    **{f"order inside {p}": (lambda t, p=p: check_layers(t, PACKAGE_LAYERS[p], f"order inside {p}", p,
                                                          ALLOWED.get(p, ())))
       for p in PACKAGE_LAYERS},
    "no private imports": check_private,
    "frameworks": lambda t: check_frameworks(t, FRAMEWORKS),
    "the core imports no entry point": lambda t: check_core_imports_no_entry_point(t, CORE),
    "entry points": lambda t: check_entry_points(t, CORE, entry_point_imports(t), NOT_FOR_ENTRY_POINTS),
}


def plugins_placement(tree: Tree) -> list[str]:
    found = tree.in_area("plugins")
    return ([f"plugins/ module {m} is not in PLUGINS: add it" for m in sorted(found - set(PLUGINS))]
            + [f"PLUGINS names {m}, which is no module of plugins/" for m in PLUGINS if m not in found])


PLACEMENTS: dict[str, Callable[[Tree], list[str]]] = {
    "core layers": lambda t: placement(t, CORE_LAYERS, area=CORE),
    **{f"order inside {p}": (lambda t, p=p: placement(t, PACKAGE_LAYERS[p], p)) for p in PACKAGE_LAYERS},
    "plugins": plugins_placement,
}


@cache
def tree_at(root: Path) -> Tree:
    return Tree.load(root, AREAS)


def repository() -> Tree:
    return tree_at(ROOT)


def report(found: list[Violation] | list[str]) -> str:
    return "\n".join(["", *map(str, found)])


@pytest.mark.parametrize("check", CHECKS)
def test_the_tree_keeps_the_rule(check):
    found = CHECKS[check](repository())
    assert not found, f"{check}: {len(found)} import(s) break the rule:{report(found)}"


@pytest.mark.parametrize("declaration", PLACEMENTS)
def test_every_module_is_placed_exactly_once(declaration):
    problems = PLACEMENTS[declaration](repository())
    assert not problems, f"{declaration}:{report(problems)}"


@pytest.mark.parametrize("package", ALLOWED)
def test_every_declared_exception_is_still_needed(package):
    unused = unused_allowances(repository(), PACKAGE_LAYERS[package], package, ALLOWED[package])
    assert not unused, f"no import needs these any more, remove them from ALLOWED: {unused}"


# -- the machinery sees what it must ----------------------------------------------------------------------


def test_the_walker_sees_modules_and_their_imports():
    tree = repository()
    graph = tree.graph()
    assert {"tieredcore.formats.index", "tieredcore.cold.location", "tieredcore.lifecycle.drain",
            "spark_jobs._jobkit", "tiered_common", "tiered_airflow"} <= set(graph)
    assert "tieredcore.cold.blob" in graph["tieredcore.cold.backends.fs"]
    assert "tieredcore.cold.location" in graph["tieredcore.config"]
    assert "spark_jobs._jobkit" in graph["spark_jobs.scrub"]
    assert {"tiered_common", "tiered_airflow"} <= graph["tiered_offload_topic"]
    # a function-level import, with the function it sits in
    opens = [i for i in tree.imports if i.importer == "tieredcore.cold.location" and "backends" in i.module]
    assert opens and {i.scope for i in opens} == {"StoreLocation.open"}


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_package_reexporting_its_children_is_not_a_cycle_but_a_child_importing_a_sibling_back_is():
    graph = repository().graph()
    assert "tieredcore.formats.block" in graph["tieredcore.formats"]  # the re-export
    assert "tieredcore.formats" not in graph["tieredcore.formats.block"]


def test_dag_files_and_dag_helpers_are_told_apart():
    tree = repository()
    dags = tree.in_area("dags")
    helpers = {m for m in dags if not defines_dag(tree, m)}
    assert "tiered_common" in helpers
    assert {"tiered_scrub", "tiered_offload_topic"} <= dags - helpers


# -- a planted violation in a copy of the tree fails its check ---------------------------------------------


@dataclass(frozen=True)
class Plant:
    check: str  # a key of CHECKS (or of PLACEMENTS when `placement`)
    file: str  # relative to the root; created when missing
    code: str  # appended to the file
    importer: str
    imported: str
    placement: bool = False


LAZY = "\n\ndef _planted() -> None:\n    {}\n"  # inside a function: lazy imports count as well
TYPING = "\n\nimport typing\n\nif typing.TYPE_CHECKING:\n    {}\n"  # and so do TYPE_CHECKING ones
NEW_MODULE = '"""A module no layer names."""\n'

PLANTS = {
    "a layer back-edge": Plant(
        "core layers", "tieredcore/formats/index.py",
        LAZY.format("from tieredcore.workspace import Workspace"),
        "tieredcore.formats.index", "tieredcore.workspace"),
    "a store importing another store": Plant(
        "core layers", "tieredcore/hot/tier.py",
        TYPING.format("from tieredcore.meta.store import MetadataStore"),
        "tieredcore.hot.tier", "tieredcore.meta.store"),
    "a back-edge inside a package": Plant(
        "order inside tieredcore.offload", "tieredcore/offload/context.py",
        LAZY.format("from tieredcore.offload.managed import TopicOffloader"),
        "tieredcore.offload.context", "tieredcore.offload.managed"),
    "a seam importing a backend outside the allowed place": Plant(
        "order inside tieredcore.cold", "tieredcore/cold/location.py",
        "\n\nfrom tieredcore.cold.backends.s3 import S3BlobStore\n",
        "tieredcore.cold.location", "tieredcore.cold.backends.s3"),
    "a backend importing another backend": Plant(
        "order inside tieredcore.cold", "tieredcore/cold/backends/s3.py",
        LAZY.format("from tieredcore.cold.backends.fs import FilesystemBlobStore"),
        "tieredcore.cold.backends.s3", "tieredcore.cold.backends.fs"),
    "an import cycle within a layer": Plant(
        "no import cycle between modules", "tieredcore/errors.py",
        LAZY.format("from tieredcore.model import FileSlice"), "tieredcore.errors", "tieredcore.model"),
    "a private name": Plant(
        "no private imports", "tieredcore/cli/read.py",
        LAZY.format("from tieredcore.names import _check_whole"),
        "tieredcore.cli.read", "tieredcore.names._check_whole"),
    "a private module from outside its package": Plant(
        "no private imports", "dags/tiered_common.py", LAZY.format("import spark_jobs._jobkit"),
        "tiered_common", "spark_jobs._jobkit"),
    "a Spark job importing another job": Plant(
        "entry points", "spark_jobs/scrub.py", LAZY.format("from spark_jobs.rotate_keys import main"),
        "spark_jobs.scrub", "spark_jobs.rotate_keys"),
    "a DAG file importing another DAG file": Plant(
        "entry points", "dags/tiered_scrub.py", LAZY.format("import tiered_retention"),
        "tiered_scrub", "tiered_retention"),
    "a plugin importing a DAG helper": Plant(
        "entry points", "plugins/tiered_web.py", LAZY.format("from tiered_common import JOBS_DIR"),
        "tiered_web", "tiered_common"),
    "an entry point importing the command line": Plant(
        "entry points", "spark_jobs/_jobkit.py", LAZY.format("from tieredcore.cli.common import err"),
        "spark_jobs._jobkit", "tieredcore.cli.common"),
    "the core importing an entry point": Plant(
        "the core imports no entry point", "tieredcore/reports.py", LAZY.format("import tiered_airflow"),
        "tieredcore.reports", "tiered_airflow"),
    "the core importing airflow": Plant(
        "frameworks", "tieredcore/units.py", LAZY.format("from airflow.sdk import DAG"),
        "tieredcore.units", "airflow.sdk"),
    "a Spark job importing airflow": Plant(
        "frameworks", "spark_jobs/scrub.py", TYPING.format("import airflow"), "spark_jobs.scrub", "airflow"),
    "the root package importing a module": Plant(
        "the root package imports nothing", "tieredcore/__init__.py", "\nfrom tieredcore import errors\n",
        "tieredcore", "tieredcore.errors"),
    "a new top-level module nobody placed": Plant(
        "core layers", "tieredcore/newcomer.py", NEW_MODULE, "tieredcore.newcomer", "", placement=True),
    "a new module in a package nobody placed": Plant(
        "order inside tieredcore.offload", "tieredcore/offload/newcomer.py", NEW_MODULE,
        "tieredcore.offload.newcomer", "", placement=True),
}


def planted_copy(tmp_path: Path, plant: Plant) -> Tree:
    for area in AREAS:
        shutil.copytree(ROOT / area, tmp_path / area, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / plant.file
    target.write_text((target.read_text() if target.exists() else "") + plant.code)
    return Tree.load(tmp_path, AREAS)


@pytest.mark.parametrize("name", PLANTS)
def test_a_planted_violation_fails_its_check(tmp_path, name):
    plant = PLANTS[name]
    copy = planted_copy(tmp_path, plant)
    if plant.placement:
        new = set(PLACEMENTS[plant.check](copy)) - set(PLACEMENTS[plant.check](repository()))
        assert [p for p in new if plant.importer in p], f"{plant.check} did not notice {plant.importer}"
        return
    # only what the plant adds: the check may already fail on the tree for other imports
    new = set(CHECKS[plant.check](copy)) - set(CHECKS[plant.check](repository()))
    hits = [v for v in new if v.importer == plant.importer and v.imported == plant.imported]
    assert hits, (f"{plant.check} did not notice {plant.importer} importing {plant.imported}; "
                  f"it found:{report(sorted(new))}")
    message = str(hits[0])
    assert plant.importer in message and plant.imported in message and plant.file in message
    assert hits[0].rule in message and hits[0].why
