"""Iceberg export (docs/export.md) as a Spark job: offloaded ledgers into Iceberg tables, exactly once.

    spark-submit spark_jobs/export_tables.py --config tiered.toml --as-of 2026-11-22T03:00:00Z
    spark-submit spark_jobs/export_tables.py --as-of ... --namespace public/default --dry-run

The driver plans (tieredcore.lifecycle.export.plan_export): per table (one per topic, or per namespace) the
offloaded ledgers closed at or before --as-of that the table's exported set does not hold yet, as parts
in write tasks of up to the table's target file size. Spark distributes the write tasks: each executor reads
its parts (tieredcore.query.scan.read_part) and writes Parquet files into the table's data location (and
the DLQ table's, with a JSON schema); nothing is committed there. The driver then commits per table with
pyiceberg — the files and the exported ledgers in one Iceberg commit; a commit that lost to an overlapping
run reloads, leaves out what the other run committed, and redoes the rest — expires snapshots beyond the
namespace's setting and writes the table's ``current_files.json``.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (per namespace: tables, ledgers, rows, bytes, DLQ
rows; ``tables``: per table its snapshot id, files, conflicts) + `detail.parquet` (one row per table).
Exit 0 when every planned ledger was committed, 1 when a ledger could not be read or committed (the next
run retries it), 2 on bad input (nothing started).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_jobs._jobkit import Run, base_parser, counted_partitions, run_job
from tieredcore.errors import ValidationError
from tieredcore.lifecycle import export as ex
from tieredcore.names import NamespaceName, TopicName
from tieredcore.query.scan import resolve_topics
from tieredcore.reports import totals
from tieredcore.workspace import Workspace

JOB = "export_tables"
DETAIL = ("namespace string, table string, ledgers long, already long, rows long, bytes long, files long, "
          "dlq_rows long, snapshot_id long, conflicts long, redone long, failed long")


@dataclass
class ExportReport:
    as_of_ms: int
    dry_run: bool
    plan: ex.ExportPlan
    results: list[ex.TableResult]

    def _namespaces(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for w in self.plan.tables:
            d = out.setdefault(w.namespace, {"tables": 0, "topics": 0, "ledgers": 0, "bytes": 0, "rows": 0,
                                             "dlq_rows": 0, "failures": 0, "outcomes": {}})
            d["tables"] += 1
            d["topics"] += len(w.ledgers)
        for r in self.results:
            d = out[r.namespace]
            d["ledgers"] += r.ledgers
            d["bytes"] += r.bytes
            d["rows"] += r.rows
            d["dlq_rows"] += r.dlq_rows
            d["failures"] += len(r.failed)
            if r.ledgers:
                d["outcomes"]["exported"] = d["outcomes"].get("exported", 0) + r.ledgers
            if r.failed:
                d["outcomes"]["failed"] = d["outcomes"].get("failed", 0) + len(r.failed)
        if self.dry_run:
            for w in self.plan.tables:
                d = out[w.namespace]
                d["ledgers"] += w.ledger_count
                d["bytes"] += w.bytes
                if w.ledger_count:
                    d["outcomes"]["planned"] = d["outcomes"].get("planned", 0) + w.ledger_count
        return out

    def totals(self):
        ns = self._namespaces()
        outcomes: dict[str, int] = {}
        for d in ns.values():
            for k, v in d["outcomes"].items():
                outcomes[k] = outcomes.get(k, 0) + v
        return totals(topics=sum(d["topics"] for d in ns.values()), ledgers=sum(d["ledgers"] for d in ns.values()),
                      bytes=sum(d["bytes"] for d in ns.values()), failures=sum(d["failures"] for d in ns.values()),
                      outcomes=outcomes, namespaces=ns,
                      counters={"rows": sum(d["rows"] for d in ns.values()),
                                "dlq_rows": sum(d["dlq_rows"] for d in ns.values())})

    def summary(self) -> dict[str, Any]:
        if self.dry_run:
            tables = [{"table": w.name, "namespace": w.namespace, "ledgers": w.ledger_count, "bytes": w.bytes,
                       "parts": len(w.parts), "already": w.already} for w in self.plan.tables]
        else:
            tables = [r.as_dict() for r in self.results]
        return {"dry_run": self.dry_run, "tables": tables, "waiting_ledgers": self.plan.waiting,
                "failures": sum(len(r.failed) for r in self.results)}

    def detail(self) -> tuple[list[tuple], str]:
        rows = [(r.namespace, r.table, r.ledgers, r.already, r.rows, r.bytes, r.files, r.dlq_rows, r.snapshot_id,
                 r.conflicts, r.redone, len(r.failed)) for r in self.results]
        return rows, DETAIL

    def messages(self) -> list[str]:
        out = [f"FAILED {r.table}: {f}" for r in self.results for f in r.failed]
        out += [f"exported {r.table}: {r.ledgers} ledger(s), {r.rows} row(s), {r.dlq_rows} DLQ row(s), "
                f"snapshot {r.snapshot_id}" for r in self.results if r.ledgers]
        return out


def plan_topics(ws: Workspace, namespaces: Sequence[str] | None, topics: Sequence[str] | None) -> list[TopicName]:
    if namespaces and topics:
        raise ValidationError("--namespace and --topic exclude each other (the topics name their namespaces)")
    if topics:
        return [t for name in topics for t in resolve_topics(ws.ml, name, None)]
    names = [NamespaceName.parse(n).name for n in namespaces] if namespaces else ws.ml.list_namespaces()
    return [t for ns in names for t in resolve_topics(ws.ml, None, ns)] if namespaces else \
        [t for ns in names for t in sorted(ws.ml.list_topics(NamespaceName.parse(ns)), key=lambda x: x.full)]


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--topic", action="append", help="export these topics only (repeatable)")
    p.add_argument("--orphan-age", type=float, default=ex.DEFAULT_ORPHAN_AGE_S, metavar="SECONDS",
                   help="uncommitted data files older than this are deleted after the commit (default 3600)")
    args = p.parse_args(argv)
    if args.orphan_age < 0:
        p.error("--orphan-age must be >= 0")

    def plan(run: Run) -> ex.ExportPlan:
        with Workspace(run.config) as ws:
            catalog = ex.open_catalog(run.config)
            return ex.plan_export(ws, catalog, plan_topics(ws, args.namespace, args.topic), run.as_of_ms,
                                  create=False)  # reads only: tables are created in execute

    def describe(planned: ex.ExportPlan) -> str:
        return (f"{len(planned.tables)} table(s), {sum(w.ledger_count for w in planned.tables)} ledger(s), "
                f"{sum(w.bytes for w in planned.tables):,} bytes planned")

    def execute(spark, run: Run, planned: ex.ExportPlan) -> ExportReport:
        if run.dry_run:
            return ExportReport(run.as_of_ms, True, planned, [])
        sc, config = spark.sparkContext, run.config

        def write(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if not tasks:
                return []
            return (sc.parallelize(tasks, len(tasks))
                    .mapPartitions(counted_partitions(lambda it: (r for t in it for r in ex.run_write_task(config, t))))
                    .collect())

        catalog = ex.open_catalog(config)
        ex.ensure_tables(catalog, planned)
        results = ex.run_export(config, catalog, planned, write, run_id=run.run_id, orphan_age_s=args.orphan_age,
                                progress=lambda m: print(f"INFO {JOB}: {m}", flush=True))
        return ExportReport(run.as_of_ms, False, planned, results)

    return run_job(JOB, args, plan, describe, execute)


if __name__ == "__main__":
    sys.exit(main())
