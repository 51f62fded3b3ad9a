"""Phase 2 of two-phase deletion (spec/05) as a Spark job: drain the deletion log.

    spark-submit spark_jobs/deletion_drain.py --config tiered.toml --as-of 2026-11-22T03:00:00Z

The driver reads the records due at --as-of (its only clock), groups them by object store (the record's
driver metadata: name + properties; hot-ledger records form their own group, malformed ones another)
and ships each group — split into chunks of at most CHUNK records — to one Spark task. Each task opens
its own Workspace and runs tieredcore.lifecycle.drain.drain() on its entries, so every task's batch
delete covers one store. The driver merges the task reports and writes
`<reports>/deletion_drain/<run_id>/summary.json` (the DrainReport counters) + `detail.parquet` (one row
per record).

Exit status: 0 when every record was acknowledged (deleted, already deleted, still in use, refused) or
is retrying within its attempt limit (a retry is the protocol working, the next run picks it up);
1 when anything was dead-lettered this run (malformed, unsupported, or out of attempts: an operator is
needed; not in a dry run, which changes nothing) or a task failed; 2 on bad input (nothing started).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence

from spark_jobs._jobkit import (
    SUMMARY_PREFIX,
    bad_input,
    base_parser,
    exit_with_parent,
    parse_as_of,
    report_dir_for,
    run_id_for,
    session,
    write_job_report,
)
from tieredcore.config import Config
from tieredcore.errors import TieredError, ValidationError
from tieredcore.lifecycle.drain import DrainReport, DrainRow, drain
from tieredcore.stores.deletion_log import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_DELAY_MS,
    TYPE_LEDGER,
    DeletionLog,
    Entry,
)
from tieredcore.workspace import Workspace

JOB = "deletion_drain"
CHUNK = 5000  # records per Spark task at most (a store with more gets several tasks)
DETAIL_SCHEMA = "id string, topic string, ledger long, type string, reason string, outcome string, error string"
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
    exit_with_parent()
    started = time.monotonic()
    try:
        if args.namespace:
            raise ValidationError("--namespace is not supported by the deletion drain")
        if args.max_attempts < 1:
            raise ValidationError(f"--max-attempts must be >= 1, got {args.max_attempts}")
        if args.retry_delay_ms < 0:
            raise ValidationError(f"--retry-delay-ms must be >= 0, got {args.retry_delay_ms}")
        if args.limit is not None and args.limit < 0:
            raise ValidationError(f"--limit must be >= 0, got {args.limit}")
        config = Config.load(args.config)
        as_of = parse_as_of(args.as_of)
        report_dir = report_dir_for(args, config)
        with Workspace(config) as ws:
            due = DeletionLog(ws.metadata).due(as_of, args.limit)
    except TieredError as e:
        return bad_input(JOB, e)
    run_id = run_id_for(args, as_of)
    units = plan_units(due)
    print(f"{JOB}: run {run_id} as of {as_of} ms: {len(due)} due record(s) in {len(units)} task(s)"
          f"{' (dry run)' if args.dry_run else ''}", flush=True)
    spark = session(f"tiered-{JOB}", config)
    try:
        results: list[dict] = []
        if units:
            delay, attempts, dry = args.retry_delay_ms, args.max_attempts, args.dry_run
            results = (spark.sparkContext.parallelize(units, len(units))
                       .mapPartitions(lambda it: run_units(config, as_of, delay, attempts, dry, it))
                       .collect())
        total = DrainReport(as_of, args.dry_run)
        errors = []
        for r in results:
            if "error" in r:
                errors.append(f"{r['group']}: {r['entries']} record(s) not processed: {r['error']}")
            else:
                total = total.merge(report_of(r["report"]))
        summary = {k: v for k, v in total.as_dict().items() if k != "rows"}
        summary.update(job=JOB, run_id=run_id, due=len(due), tasks=len(units), task_errors=errors,
                       seconds=round(time.monotonic() - started, 3))
        rows = [(r.id, r.topic, r.ledger, r.type, r.reason, r.outcome, r.error) for r in total.rows]
        out = write_job_report(spark, report_dir, JOB, run_id, summary, rows, DETAIL_SCHEMA)
    finally:
        spark.stop()
    for e in errors:
        print(f"{JOB}: FAILED task {e}", flush=True)
    for r in total.rows:
        if r.outcome in ("dead_lettered", "malformed"):
            print(f"{JOB}: DEAD-LETTERED {r.id} ({r.type} ledger {r.ledger} of {r.topic}): {r.error}", flush=True)
    print(f"{JOB}: report {out}", flush=True)
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True), flush=True)
    dead = not args.dry_run and (total.dead_lettered or total.malformed)  # a dry run changes nothing
    return 1 if errors or dead else 0


if __name__ == "__main__":
    sys.exit(main())
