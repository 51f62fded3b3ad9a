"""Recovery of the metadata store from the bucket alone (docs/recovery.md) as a Spark job.

    spark-submit spark_jobs/recover.py --config tiered.toml --as-of 2026-11-22T03:00:00Z            # dry run
    spark-submit spark_jobs/recover.py --config tiered.toml --as-of ... --apply [--merge]

The driver checks the refusals (a store with records without --merge, a bucket with nothing of this
format: exit 2, nothing started) and lists the bucket once, streamed (tieredcore.lifecycle.recover.list_bucket:
per V1 pair and per topic, not per key). The per-topic reads are distributed over the executors: each
topic's newest manifest read and its checksum checked, and the index objects of the ledgers no manifest
names (topics recovered from index objects) read and attributed; the driver plans from their results
(exactly what `tiered recover` plans in one process) and, with --apply, writes the records with the
crash-safe marker protocol (the metadata store is written by the driver only). Nothing in the bucket is
written or deleted. Without --apply (or with --dry-run) it plans and reports only.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (the recovery's report: topics with their
action and source, damaged and stale manifests, orphans, what could not be recovered; ``counters``
from_manifests / from_index / cold_only / orphans / damaged_manifests / ...) + `detail.parquet` (one row
per topic). Exit 0 when everything was recovered (or planned), 1 when something could not be, 2 on bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from spark_jobs._jobkit import Run, base_parser, counted_partitions, run_job
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.recover import (
    apply_recovery,
    check_store,
    list_bucket,
    mark_existing,
    nothing_to_recover,
    plan_recovery,
)
from tieredcore.lifecycle.recover_run import RecoverRunReport
from tieredcore.workspace import Workspace

JOB = "recover"


@dataclass
class Planned:
    listing: Any  # tieredcore.lifecycle.recover._Listing
    used: bool
    marker: dict[str, Any] | None


def _on_executor(config: Config, fn: Callable[[Workspace, list], list], items: Iterator) -> Iterator:
    batch = list(items)
    if not batch:
        return iter(())
    with Workspace(config) as ws:
        return iter(fn(ws, batch))


def spark_mapper(spark, config: Config):
    """tieredcore.lifecycle.recover's Mapper over Spark: the items split over the executors, each split's
    results back in order (parallelize keeps the order, collect returns the splits in order)."""
    sc = spark.sparkContext

    def run(fn: Callable[[Workspace, list], list], items: list) -> list:
        if not items:
            return []
        slices = max(1, min(len(items), sc.defaultParallelism * 4))
        return sc.parallelize(items, slices).mapPartitions(
            counted_partitions(lambda it: _on_executor(config, fn, it))).collect()

    return run


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--apply", action="store_true", help="write the records (default: plan and report only)")
    p.add_argument("--merge", action="store_true",
                   help="allow a store with records: add what is missing, never overwrite a record")
    args = p.parse_args(argv)
    if args.namespace:
        print("ERROR recover: --namespace: recovery covers the whole bucket", file=sys.stderr)
        return 2

    def plan(run: Run) -> Planned:
        with Workspace(run.config) as ws:
            used, marker = check_store(ws, args.merge)
            listing = list_bucket(ws.open_location(ws.config.store_location), ws.offloader.prefix, ws.config.cluster)
            if listing.empty():
                raise ValidationError(nothing_to_recover(ws))
        return Planned(listing, used, marker)

    def describe(planned: Planned) -> str:
        ls = planned.listing
        return (f"{ls.objects:,} object(s) listed: {ls.manifest_count():,} topic manifest(s) of "
                f"{len(ls.manifests):,} topic(s), {len(ls.ledgers):,} ledger object group(s), "
                f"{len(ls.segments):,} segment(s)" + ("; applying" if args.apply and not args.dry_run else ""))

    def execute(spark, run: Run, planned: Planned) -> RecoverRunReport:
        with Workspace(run.config) as ws:
            rep = plan_recovery(ws, listing=planned.listing, mapper=spark_mapper(spark, run.config))
            mark_existing(ws, rep)
            if args.apply and not run.dry_run:
                apply_recovery(ws, rep, used=planned.used, marker=planned.marker)
        return RecoverRunReport(rep, run.as_of_ms)

    return run_job(JOB, args, plan, describe, execute)


if __name__ == "__main__":
    sys.exit(main())
