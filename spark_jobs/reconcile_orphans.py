"""Orphan reconciliation (docs/deletion.md) as a Spark job: leaked objects and hot ledgers become deletion records.

    spark-submit spark_jobs/reconcile_orphans.py --config tiered.toml --as-of 2026-11-22T03:00:00Z --grace 1h

On a workspace attached to a Pulsar cluster (docs/pulsar.md) the job only plans unless ``--apply``
(``--apply`` with ``--dry-run``: bad input, exit 2), and ``--grace`` defaults to a week (elsewhere 1h).

Same result as tieredcore.lifecycle.reconcile.reconcile() on the same input, with the listing and the
anti-join in Spark:

1. the driver finds the offload locations (store_locations); one Spark task per listing prefix of each
   location (16 uuid-digit prefixes + the "rest" listing) lists it, paginated, into a DataFrame
   (key, size, last_modified_ms, uuid, ledger_id, is_index), materialised before any reference is read;
   a location any of whose listings failed is skipped with an error, like reconcile();
2. the driver reads the hot tier (find_hot_orphans), then the referenced uuids (referenced_uuids:
   metadata first, then the deletion log) into a DataFrame;
3. Spark anti-joins the ledger keys on uuid and keeps the (uuid, ledger) groups whose newest object is
   older than --as-of minus --grace; the counters (listed, foreign, segment, referenced, young) are
   Spark aggregates;
4. the driver groups the collected orphan rows (find_object_orphans), plans the `offloaded` records
   (plan_object_records), adds the hot orphans as `ledger` records, appends them unless --dry-run, and
   aborts stale multipart uploads unless --dry-run.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (the ReconcileReport: counts and bytes per
namespace and kind, every candidate with key, size, age and why, what was withheld and why, orphans per
namespace, oldest orphan age, sample keys, the records) + `detail.parquet` (one row per orphan
object, hot ledger or stale upload). Exit 0, 1 when anything failed (a listing, an append, an abort),
2 on bad input.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence

from spark_jobs._jobkit import Run, base_parser, counted_partitions, run_job
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.reconcile.listing import ObjectRow, list_objects, list_rest, listing_prefixes
from tieredcore.lifecycle.reconcile.orphans import (
    ATTACHED_DEFAULT_GRACE_MS,
    DEFAULT_GRACE_MS,
    MAX_WITHHELD_LISTED,
    ObjectOrphans,
    find_object_orphans,
)
from tieredcore.lifecycle.reconcile.report import ReconcileReport
from tieredcore.lifecycle.reconcile.run import plan_and_apply, read_references, resolve_dry_run, start
from tieredcore.offload.context import driver_metadata_from_dict
from tieredcore.units import non_negative_duration_ms
from tieredcore.workspace import Workspace

JOB = "reconcile_orphans"
LISTING_SCHEMA = ("loc int, key string, size long, last_modified_ms long, uuid string, ledger_id long, "
                  "is_index boolean, error string")


def listing_tasks(locs) -> list[tuple]:
    """(location index, driver dict, prefix, exclude prefixes, listing prefix or None for the rest)."""
    out = []
    for i, loc in enumerate(locs):
        for lp in [*listing_prefixes(loc.prefix), None]:
            out.append((i, loc.driver, loc.prefix, list(loc.exclude_prefixes), lp))
    return out


def run_listing(config: Config, tasks: Iterator[tuple]) -> Iterator[tuple]:
    """Executor side: the rows of each listing (or one error row)."""
    with Workspace(config) as ws:
        for i, driver, prefix, exclude, lp in tasks:
            try:
                store = ws.offloader_for_driver(driver_metadata_from_dict(driver)).store
                rows = (list_rest(store, prefix, exclude_prefixes=exclude) if lp is None
                        else list_objects(store, prefix, lp, exclude_prefixes=exclude))
                out = [(i, *r, None) for r in rows]
            except Exception as e:
                out = [(i, None, None, None, None, None, None,
                        f"listing {lp if lp is not None else prefix + ' (rest)'!r}: {type(e).__name__}: {e}")]
            yield from out


def _n(v) -> int:
    return int(v or 0)


def reconcile_with_spark(spark, ws: Workspace, as_of_ms: int, grace_ms: int, dry_run: bool) -> ReconcileReport:
    """The reconciliation (the report holds its detail rows)."""
    from pyspark.sql import functions as F

    rep, locs = start(ws, as_of_ms, grace_ms, dry_run)
    clock = time.perf_counter

    # 1. list every location (materialised before any reference is read)
    t0 = clock()
    tasks = listing_tasks(locs)
    config = ws.config
    rdd = spark.sparkContext.parallelize(tasks, max(1, len(tasks))).mapPartitions(
        counted_partitions(lambda it: run_listing(config, it)))
    df = spark.createDataFrame(rdd, LISTING_SCHEMA).cache()
    df.count()
    failed: dict[int, list[str]] = {}
    for r in df.where(F.col("error").isNotNull()).select("loc", "error").collect():
        failed.setdefault(r["loc"], []).append(r["error"])
    for i, errs in sorted(failed.items()):
        rep.errors.append(f"{locs[i].label}: listing failed, location skipped: {'; '.join(sorted(errs))}")
    listed = df.where(F.col("error").isNull())
    if failed:
        listed = listed.where(~F.col("loc").isin(list(failed)))
    rep.timings["listing"] = round(clock() - t0, 6)

    # 2. hot tier, topic records and the deletion log, in that order
    hot, referenced = read_references(ws, rep, as_of_ms, grace_ms)
    ref_df = spark.createDataFrame([(u,) for u in sorted(referenced)], "uuid string")

    # 3. anti-join and grace filter in Spark
    t0 = clock()
    cutoff = as_of_ms - grace_ms
    is_foreign = F.col("uuid").isNull()
    is_segment = F.col("uuid").isNotNull() & F.col("ledger_id").isNull()
    stats = {r["loc"]: r for r in listed.groupBy("loc").agg(
        F.count(F.lit(1)).alias("rows"), F.sum("size").alias("bytes"),
        F.sum(F.when(is_foreign, 1).otherwise(0)).alias("foreign"),
        F.sum(F.when(is_foreign, F.col("size")).otherwise(0)).alias("foreign_bytes"),
        F.sum(F.when(is_segment, 1).otherwise(0)).alias("segment"),
    ).collect()}
    ledger_rows = listed.where(F.col("uuid").isNotNull() & F.col("ledger_id").isNotNull())
    referenced_objects = {r["loc"]: r["count"] for r in
                          ledger_rows.join(F.broadcast(ref_df), "uuid", "left_semi").groupBy("loc").count().collect()}
    unref = ledger_rows.join(F.broadcast(ref_df), "uuid", "left_anti")
    newest = unref.groupBy("loc", "uuid", "ledger_id").agg(F.max("last_modified_ms").alias("newest"))
    unref = unref.join(newest, ["loc", "uuid", "ledger_id"])
    young = {r["loc"]: r for r in unref.where(F.col("newest") >= cutoff).groupBy("loc").agg(
        F.count(F.lit(1)).alias("objects"), F.sum("size").alias("bytes")).collect()}
    candidates: dict[int, list[ObjectRow]] = {}
    cols = ("loc", "key", "size", "last_modified_ms", "uuid", "ledger_id", "is_index")
    # the old unreferenced rows (candidates), and for the report's withheld list the young ones and the
    # first foreign keys (grouped again on the driver by find_object_orphans)
    # (in key order, as reconcile() lists them: the same report)
    wanted = unref.where(F.col("newest") < cutoff).select(*cols).unionByName(
        unref.where(F.col("newest") >= cutoff).select(*cols).orderBy("key").limit(MAX_WITHHELD_LISTED)).unionByName(
        listed.where(is_foreign).select(*cols).orderBy("key").limit(MAX_WITHHELD_LISTED))
    for r in sorted(wanted.collect(), key=lambda r: (r["loc"], r["key"])):
        candidates.setdefault(r["loc"], []).append(
            ObjectRow(r["key"], r["size"], r["last_modified_ms"], r["uuid"], r["ledger_id"], r["is_index"]))
    found: list[tuple[int, ObjectOrphans]] = []
    for i in range(len(locs)):
        if i in failed:
            continue
        orph = find_object_orphans(candidates.get(i, []), frozenset(), as_of_ms, grace_ms)
        # (its counters come from the aggregates: the rows collected are a part of the listing)
        st = stats.get(i)
        orph.rows, orph.bytes_listed = (_n(st["rows"]), _n(st["bytes"])) if st else (0, 0)
        orph.foreign_keys, orph.foreign_bytes = (_n(st["foreign"]), _n(st["foreign_bytes"])) if st else (0, 0)
        orph.segment_keys = _n(st["segment"]) if st else 0
        orph.referenced_objects = _n(referenced_objects.get(i))
        y = young.get(i)
        orph.young_unreferenced, orph.young_bytes = (_n(y["objects"]), _n(y["bytes"])) if y else (0, 0)
        found.append((i, orph))
    df.unpersist()
    rep.timings["anti_join"] = round(clock() - t0, 6)

    # 4-6. planning, phase-1 append, stale uploads: the same code as reconcile()
    plan_and_apply(ws, rep, locs, [(locs[i], orph) for i, orph in found], hot, as_of_ms, grace_ms, dry_run)
    return rep


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--grace", default=None,
                   help="only objects/ledgers/uploads older than this are orphans (ms or 90m, 1h...; default 1h, "
                        f"attached to a Pulsar cluster {ATTACHED_DEFAULT_GRACE_MS // 86_400_000}d)")
    p.add_argument("--apply", action="store_true",
                   help="append the records (attached to a Pulsar cluster the job only plans without it)")
    args = p.parse_args(argv)

    def plan(run: Run) -> int:
        if args.namespace:
            raise ValidationError("--namespace is not supported by orphan reconciliation (it covers every store)")
        # the run's dry run as resolved (Run.dry_run reads it: the summary and the log lines say it)
        args.dry_run = resolve_dry_run(run.config.attached, args.dry_run, args.apply)
        if args.grace is None:
            return ATTACHED_DEFAULT_GRACE_MS if run.config.attached else DEFAULT_GRACE_MS
        return non_negative_duration_ms(args.grace, "--grace")

    def execute(spark, run: Run, grace: int) -> ReconcileReport:
        with Workspace(run.config) as ws:
            return reconcile_with_spark(spark, ws, run.as_of_ms, grace, run.dry_run)

    return run_job(JOB, args, plan, lambda grace: f"grace {grace} ms", execute)


if __name__ == "__main__":
    sys.exit(main())
