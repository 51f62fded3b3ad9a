"""Phase 2 of two-phase deletion (docs/deletion.md) as a Spark job: drain the deletion log.

    spark-submit spark_jobs/deletion_drain.py --config tiered.toml --as-of 2026-11-22T03:00:00Z

The driver reads the records due at --as-of (its only clock), groups them by object store (the record's
driver metadata: name + properties; hot-ledger records form their own group, malformed ones another)
and ships each group — split into chunks of at most CHUNK records — to one Spark task. Each task opens
its own Workspace and runs tieredcore.lifecycle.drain.drain() on its entries, so every task's batch
delete covers one store. The driver merges the task reports and writes
`<reports>/<group>/<run key>/<part>/summary.json` (the DrainReport counters) + `detail.parquet` (one row
per record).

Exit status: 0 when every record was acknowledged (deleted, already deleted, still in use, refused) or
is retrying within its attempt limit (a retry is the protocol working, the next run picks it up);
1 when anything was dead-lettered this run (malformed, unsupported, or out of attempts: an operator is
needed; not in a dry run, which changes nothing), a record was kept because its topic's record cannot be
read (taken as in use: nothing deleted), records were ``aborted`` (the object store kept failing or was
declared dead: not attempted, kept as they were for the next run), or a task failed; 2 on bad input
(nothing started).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence

from spark_jobs._jobkit import Run, base_parser, counted_partitions, run_job
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.drain import DrainReport, DrainRow, drain
from tieredcore.meta.deletion_log import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_DELAY_MS,
    TYPE_LEDGER,
    DeletionLog,
    Entry,
)
from tieredcore.workspace import Workspace

JOB = "deletion_drain"
CHUNK = 5000  # records per Spark task at most (a store with more gets several tasks)
GROUP_HOT = "hot"
GROUP_MALFORMED = "malformed"


def store_group(entry: Entry) -> str:
    """The object store an entry's deletion touches (driver name + properties), or GROUP_HOT /
    GROUP_MALFORMED."""
    rec = entry.record
    if rec is None:
        return GROUP_MALFORMED
    if rec.type == TYPE_LEDGER:
        return GROUP_HOT
    drv = rec.driver if isinstance(rec.driver, dict) else {}
    try:
        return json.dumps({"name": drv.get("name"), "properties": drv.get("properties")}, sort_keys=True,
                          default=str)
    except (TypeError, ValueError):
        return repr(drv)


def plan_units(entries: Sequence[Entry], chunk: int = CHUNK) -> list[tuple[str, list[Entry]]]:
    """(group, entries) work units: one per store, split in chunks, order of `entries` kept inside."""
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(store_group(e), []).append(e)
    return [(g, es[i : i + chunk]) for g, es in sorted(groups.items()) for i in range(0, len(es), chunk)]


def run_units(config: Config, as_of: int, delay_ms: int, max_attempts: int, dry_run: bool,
              units: Iterator[tuple[str, list[Entry]]]) -> Iterator[dict]:
    """Executor side: one drain() per unit, its report as a dict (or {"error": ...})."""
    for group, entries in units:
        try:
            with Workspace(config) as ws:
                rep = drain(ws, as_of, entries=entries, delay_ms=delay_ms, max_attempts=max_attempts,
                            dry_run=dry_run)
            yield {"group": group, "report": rep.as_dict()}
        except Exception as e:  # the records stay due: the next run retries them
            yield {"group": group, "error": f"{type(e).__name__}: {e}", "entries": len(entries)}


def report_of(d: dict) -> DrainReport:
    d = dict(d)
    rows = [DrainRow(**r) for r in d.pop("rows")]
    rep = DrainReport(**d)
    rep.rows = rows
    return rep


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS,
                   help=f"dead-letter a record after this many failed attempts (default {DEFAULT_MAX_ATTEMPTS})")
    p.add_argument("--retry-delay-ms", type=int, default=DEFAULT_RETRY_DELAY_MS,
                   help=f"first retry delay, doubled per attempt (default {DEFAULT_RETRY_DELAY_MS})")
    p.add_argument("--limit", type=int, help="at most this many due records this run (oldest first)")
    args = p.parse_args(argv)

    def plan(run: Run) -> tuple[int, list[tuple[str, list[Entry]]]]:
        if args.namespace:
            raise ValidationError("--namespace is not supported by the deletion drain")
        if args.max_attempts < 1:
            raise ValidationError(f"--max-attempts must be >= 1, got {args.max_attempts}")
        if args.retry_delay_ms < 0:
            raise ValidationError(f"--retry-delay-ms must be >= 0, got {args.retry_delay_ms}")
        if args.limit is not None and args.limit < 0:
            raise ValidationError(f"--limit must be >= 0, got {args.limit}")
        with Workspace(run.config) as ws:
            due = DeletionLog(ws.metadata).due(run.as_of_ms, args.limit)
        return len(due), plan_units(due)

    def describe(planned: tuple[int, list]) -> str:
        return f"{planned[0]} due record(s) in {len(planned[1])} task(s)"

    def execute(spark, run: Run, planned: tuple[int, list[tuple[str, list[Entry]]]]) -> DrainReport:
        due, units = planned
        results: list[dict] = []
        if units:
            config, as_of, delay, attempts, dry = (run.config, run.as_of_ms, args.retry_delay_ms, args.max_attempts,
                                                   run.dry_run)
            results = (spark.sparkContext.parallelize(units, len(units))
                       .mapPartitions(counted_partitions(lambda it: run_units(config, as_of, delay, attempts, dry, it)))
                       .collect())
        total = DrainReport(run.as_of_ms, run.dry_run)
        for r in results:
            if "error" in r:
                total.task_errors.append(f"{r['group']}: {r['entries']} record(s) not processed: {r['error']}")
            else:
                total = total.merge(report_of(r["report"]))
        total.due, total.tasks = due, len(units)
        return total

    return run_job(JOB, args, plan, describe, execute)


if __name__ == "__main__":
    sys.exit(main())
