"""`tiered export`: offloaded ledgers into Iceberg tables, in-process (the same core as the Spark job
spark_jobs/export_tables.py: tieredcore.lifecycle.export); `tiered export-settings`: a namespace's
export settings (layout, JSON schema, target file size, snapshots kept). docs/export.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tieredcore.cli.common import CommandGroup, require_namespaces
from tieredcore.clock import iso_ms, now_ms, parse_time_ms
from tieredcore.errors import ValidationError
from tieredcore.lifecycle import export as ex
from tieredcore.names import NamespaceName, TopicName
from tieredcore.query.scan import resolve_topics
from tieredcore.units import size_bytes
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED = 0, 1
COMMANDS = ("export", "export-settings")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "export", parents=parents,
        help="write offloaded ledgers into Iceberg tables (pyiceberg SQL catalog), exactly once",
        description="Export the offloaded, sealed ledgers (closed at or before --as-of) of the given topics, or of "
                    "every topic of --namespace (default: every namespace), into Iceberg tables: one per topic "
                    "(or per namespace: `tiered export-settings NS --layout namespace`), partitioned by day of "
                    "publish time. Ledgers already in a table are never added again. Exit status: 0 ok; 1 when "
                    "a ledger could not be read or committed; 2 on bad input.")
    s.add_argument("topic", nargs="*", help="topics to export (default: every topic of --namespace, or all)")
    s.add_argument("--namespace", action="append", help="tenant/namespace (repeatable)")
    s.add_argument("--as-of", help="logical time: ledgers closed after it wait (ISO 8601 or epoch ms; default now)")
    s.add_argument("--dry-run", action="store_true", help="plan only: tables, ledgers and bytes; nothing written")
    t = sub.add_parser(
        "export-settings", parents=parents, help="show or set a namespace's Iceberg export settings",
        description="Without options: show the namespace's export settings. Options change them.")
    t.add_argument("namespace", help="tenant/namespace")
    t.add_argument("--layout", choices=ex.LAYOUTS, help="one table per topic (default) or per namespace")
    t.add_argument("--schema", metavar="FILE",
                   help="a JSON schema file (field -> type, or JSON Schema properties): payloads parse into a "
                        "typed `value` column; payloads that do not match go to <table>_dlq")
    t.add_argument("--no-schema", action="store_true", help="drop the schema (payload bytes only, no DLQ)")
    t.add_argument("--target-file-size", metavar="SIZE", help="Parquet files of up to this (e.g. 128M)")
    t.add_argument("--snapshots-kept", type=int, metavar="N", help="snapshots kept per table (older expire)")


def _topics(ws: Workspace, a: argparse.Namespace) -> list[TopicName]:
    if a.topic and a.namespace:
        raise ValidationError("name topics or --namespace, not both")
    if a.topic:
        return [t for name in a.topic for t in resolve_topics(ws.ml, name, None)]
    names = require_namespaces(ws, a.namespace) if a.namespace else ws.ml.list_namespaces()
    out: list[TopicName] = []
    for ns in names:
        out += sorted(ws.ml.list_topics(NamespaceName.parse(ns)), key=lambda x: x.full)
    return out


def run_export(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    as_of = parse_time_ms(a.as_of, "--as-of") if a.as_of else now_ms()
    topics = _topics(ws, a)
    catalog = ex.open_catalog(ws.config)
    plan = ex.plan_export(ws, catalog, topics, as_of, create=not a.dry_run)
    res: dict[str, Any] = {"as_of": iso_ms(as_of), "dry_run": a.dry_run, "topics": len(topics),
                           "waiting_ledgers": plan.waiting,
                           "catalog": ex.catalog_location(ws.config)[0]}
    if a.dry_run:
        res["tables"] = [{"table": w.name, "namespace": w.namespace, "ledgers": w.ledger_count, "parts": len(w.parts),
                          "bytes": w.bytes, "already": w.already} for w in plan.tables]
        return res
    say = (lambda m: progress(f"tiered export: {m}", force=True)) if progress is not None and not a.json else None
    results = ex.run_export(ws.config, catalog, plan, ex.local_writer(ws.config), progress=say)
    res["tables"] = [r.as_dict() for r in results]
    res["totals"] = {k: sum(getattr(r, k) for r in results) for k in ("ledgers", "rows", "bytes", "files", "dlq_rows")}
    failed = [f for r in results for f in r.failed]
    res["_exit"] = EXIT_FAILED if failed else EXIT_OK
    if not a.json:
        _print(res)
        res["_printed"] = True
    return res


def _print(res: dict[str, Any]) -> None:
    print(f"export as of {res['as_of']}: {len(res['tables'])} table(s), {res['waiting_ledgers']} ledger(s) not yet "
          "eligible (open, not fully offloaded or closed later)")
    print(f"{'table':<40} {'ledgers':>8} {'rows':>10} {'bytes':>12} {'files':>6} {'dlq rows':>9} {'before':>7} snapshot")
    for r in res["tables"]:
        print(f"{r['table']:<40} {r['ledgers']:>8} {r['rows']:>10,} {r['bytes']:>12,} {r['files']:>6} "
              f"{r['dlq_rows']:>9} {r['already']:>7} {r['snapshot_id'] or '-'}")
        for f in r["failed"]:
            print(f"  FAILED {f}")


def run_settings(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    ns = NamespaceName.parse(a.namespace).name
    s = ex.load_settings(ws, ns)
    changes: dict[str, Any] = {}
    if a.schema and a.no_schema:
        raise ValidationError("--schema and --no-schema exclude each other")
    if a.layout:
        changes["layout"] = a.layout
    if a.schema:
        p = Path(a.schema)
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise ValidationError(f"--schema {a.schema}: cannot read it: {e.strerror or e}") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ValidationError(f"--schema {a.schema}: not JSON: {e}") from None
        fields, required = ex.parse_schema(doc)
        changes.update(schema=fields, required=required)
    if a.no_schema:
        changes.update(schema=None, required=())
    if a.target_file_size is not None:
        n = size_bytes(a.target_file_size)
        if n < 1024:
            raise ValidationError(f"--target-file-size {a.target_file_size}: at least 1K")
        changes["target_file_size"] = n
    if a.snapshots_kept is not None:
        changes["snapshots_kept"] = a.snapshots_kept
    if changes:
        s = ex.ExportSettings(**{**s.as_dict(), "required": s.required, **changes})
        ex.save_settings(ws, ns, s)
    return {"namespace": ns, "changed": sorted(changes), **s.as_dict()}


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    return run_export(a, ws, progress) if a.cmd == "export" else run_settings(a, ws, progress)


GROUP = CommandGroup(COMMANDS, add_parser, run)
