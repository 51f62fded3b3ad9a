"""Iceberg tables of offloaded messages (docs/export.md), written with pyiceberg (no JVM Iceberg).

One table per topic (layout ``topic``, the default) or per namespace (layout ``namespace``), in a pyiceberg
``SqlCatalog`` (default: SQLite in the workspace, ``<workspace>/iceberg/catalog.db``, warehouse
``<workspace>/iceberg/warehouse``; ``export_catalog_url`` / ``export_warehouse`` override them). Iceberg
namespace ``<tenant>_<namespace>`` and table ``<topic local name>`` (or ``messages``), each lowercased with
every character outside ``[a-z0-9_]`` written as ``_``. Columns: the message rows of tieredcore.query.rows
without ``tier`` (which copy a row was read from is no property of the message), plus a typed ``value``
struct when the namespace's export settings carry a JSON schema; partitioned by day(publish_time).

Unit of export: an offloaded ledger (sealed and fully offloaded: tieredcore.offload.context.is_offloaded)
closed at or before the run's logical time. Pieces of the open ledger already in segments wait for their
ledger to be sealed and fully offloaded.

Exactly once: the ledgers exported per topic live in the table's own properties
(``tiered.exported.<topic>`` = ``"0-41,45"``), set in the same Iceberg commit as the data files; the
commit also asserts the table's current snapshot, so an overlapping run's commit fails, reloads, and
leaves out (and redoes) every ledger the other run committed meanwhile. Files written but never committed
(a killed run) are never referenced; the next run of the table deletes them once older than the orphan age.

With a JSON schema, a message whose payload is not a JSON object matching it goes to ``<table>_dlq``
(lineage, payload and the error), never dropped. The DLQ table records its own exported ledgers; it is
committed before the main table, so a kill in between leaves the ledger to be redone for the main table
only (its DLQ rows are not written twice).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tieredcore.config import Config
from tieredcore.errors import TieredError, ValidationError
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.context import is_offloaded
from tieredcore.query import rows as qrows
from tieredcore.query.scan import ScanFilter, ScanPart, epoch_us, pack_parts, plan_scan, read_part
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

LAYOUTS = ("topic", "namespace")
TYPES = ("string", "long", "double", "boolean", "timestamp")
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
DEFAULT_SNAPSHOTS_KEPT = 10
DEFAULT_ORPHAN_AGE_S = 3600.0
SETTINGS_ROOT = "/tiered/export-settings"
EXPORTED_PREFIX = "tiered.exported."
NAMESPACE_TABLE = "messages"
DLQ_SUFFIX = "_dlq"
CURRENT_FILES = "current_files.json"
MAX_COMMIT_ATTEMPTS = 10
MAX_ROUNDS = 5

_ARROW = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
          "timestamp": qrows.TS}


# -- settings -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSettings:
    """A namespace's export settings (one JSON record per namespace in the metadata store)."""

    layout: str = "topic"
    schema: dict[str, str] | None = None  # field -> type (TYPES); None: no value column, no DLQ
    required: tuple[str, ...] = ()
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    snapshots_kept: int = DEFAULT_SNAPSHOTS_KEPT

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValidationError(f"export layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if isinstance(self.target_file_size, bool) or not isinstance(self.target_file_size, int) \
                or self.target_file_size < 1024:
            raise ValidationError(f"export target file size must be >= 1024 bytes, got {self.target_file_size!r}")
        if isinstance(self.snapshots_kept, bool) or not isinstance(self.snapshots_kept, int) \
                or self.snapshots_kept < 1:
            raise ValidationError(f"export snapshots kept must be >= 1, got {self.snapshots_kept!r}")
        if self.schema is not None:
            parse_schema({"properties": self.schema, "required": list(self.required)})

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["required"] = list(self.required)
        return d

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> ExportSettings:
        return cls(layout=d.get("layout", "topic"), schema=d.get("schema"), required=tuple(d.get("required") or ()),
                   target_file_size=int(d.get("target_file_size", DEFAULT_TARGET_FILE_SIZE)),
                   snapshots_kept=int(d.get("snapshots_kept", DEFAULT_SNAPSHOTS_KEPT)))


_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_schema(doc: object) -> tuple[dict[str, str], tuple[str, ...]]:
    """A JSON schema as (field -> type, required fields). Either ``{"field": "type", ...}`` or JSON Schema's
    ``{"type": "object", "properties": {"field": {"type": ...}}, "required": [...]}``; types: string, long
    (JSON Schema's integer), double (number), boolean, timestamp (ISO 8601 text or epoch ms)."""
    if not isinstance(doc, dict) or not doc:
        raise ValidationError("export schema must be a non-empty JSON object of field name -> type")
    props: object = doc.get("properties") if "properties" in doc else doc
    required: object = doc.get("required", []) if "properties" in doc else []
    if not isinstance(props, dict) or not props:
        raise ValidationError("export schema: 'properties' must be a non-empty object of field name -> type")
    out: dict[str, str] = {}
    for name, spec in props.items():
        t = spec.get("type") if isinstance(spec, dict) else spec
        if isinstance(spec, dict) and spec.get("format") in ("date-time", "timestamp"):
            t = "timestamp"
        t = {"integer": "long", "number": "double", "int": "long", "float": "double", "bool": "boolean"}.get(t, t) \
            if isinstance(t, str) else t
        if not isinstance(name, str) or not _FIELD.match(name):
            raise ValidationError(f"export schema: field name {name!r} must match [A-Za-z_][A-Za-z0-9_]*")
        if t not in TYPES:
            raise ValidationError(f"export schema: field {name!r} has type {t!r}; one of {', '.join(TYPES)}")
        out[name] = t
    if not isinstance(required, list) or any(r not in out for r in required):
        raise ValidationError(f"export schema: 'required' must list fields of the schema, got {required!r}")
    return out, tuple(required)


def settings_path(ns: NamespaceName) -> str:
    return f"{SETTINGS_ROOT}/{ns.tenant}/{ns.namespace}"


def load_settings(ws: Workspace, ns: str | NamespaceName) -> ExportSettings:
    v = ws.metadata.get(settings_path(NamespaceName.parse(ns)))
    if v is None:
        return ExportSettings()
    try:
        return ExportSettings.of(json.loads(bytes(v.value)))
    except (ValueError, TypeError, AttributeError) as e:
        raise ValidationError(f"export settings of {ns} do not parse: {e}") from None


def save_settings(ws: Workspace, ns: str | NamespaceName, s: ExportSettings) -> None:
    ws.metadata.set(settings_path(NamespaceName.parse(ns)), json.dumps(s.as_dict(), sort_keys=True).encode())


# -- ledger sets as text ----------------------------------------------------------------------------------------


def range_text(ids: Iterable[int]) -> str:
    """Ledger ids as a compact range list: ``0-41,45``."""
    out: list[str] = []
    s = sorted(set(ids))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


def parse_ranges(text: str) -> set[int]:
    out: set[int] = set()
    for piece in filter(None, (p.strip() for p in (text or "").split(","))):
        lo, _, hi = piece.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


# -- names and the catalog --------------------------------------------------------------------------------------


def sanitize(text: str) -> str:
    s = re.sub(r"[^a-z0-9_]", "_", text.lower())
    return s if s and not s[0].isdigit() else f"t_{s}"


def iceberg_namespace(ns: NamespaceName) -> str:
    return sanitize(f"{ns.tenant}_{ns.namespace}")


def table_ident(topic: TopicName, layout: str) -> tuple[str, str]:
    ns = NamespaceName(topic.tenant, topic.namespace)
    return iceberg_namespace(ns), NAMESPACE_TABLE if layout == "namespace" else sanitize(topic.local_name)


def catalog_location(config: Config) -> tuple[str, str]:
    """(SQLAlchemy URL of the catalog, warehouse URL): the configuration's, else SQLite and a directory
    next to the workspace's SQLite metadata store."""
    url, wh = config.export_catalog_url, config.export_warehouse
    if url and wh:
        return url, wh
    u = urlparse(config.metadata_url)
    if u.scheme != "sqlite":
        raise ValidationError("no Iceberg catalog: set export_catalog_url and export_warehouse in the configuration "
                              "(TIERED_EXPORT_CATALOG_URL, TIERED_EXPORT_WAREHOUSE): the metadata store is not a "
                              "workspace's SQLite file")
    root = Path(unquote(u.path)).parent / "iceberg"
    return url or f"sqlite:///{root / 'catalog.db'}", wh or f"file://{root / 'warehouse'}"


def open_catalog(config: Config):
    from pyiceberg.catalog.sql import SqlCatalog

    url, wh = catalog_location(config)
    if wh.startswith("file://"):
        Path(unquote(urlparse(wh).path)).mkdir(parents=True, exist_ok=True)
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(5):
        try:
            return SqlCatalog("tiered", uri=url, warehouse=wh)
        except Exception as e:  # two runs creating a new catalog's own tables at once: the other one won
            if "already exists" not in str(e) or attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def value_type(settings: ExportSettings) -> pa.StructType | None:
    if settings.schema is None:
        return None
    return pa.struct([pa.field(n, _ARROW[t]) for n, t in settings.schema.items()])


def table_schema(settings: ExportSettings) -> pa.Schema:
    fields = [f for f in qrows.MESSAGE_SCHEMA if f.name != "tier"]
    vt = value_type(settings)
    return pa.schema(fields + ([pa.field("value", vt)] if vt is not None else []))


DLQ_SCHEMA = pa.schema([qrows.MESSAGE_SCHEMA.field(n) for n in
                        ("topic", "ledger_id", "entry_id", "batch_index", "publish_time", "payload")]
                       + [pa.field("error", pa.string())])


def _create(catalog, ident: tuple[str, str], schema: pa.Schema):
    from pyiceberg.exceptions import (
        CommitFailedException,
        NamespaceAlreadyExistsError,
        NoSuchTableError,
        TableAlreadyExistsError,
    )
    from pyiceberg.transforms import DayTransform

    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        pass
    try:
        catalog.create_namespace(ident[0])
    except NamespaceAlreadyExistsError:
        pass
    except Exception:  # two runs creating it at once: the SQL catalog's unique key refused the second
        if (ident[0],) not in catalog.list_namespaces():
            raise

    try:
        # no retries inside pyiceberg: a retry would re-apply our files on top of a concurrent commit whose
        # exported ledgers we have not seen (commit_table reloads and decides again instead)
        txn = catalog.create_table_transaction(ident, schema, properties={"commit.retry.num-retries": "0"})
        with txn.update_spec() as spec:
            spec.add_field("publish_time", DayTransform(), "publish_day")
        txn.commit_transaction()
    except (TableAlreadyExistsError, CommitFailedException):
        pass  # an overlapping run created it (the SQL catalog says so with either)
    return catalog.load_table(ident)


def _load(catalog, ident: tuple[str, str]):
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        return None


def exported(table, topic: str) -> set[int]:
    return set() if table is None else parse_ranges(table.properties.get(EXPORTED_PREFIX + topic, ""))


def _fs_path(location: str) -> Path | None:
    u = urlparse(location)
    return Path(unquote(u.path)) if u.scheme in ("file", "") else None


# -- planning --------------------------------------------------------------------------------------------------


@dataclass
class TableWork:
    """One table's work in a run: the ledgers of its topics to export and their parts."""

    namespace: str  # tenant/ns
    ident: tuple[str, str]
    settings: ExportSettings
    ledgers: dict[str, list[int]]  # topic -> ledger ids to export
    parts: list[ScanPart] = field(default_factory=list)
    dlq_skip: dict[str, list[int]] = field(default_factory=dict)  # ledgers whose DLQ rows are committed
    location: str = ""
    dlq_location: str = ""
    already: int = 0  # ledgers eligible but exported before

    @property
    def name(self) -> str:
        return ".".join(self.ident)

    @property
    def dlq_ident(self) -> tuple[str, str] | None:
        return None if self.settings.schema is None else (self.ident[0], self.ident[1] + DLQ_SUFFIX)

    @property
    def ledger_count(self) -> int:
        return sum(len(v) for v in self.ledgers.values())

    @property
    def bytes(self) -> int:
        return sum(p.size for p in self.parts)


@dataclass
class ExportPlan:
    as_of_ms: int
    tables: list[TableWork]
    waiting: int = 0  # ledgers not yet eligible (open, not fully offloaded, or closed after the logical time)


def eligible_ledgers(ws: Workspace, topic: TopicName, as_of_ms: int) -> tuple[list[int], int]:
    info, _ = ws.ml.get_topic(topic)
    ok, waiting = [], 0
    for li in info.ledgerInfo:
        if is_offloaded(li) and 0 < li.timestamp <= as_of_ms:
            ok.append(li.ledgerId)
        else:
            waiting += 1
    return ok, waiting


def plan_export(ws: Workspace, catalog, topics: Sequence[TopicName], as_of_ms: int, *,
                create: bool = True, part_bytes: int | None = None) -> ExportPlan:
    """Per table: the eligible ledgers of its topics not yet in its exported set, and their parts.
    ``create``: tables (and their namespaces) are created now (a dry run creates nothing)."""
    plan = ExportPlan(as_of_ms, [])
    by_table: dict[tuple[str, str], TableWork] = {}
    settings: dict[str, ExportSettings] = {}
    opened: dict[tuple[str, str], tuple[Any, Any]] = {}
    for t in topics:
        ns = f"{t.tenant}/{t.namespace}"
        if ns not in settings:
            settings[ns] = load_settings(ws, ns)
        s = settings[ns]
        ident = table_ident(t, s.layout)
        w = by_table.get(ident)
        if w is None:
            tbl = _create(catalog, ident, table_schema(s)) if create else _load(catalog, ident)
            dlq = None
            if s.schema is not None:
                dident = (ident[0], ident[1] + DLQ_SUFFIX)
                dlq = _create(catalog, dident, DLQ_SCHEMA) if create else _load(catalog, dident)
            w = by_table[ident] = TableWork(ns, ident, s, {}, location=tbl.location() if tbl else "",
                                            dlq_location=dlq.location() if dlq else "")
            opened[ident] = (tbl, dlq)
        tbl, dlq = opened[ident]
        ok, waiting = eligible_ledgers(ws, t, as_of_ms)
        plan.waiting += waiting
        done = exported(tbl, t.full)
        todo = [lid for lid in ok if lid not in done]
        w.already += len(ok) - len(todo)
        if not todo:
            continue
        w.ledgers[t.full] = todo
        skip = exported(dlq, t.full) & set(todo)
        if skip:
            w.dlq_skip[t.full] = sorted(skip)
        target = part_bytes or s.target_file_size
        w.parts += plan_scan(ws, [t], ScanFilter(ledger_in=frozenset(todo)), part_bytes=target).parts
    plan.tables = [w for w in by_table.values() if w.ledgers or w.already]
    return plan


def ensure_tables(catalog, plan: ExportPlan) -> None:
    """Create the plan's tables (and DLQ tables) that do not exist yet and fill in their locations: a job
    plans with ``create=False`` (its plan only reads) and creates them once its checks passed. A table an
    overlapping run created meanwhile is loaded; its exported ledgers are seen at the commit."""
    for w in plan.tables:
        if not w.location:
            w.location = _create(catalog, w.ident, table_schema(w.settings)).location()
        if w.dlq_ident and not w.dlq_location:
            w.dlq_location = _create(catalog, w.dlq_ident, DLQ_SCHEMA).location()


# -- writing (executors, or the CLI in-process) -----------------------------------------------------------------


def write_tasks(work: TableWork, run_id: str) -> list[dict[str, Any]]:
    """The table's parts in bins of up to its target file size: one write task each (a Spark element)."""
    bins = pack_parts(work.parts, work.settings.target_file_size)
    return [{"table": work.name, "location": work.location, "dlq_location": work.dlq_location,
             "settings": work.settings.as_dict(), "run_id": run_id, "task": i,
             "parts": [asdict(p) for p in b], "dlq_skip": {k: list(v) for k, v in work.dlq_skip.items()}}
            for i, b in enumerate(bins) if b]


def _ts_value(v: object) -> int:
    if isinstance(v, bool):
        raise ValueError("a boolean is no timestamp")
    if isinstance(v, int):
        us = v * 1000
    elif isinstance(v, str):
        us = epoch_us(datetime.fromisoformat(v.replace("Z", "+00:00")))  # no zone: UTC
    else:
        raise ValueError(f"{v!r} is no timestamp")
    if not -2**63 <= us < 2**63:
        raise ValueError(f"{v!r} is out of the timestamp range")
    return us


def _utf8(v: object) -> bool:
    try:
        return isinstance(v, str) and bool(v.encode("utf-8") or True)
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") parses as JSON but is no text
        return False


_CHECK: dict[str, Callable[[object], bool]] = {
    "string": _utf8,
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63,
    "double": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def parse_value(payload: bytes | None, schema: Mapping[str, str], required: Sequence[str]) -> dict[str, Any]:
    """The payload as the schema's typed value; ValueError says why it does not match."""
    try:
        doc = json.loads(payload or b"")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {type(doc).__name__}")
    out: dict[str, Any] = {}
    for name, t in schema.items():
        v = doc.get(name)
        if v is None:
            if name in required:
                raise ValueError(f"required field {name!r} missing")
            out[name] = None
        elif t == "timestamp":
            try:
                out[name] = _ts_value(v)
            except (ValueError, OverflowError) as e:
                raise ValueError(f"field {name!r}: {e}") from None
        elif not _CHECK[t](v):
            raise ValueError(f"field {name!r}: {v!r} is not a {t}")
        else:
            out[name] = float(v) if t == "double" else v
    return out


ROW_GROUP_BYTES = 64 * 2**20  # Arrow bytes gathered per day before a Parquet row group is written


def _days(col: pa.ChunkedArray) -> tuple[pa.Array | pa.ChunkedArray, list[Any]]:
    """Each row's publish day, and the distinct days (as ``YYYY-MM-DD`` strings, the partition's value):
    a cast to date32 (vectorised); strftime when a time is null or outside years 1..9999 (where a date
    does not print that way)."""
    if not col.null_count:
        lo, hi = pc.min_max(col).values()
        if lo.is_valid and lo.value >= _MIN_US and hi.value < _MAX_US:
            dates = pc.cast(col, pa.date32())
            return dates, [d.isoformat() for d in pc.unique(dates).to_pylist()]
    days = pc.strftime(col, format="%Y-%m-%d", locale="C")
    return days, pc.unique(days).to_pylist()


_MIN_US = -62135596800 * 10**6  # 0001-01-01T00:00:00Z
_MAX_US = 253402300800 * 10**6  # 10000-01-01T00:00:00Z


class _Files:
    """Parquet files of one table in a task: one open file per day (a file holds one partition, so
    pyiceberg's add_files can tell its partition), rolled over at the target size. Rows are gathered per
    day and written in row groups of about ROW_GROUP_BYTES (a row group per read batch would be small)."""

    def __init__(self, location: str, schema: pa.Schema, run_id: str, task: int, target: int) -> None:
        self.location, self.schema, self.run_id, self.task, self.target = location, schema, run_id, task, target
        self.open: dict[str, tuple[pq.ParquetWriter, str, dict[str, Any]]] = {}
        self.pending: dict[str, list[pa.Table]] = {}
        self.pending_bytes: dict[str, int] = {}
        self.done: list[dict[str, Any]] = []

    def add(self, table: pa.Table, topic: str, ledger: int) -> None:
        if not table.num_rows:
            return
        days, distinct = _days(table.column("publish_time"))
        for day in distinct:
            if len(distinct) == 1:
                part = table
            elif day is None:  # a publish time no timestamp holds: those rows together, never dropped
                part = table.filter(pc.is_null(days))
            elif days.type == pa.date32():
                part = table.filter(pc.equal(days, pa.scalar(date.fromisoformat(day), pa.date32())))
            else:
                part = table.filter(pc.equal(days, day))
            self._write(str(day), part, topic, ledger)

    def _write(self, day: str, part: pa.Table, topic: str, ledger: int) -> None:
        if day not in self.open:
            path = f"{self.location}/data/publish_day={day}/{self.run_id}-{self.task}-{uuid.uuid4().hex[:12]}.parquet"
            local = _fs_path(path)
            if local is not None:
                local.parent.mkdir(parents=True, exist_ok=True)
            w = pq.ParquetWriter(str(local) if local is not None else path, self.schema, compression="zstd")
            self.open[day] = (w, path, {"path": path, "rows": 0, "arrow_bytes": 0, "ledgers": set()})
        w, path, rec = self.open[day]
        self.pending.setdefault(day, []).append(part)
        self.pending_bytes[day] = self.pending_bytes.get(day, 0) + part.nbytes
        rec["rows"] += part.num_rows
        rec["arrow_bytes"] += part.nbytes
        rec["ledgers"].add((topic, ledger))
        if rec["arrow_bytes"] >= self.target:
            self._close(day)
        elif self.pending_bytes[day] >= ROW_GROUP_BYTES:
            self._flush(day)

    def _flush(self, day: str) -> None:
        parts = self.pending.pop(day, [])
        self.pending_bytes.pop(day, None)
        if parts:
            self.open[day][0].write_table(pa.concat_tables(parts).cast(self.schema), row_group_size=2**31 - 1)

    def _close(self, day: str) -> None:
        self._flush(day)
        w, path, rec = self.open.pop(day)
        w.close()
        local = _fs_path(path)
        rec["bytes"] = local.stat().st_size if local is not None else rec["arrow_bytes"]
        rec["ledgers"] = sorted(rec["ledgers"])
        self.done.append(rec)

    def close(self) -> list[dict[str, Any]]:
        for day in list(self.open):
            self._close(day)
        return self.done


def run_write_task(config: Config, task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Read a task's parts and write the table's (and the DLQ's) Parquet files. One record per file
    written (``kind`` main or dlq) and per ledger that failed to read (``kind`` failed): nothing is
    committed here."""
    s = ExportSettings.of(task["settings"])
    main = _Files(task["location"], table_schema(s), task["run_id"], task["task"], s.target_file_size)
    dlq = _Files(task["dlq_location"], DLQ_SCHEMA, task["run_id"], task["task"], s.target_file_size) \
        if s.schema is not None else None
    skip = {(t, lid) for t, lids in task["dlq_skip"].items() for lid in lids}
    vt = value_type(s)
    out: list[dict[str, Any]] = []
    failed: set[tuple[str, int]] = set()
    with Workspace(config) as ws:
        for d in task["parts"]:
            part = ScanPart(**d)
            key = (part.topic, part.ledger_id)
            if key in failed:
                continue
            try:
                for batch in read_part(ws, part, record_stats=False):
                    tbl = pa.Table.from_batches([batch]).drop_columns(["tier"])
                    if vt is None:
                        main.add(tbl, *key)
                        continue
                    values, bad, errors = [], [], []
                    for i, p in enumerate(tbl.column("payload").to_pylist()):
                        try:
                            values.append(parse_value(p, s.schema or {}, s.required))
                        except ValueError as e:
                            values.append(None)
                            bad.append(i)
                            errors.append(str(e)[:500])
                    good = tbl.append_column("value", pa.array(values, vt))
                    if bad:
                        mask = pa.array([v is not None for v in values])
                        good = good.filter(mask)
                        if dlq is not None and key not in skip:
                            rej = tbl.take(pa.array(bad)).select(DLQ_SCHEMA.names[:-1])
                            dlq.add(rej.append_column("error", pa.array(errors, pa.string())), *key)
                    main.add(good, *key)
            except TieredError as e:
                failed.add(key)
                out.append({"kind": "failed", "topic": part.topic, "ledger": part.ledger_id, "error": str(e)})
    out += [{"kind": "main", **r} for r in main.close()]
    if dlq is not None:
        out += [{"kind": "dlq", **r} for r in dlq.close()]
    for r in out:
        r["table"] = task["table"]
        if "ledgers" in r:
            r["ledgers"] = [list(x) for x in r["ledgers"]]
    return out


# -- committing (the driver) -----------------------------------------------------------------------------------


def before_commit(table: str) -> None:
    """A seam for tests: runs just before a table's commit (a kill or an overlapping run goes here)."""


@dataclass
class TableResult:
    table: str
    namespace: str
    ledgers: int = 0  # committed this run
    rows: int = 0
    bytes: int = 0
    files: int = 0
    dlq_rows: int = 0
    snapshot_id: int | None = None
    dlq_snapshot_id: int | None = None
    already: int = 0
    conflicts: int = 0
    redone: int = 0
    failed: list[str] = field(default_factory=list)
    orphans_deleted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _closure(files: list[dict[str, Any]], seeds: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Ledgers that cannot be committed: the seeds, and every ledger sharing a file with one (a file is
    added whole or not at all)."""
    out = set(seeds)
    grew = True
    while grew:
        grew = False
        for f in files:
            ls = {tuple(x) for x in f["ledgers"]}
            if ls & out and not ls <= out:
                out |= ls
                grew = True
    return out


def _commit(tbl, files: list[str], ledgers: dict[str, set[int]], run_id: str) -> int | None:
    """One Iceberg commit on ``tbl`` as loaded when the run decided what to add: the files and the exported
    ledgers, asserting that snapshot (CommitFailedException when another commit came in between). The new
    snapshot id."""
    from pyiceberg.table.update import AssertRefSnapshotId

    base = tbl.metadata.current_snapshot_id
    props = {EXPORTED_PREFIX + t: range_text(exported(tbl, t) | ids) for t, ids in ledgers.items() if ids}
    txn = tbl.transaction()
    txn._apply((), (AssertRefSnapshotId(snapshot_id=base, ref="main"),))
    if props:
        txn.set_properties(props)
    if files:
        txn.add_files(files, snapshot_properties={"tiered.run": run_id}, check_duplicate_files=False)
    out = txn.commit_transaction()
    return out.metadata.current_snapshot_id


def _ledger_map(keys: Iterable[tuple[str, int]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for t, lid in keys:
        out.setdefault(t, set()).add(lid)
    return out


def commit_table(catalog, work: TableWork, records: list[dict[str, Any]], run_id: str,
                 result: TableResult) -> set[tuple[str, int]]:
    """Commit a table's written files (the DLQ's first); returns the ledgers to redo (their files were
    dropped: another run committed a ledger sharing a file with them meanwhile)."""
    from pyiceberg.exceptions import CommitFailedException

    planned = {(t, lid) for t, lids in work.ledgers.items() for lid in lids}
    failed = {(r["topic"], r["ledger"]) for r in records if r["kind"] == "failed"}
    result.failed += [f"{t} ledger {lid}: {r['error']}" for r in records if r["kind"] == "failed"
                      for t, lid in [(r["topic"], r["ledger"])]]
    mains = [r for r in records if r["kind"] == "main"]
    dlqs = [r for r in records if r["kind"] == "dlq"]
    dlq_committed = False
    for attempt in range(MAX_COMMIT_ATTEMPTS):
        tbl = catalog.load_table(work.ident)
        done = {(t, lid) for t in work.ledgers for lid in exported(tbl, t)} & planned
        seeds = done | failed
        dtbl = catalog.load_table(work.dlq_ident) if work.dlq_ident else None
        if dtbl is not None and not dlq_committed:  # DLQ rows of a ledger committed meanwhile: not twice
            ddone = {(t, lid) for t in work.ledgers for lid in exported(dtbl, t)}
            seeds |= {tuple(x) for f in dlqs for x in f["ledgers"] if tuple(x) in ddone}  # type: ignore[misc]
        out = _closure(mains + ([] if dlq_committed else dlqs), seeds)
        commit = planned - out
        redo = out - done - failed
        keep = [f for f in mains if not {tuple(x) for x in f["ledgers"]} & out]
        before_commit(work.name)
        try:
            if dtbl is not None and not dlq_committed:
                dkeep = [f for f in dlqs if not {tuple(x) for x in f["ledgers"]} & out]
                result.dlq_snapshot_id = _commit(dtbl, [f["path"] for f in dkeep], _ledger_map(commit), run_id)
                result.dlq_rows += sum(f["rows"] for f in dkeep)
                dlq_committed = True
                _drop([f for f in dlqs if f not in dkeep])
            result.snapshot_id = _commit(tbl, [f["path"] for f in keep], _ledger_map(commit), run_id)
        except CommitFailedException as e:
            result.conflicts += 1
            log.info("%s: commit conflict (attempt %d), reloading: %s", work.name, attempt + 1, e)
            continue
        result.ledgers += len(commit)
        result.rows += sum(f["rows"] for f in keep)
        result.bytes += sum(f["bytes"] for f in keep)
        result.files += len(keep)
        _drop([f for f in mains if f not in keep])
        return redo
    raise TieredError(f"{work.name}: {MAX_COMMIT_ATTEMPTS} commit attempts lost to concurrent commits")


def _drop(files: list[dict[str, Any]]) -> None:
    """Files this run wrote and will not commit: never referenced, deleted now."""
    for f in files:
        p = _fs_path(f["path"])
        if p is not None:
            p.unlink(missing_ok=True)


def after_commit(catalog, ident: tuple[str, str], keep: int, orphan_age_s: float) -> int:
    """Expire snapshots beyond the newest ``keep``, delete data files no snapshot references (older than
    ``orphan_age_s``: an overlapping run may be writing files it has not committed yet), and write the
    current snapshot's data files to ``<table location>/current_files.json``. Returns orphans deleted."""
    from pyiceberg.exceptions import CommitFailedException

    tbl = catalog.load_table(ident)
    snaps = sorted(tbl.metadata.snapshots, key=lambda s: s.timestamp_ms)
    old = [s.snapshot_id for s in snaps[:-keep]] if len(snaps) > keep else []
    current = tbl.metadata.current_snapshot_id
    old = [s for s in old if s != current]
    if old:
        try:
            tbl.maintenance.expire_snapshots().by_ids(old).commit()
        except CommitFailedException:
            log.info("%s: snapshot expiry lost to a concurrent commit (the next run expires them)", ident)
        tbl = catalog.load_table(ident)
    files = sorted(t.file.file_path for t in tbl.scan().plan_files()) if tbl.metadata.current_snapshot_id else []
    root = _fs_path(tbl.location())
    deleted = 0
    if root is not None:
        referenced = {str(_fs_path(f)) for f in files}
        now = time.time()
        for p in (root / "data").rglob("*.parquet") if (root / "data").is_dir() else ():
            if str(p) not in referenced and now - p.stat().st_mtime >= orphan_age_s:
                p.unlink(missing_ok=True)
                deleted += 1
        doc = {"table": ".".join(ident), "snapshot_id": tbl.metadata.current_snapshot_id, "files": files}
        tmp = root / f".{CURRENT_FILES}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(root / CURRENT_FILES)
    return deleted


def current_files(catalog, ident: tuple[str, str]) -> list[str]:
    """The data files ``current_files.json`` lists (readable by spark.read.parquet without Iceberg)."""
    root = _fs_path(catalog.load_table(ident).location())
    if root is None or not (root / CURRENT_FILES).exists():
        return []
    return json.loads((root / CURRENT_FILES).read_text())["files"]


Writer = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def local_writer(config: Config) -> Writer:
    def write(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for t in tasks for r in run_write_task(config, t)]

    return write


def run_export(config: Config, catalog, plan: ExportPlan, write: Writer, *, run_id: str | None = None,
               orphan_age_s: float = DEFAULT_ORPHAN_AGE_S,
               progress: Callable[[str], None] | None = None) -> list[TableResult]:
    """Write every table's files (``write``: in-process, or distributed by Spark), commit per table,
    redo the ledgers a concurrent commit forced out (a few rounds), then expire and list files."""
    prefix = f"export-{uuid.uuid4().hex[:12]}"  # file names: unique per run, whatever its id
    rid = run_id or prefix
    results = {w.name: TableResult(w.name, w.namespace, already=w.already) for w in plan.tables}
    pending = [w for w in plan.tables if w.ledgers]
    for rnd in range(MAX_ROUNDS):
        if not pending:
            break
        tasks = [t for w in pending for t in write_tasks(w, f"{prefix}-r{rnd}")]
        if progress:
            progress(f"round {rnd + 1}: {len(tasks)} write task(s) over {len(pending)} table(s)")
        records = write(tasks)
        nxt = []
        for w in pending:
            res = results[w.name]
            redo = commit_table(catalog, w, [r for r in records if r["table"] == w.name], rid, res)
            if progress:
                progress(f"{w.name}: {res.ledgers} ledger(s), {res.rows} row(s) committed"
                         + (f", {len(redo)} to redo" if redo else ""))
            if redo:
                res.redone += len(redo)
                nxt.append(_redo_work(catalog, w, redo))
        pending = nxt
    for w in pending:
        results[w.name].failed.append(f"{len(w.parts)} part(s) still conflicting after {MAX_ROUNDS} rounds")
    for w in plan.tables:
        res = results[w.name]
        res.orphans_deleted += after_commit(catalog, w.ident, w.settings.snapshots_kept, orphan_age_s)
        if w.dlq_ident:
            res.orphans_deleted += after_commit(catalog, w.dlq_ident, w.settings.snapshots_kept, orphan_age_s)
    return [results[w.name] for w in plan.tables]


def _redo_work(catalog, w: TableWork, redo: set[tuple[str, int]]) -> TableWork:
    ledgers = _ledger_map(redo)
    dtbl = catalog.load_table(w.dlq_ident) if w.dlq_ident else None
    skip = {t: sorted(exported(dtbl, t) & ids) for t, ids in ledgers.items()} if dtbl is not None else {}
    return replace(w, ledgers={t: sorted(v) for t, v in ledgers.items()},
                   parts=[p for p in w.parts if (p.topic, p.ledger_id) in redo],
                   dlq_skip={t: v for t, v in skip.items() if v}, already=0)


def read_table(catalog, ident: tuple[str, str]) -> pa.Table:
    """The table as Iceberg scans it (tests, the CLI's checks)."""
    return catalog.load_table(ident).scan().to_arrow()


# -- the view: exported tables, their size and how far the export is behind the offload ---------------------


@dataclass
class ExportedTable:
    """One exported table as the "Tiered storage" view shows it. Lag: offloaded ledgers of its topics not
    in the table yet (count, bytes) and how long the oldest of them has been offloaded."""

    namespace: str
    table: str  # <iceberg namespace>.<table>
    topics: int = 0
    rows: int = 0
    bytes: int = 0  # data files of the current snapshot
    snapshots: int = 0
    last_commit_ms: int | None = None
    dlq_rows: int | None = None  # with a JSON schema: rows of <table>_dlq
    unexported_ledgers: int = 0
    unexported_bytes: int = 0
    lag_ms: int | None = None


def _summary_int(snapshot, key: str) -> int:
    if snapshot is None:
        return 0
    try:
        return int(snapshot.summary[key])
    except (KeyError, TypeError, ValueError):
        return 0


def export_overview(ws: Workspace, now_ms: int) -> list[ExportedTable]:
    """Every exported table of the workspace's namespaces (none when no catalog was ever written: the view
    creates nothing)."""
    try:
        url, _ = catalog_location(ws.config)
    except ValidationError:
        return []
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        return []
    catalog = open_catalog(ws.config)
    out: dict[tuple[str, str], ExportedTable] = {}
    tables: dict[tuple[str, str], Any] = {}
    for ns in ws.ml.list_namespaces():
        try:
            s = load_settings(ws, ns)
        except ValidationError:
            continue
        for t in ws.ml.list_topics(ns):
            ident = table_ident(t, s.layout)
            if ident not in tables:
                tables[ident] = _load(catalog, ident)
            tbl = tables[ident]
            if tbl is None:
                continue
            row = out.get(ident)
            if row is None:
                snap = tbl.current_snapshot()
                row = out[ident] = ExportedTable(ns, ".".join(ident), rows=_summary_int(snap, "total-records"),
                                                 bytes=_summary_int(snap, "total-files-size"),
                                                 snapshots=len(tbl.snapshots()),
                                                 last_commit_ms=snap.timestamp_ms if snap is not None else None)
                if s.schema is not None:
                    dlq = _load(catalog, (ident[0], ident[1] + DLQ_SUFFIX))
                    row.dlq_rows = _summary_int(dlq.current_snapshot(), "total-records") if dlq is not None else 0
            row.topics += 1
            done = exported(tbl, t.full)
            info, _ = ws.ml.get_topic(t)
            for li in info.ledgerInfo:
                if is_offloaded(li) and li.ledgerId not in done:
                    row.unexported_ledgers += 1
                    row.unexported_bytes += li.size
                    when = li.offloadContext.timestamp if li.offloadContext.complete else 0
                    if when > 0:
                        age = max(0, now_ms - when)
                        row.lag_ms = age if row.lag_ms is None else max(row.lag_ms, age)
    return sorted(out.values(), key=lambda r: (r.namespace, r.table))
