"""Orphan reconciliation (spec/05) as a Spark job: leaked objects and hot ledgers become deletion records.

    spark-submit spark_jobs/reconcile_orphans.py --config tiered.toml --as-of 2026-11-22T03:00:00Z --grace 1h

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

Report: `<reports>/reconcile_orphans/<run_id>/summary.json` (the ReconcileReport: counts and bytes per
namespace and kind, oldest orphan age, sample keys, the records) + `detail.parquet` (one row per orphan
object, hot ledger or stale upload). Exit 0, 1 when anything failed (a listing, an append, an abort),
2 on bad input.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict

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
from tieredcore.cli_policies import duration_ms
from tieredcore.config import Config
from tieredcore.errors import TieredError, ValidationError
from tieredcore.lifecycle.deletion_log import TYPE_LEDGER, DeletionLog, DeletionRecord
from tieredcore.lifecycle.drain import driver_metadata_from_dict
from tieredcore.lifecycle.reconcile import (
    APPEND_BATCH,
    DEFAULT_GRACE_MS,
    KIND_LEDGER,
    KIND_OFFLOADED,
    KIND_UPLOAD,
    REASON_ORPHAN,
    UNKNOWN_NAMESPACE,
    ObjectOrphans,
    ObjectRow,
    ReconcileReport,
    abort_stale_uploads,
    find_hot_orphans,
    find_object_orphans,
    list_objects,
    list_rest,
    listing_prefixes,
    namespace_of,
    plan_object_records,
    referenced_uuids,
    store_locations,
)
from tieredcore.workspace import Workspace

JOB = "reconcile_orphans"
LISTING_SCHEMA = ("loc int, key string, size long, last_modified_ms long, uuid string, ledger_id long, "
                  "is_index boolean, error string")
DETAIL_SCHEMA = ("location string, kind string, key string, size long, last_modified_ms long, uuid string, "
                 "ledger_id long, topic string, namespace string")


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


def run(spark, ws: Workspace, as_of_ms: int, grace_ms: int, dry_run: bool) -> tuple[ReconcileReport, list[tuple]]:
    """The reconciliation; returns the report and the detail rows."""
    from pyspark.sql import functions as F

    rep = ReconcileReport(as_of_ms, grace_ms, dry_run)
    clock = time.perf_counter
    t0 = clock()
    locs = store_locations(ws, rep.errors)
    rep.locations = [loc.label for loc in locs]
    rep.timings["locations"] = round(clock() - t0, 6)

    # 1. list every location (materialised before any reference is read)
    t0 = clock()
    tasks = listing_tasks(locs)
    config = ws.config
    rdd = spark.sparkContext.parallelize(tasks, max(1, len(tasks))).mapPartitions(lambda it: run_listing(config, it))
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
    t0 = clock()
    hot = find_hot_orphans(ws, as_of_ms, grace_ms)
    rep.timings["hot"] = round(clock() - t0, 6)
    t0 = clock()
    referenced = referenced_uuids(ws)
    rep.referenced_uuids = len(referenced)
    ref_df = spark.createDataFrame([(u,) for u in sorted(referenced)], "uuid string")
    rep.timings["references"] = round(clock() - t0, 6)

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
    for r in unref.where(F.col("newest") < cutoff).select(
            "loc", "key", "size", "last_modified_ms", "uuid", "ledger_id", "is_index").collect():
        candidates.setdefault(r["loc"], []).append(
            ObjectRow(r["key"], r["size"], r["last_modified_ms"], r["uuid"], r["ledger_id"], r["is_index"]))
    found: list[tuple[int, ObjectOrphans]] = []
    for i in range(len(locs)):
        if i in failed:
            continue
        orph = find_object_orphans(candidates.get(i, []), frozenset(), as_of_ms, grace_ms)
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

    # 4. planning (as reconcile())
    t0 = clock()
    records: list[DeletionRecord] = []
    detail: list[tuple] = []
    oldest: list[int] = []
    for i, orph in found:
        loc = locs[i]
        rep.objects_listed += orph.rows
        rep.bytes_listed += orph.bytes_listed
        rep.referenced_objects += orph.referenced_objects
        rep.foreign_keys += orph.foreign_keys
        rep.foreign_bytes += orph.foreign_bytes
        rep.segment_keys += orph.segment_keys
        rep.young_unreferenced += orph.young_unreferenced
        recs = plan_object_records(loc, orph, as_of_ms)
        by_key = {r.key: r for r in candidates.get(i, [])}
        for g, r in zip(orph.groups, recs, strict=True):
            ns = namespace_of(r.topic)
            rep.orphan_groups += 1
            rep.orphan_objects += len(g.keys)
            rep.orphan_bytes += g.bytes
            rep.add(ns, KIND_OFFLOADED, 1, len(g.keys), g.bytes)
            oldest.append(g.age_ms(as_of_ms))
            for k in g.keys:
                rep.sample(k)
                o = by_key[k]
                detail.append((loc.label, KIND_OFFLOADED, k, o.size, o.last_modified_ms, g.uuid, g.ledger_id,
                               r.topic, ns))
        records.extend(recs)
    rep.hot_ledgers = hot.ledgers
    rep.foreign_hot_ledgers = hot.foreign
    rep.young_hot_ledgers = hot.young
    rep.scheduled_hot_ledgers = hot.scheduled
    for o in hot.orphans:
        ns = namespace_of(o.topic)
        rep.hot_orphans += 1
        rep.hot_orphan_bytes += o.bytes
        rep.add(ns, KIND_LEDGER, 1, 1, o.bytes)
        oldest.append(as_of_ms - o.ctime_ms)
        rep.sample(f"hot:{o.ledger_id}")
        detail.append(("hot", KIND_LEDGER, f"hot:{o.ledger_id}", o.bytes, o.ctime_ms, None, o.ledger_id, o.topic, ns))
        records.append(DeletionRecord(topic=o.topic, ledger_id=o.ledger_id, type=TYPE_LEDGER, reason=REASON_ORPHAN,
                                      created_ms=as_of_ms))
    rep.oldest_orphan_age_ms = max(oldest, default=None)
    for r in records:
        r.validate()
    rep.records = [asdict(r) for r in records]
    rep.timings["planning"] = round(clock() - t0, 6)

    # 5. phase 1: append the records
    t0 = clock()
    if not dry_run and records:
        dl = DeletionLog(ws.metadata)
        for j in range(0, len(records), APPEND_BATCH):
            batch = records[j : j + APPEND_BATCH]
            try:
                dl.append(batch)
            except TieredError as e:
                rep.errors.append(f"appending {len(batch)} deletion records: {e}")
                continue
            rep.records_appended += len(batch)
    rep.timings["append"] = round(clock() - t0, 6)

    # 6. stale multipart uploads
    t0 = clock()
    for loc in locs:
        try:
            up = abort_stale_uploads(loc.store, loc.prefix, as_of_ms, grace_ms, dry_run,
                                     exclude_prefixes=loc.exclude_prefixes)
        except TieredError as e:
            rep.errors.append(f"{loc.label}: listing multipart uploads failed: {e}")
            continue
        rep.stale_uploads += len(up.stale)
        rep.uploads_aborted += up.aborted
        rep.young_uploads += up.young
        rep.foreign_uploads += up.foreign
        rep.errors.extend(up.errors)
        for u in up.stale:
            initiated = int(u.initiated * 1000)
            rep.add(UNKNOWN_NAMESPACE, KIND_UPLOAD, 1, 0, 0)
            oldest.append(as_of_ms - initiated)
            rep.sample(f"upload:{u.key}")
            detail.append((loc.label, KIND_UPLOAD, u.key, 0, initiated, None, None, None, UNKNOWN_NAMESPACE))
    rep.oldest_orphan_age_ms = max(oldest, default=None)
    rep.timings["uploads"] = round(clock() - t0, 6)
    return rep, detail


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--grace", default=str(DEFAULT_GRACE_MS),
                   help="only objects/ledgers/uploads older than this are orphans (ms or 90m, 1h...; default 1h)")
    args = p.parse_args(argv)
    exit_with_parent()
    started = time.monotonic()
    try:
        if args.namespace:
            raise ValidationError("--namespace is not supported by orphan reconciliation (it covers every store)")
        grace = duration_ms(args.grace)
        if grace < 0:
            raise ValidationError(f"--grace {args.grace!r}: must be >= 0")
        config = Config.load(args.config)
        as_of = parse_as_of(args.as_of)
        report_dir = report_dir_for(args, config)
    except TieredError as e:
        return bad_input(JOB, e)
    run_id = run_id_for(args, as_of)
    print(f"{JOB}: run {run_id} as of {as_of} ms, grace {grace} ms{' (dry run)' if args.dry_run else ''}",
          flush=True)
    spark = session(f"tiered-{JOB}", config)
    try:
        with Workspace(config) as ws:
            rep, detail = run(spark, ws, as_of, grace, args.dry_run)
        summary = rep.as_dict()
        summary.update(job=JOB, run_id=run_id, seconds=round(time.monotonic() - started, 3))
        out = write_job_report(spark, report_dir, JOB, run_id, summary, detail, DETAIL_SCHEMA)
    finally:
        spark.stop()
    for e in rep.errors:
        print(f"{JOB}: ERROR {e}", flush=True)
    print(f"{JOB}: report {out}", flush=True)
    print(SUMMARY_PREFIX + json.dumps({k: v for k, v in summary.items() if k != "records"}, sort_keys=True),
          flush=True)
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
