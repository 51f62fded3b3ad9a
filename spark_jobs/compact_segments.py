"""Compaction (docs/compaction.md) as a Spark job: runs of small offloaded objects repacked into large segments.

    spark-submit spark_jobs/compact_segments.py --config tiered.toml --as-of 2026-11-22T03:00:00Z
    spark-submit spark_jobs/compact_segments.py --as-of ... --namespace public/small --dry-run --target-size 64M

The driver plans the topics (tieredcore.lifecycle.compaction_run.plan_topics): the --topic names, else
the topics of the --namespace list, else of every namespace with compaction enabled. A real run leaves
out topics whose policy has compaction off (a note in the report says which); a dry run plans them
anyway, to show what enabling it would save. Threshold overrides (--min-object-size, --target-size,
--delete-delay; default: each topic's policy) and prices are checked here too, before Spark starts.
Spark distributes the topics; each task opens its own workspace and compacts its topics one after the
other, each under the topic's lease, on the --as-of clock (tieredcore.lifecycle.compaction.Compactor):
new segment written, verified, old objects recorded in the deletion log (due after the delete delay),
the topic record switched by compare-and-set. A dry run writes nothing and reports the plan.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (per namespace: topics, batches, objects and
bytes before → after, the estimated monthly cost change at the given prices; notes; totals with
``counters`` objects_before / objects_after / bytes_before / bytes_after) + `detail.parquet` (one row
per batch). Exit 0 when every batch was compacted (or planned, or its topic busy), 1 when one failed
or lost its switch to a concurrent change (retried next run), 2 on bad input (nothing started).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_jobs._jobkit import Run, base_parser, counted_partitions, run_job
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.compaction import CostModel
from tieredcore.lifecycle.compaction_run import CompactionReport, Thresholds, plan_topics, run_topics
from tieredcore.lifecycle.compaction_settings import PRICE_OPTIONS, parse_prices, parse_thresholds
from tieredcore.workspace import Workspace

JOB = "compact_segments"


@dataclass(frozen=True)
class Planned:
    topics: list[str]
    notes: list[str]
    thresholds: Thresholds
    cost: CostModel


def plan_run(ws: Workspace, run: Run, namespaces: Sequence[str] | None, topics: Sequence[str] | None,
             thresholds: Thresholds, cost: CostModel) -> Planned:
    if namespaces and topics:
        raise ValidationError("--namespace and --topic exclude each other (the topics name their namespaces)")
    enabled, notes = plan_topics(ws, namespaces, topics, require_enabled=True)
    chosen = enabled
    if run.dry_run:  # what would enabling compaction save? the notes still say it is off
        chosen, _ = plan_topics(ws, namespaces, topics, require_enabled=False)
        off = len(chosen) - len(enabled)
        if off:
            notes.append(f"dry run: {off} topic(s) with compaction off planned anyway (a real run leaves them out)")
    ps = ws.policies
    for t in chosen:  # overrides against each topic's policy (e.g. a min size above its target size)
        thresholds.apply(ps.for_topic(t), f"topic {t} with the run's threshold overrides")
    return Planned(chosen, notes, thresholds, cost)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--topic", action="append", help="compact these topics only (repeatable)")
    p.add_argument("--min-object-size", metavar="SIZE",
                   help="objects below this are compacted (e.g. 8M; default: the policy's, 8 MiB)")
    p.add_argument("--target-size", metavar="SIZE",
                   help="new segments of up to this (e.g. 256M; default: the policy's, 256 MiB)")
    p.add_argument("--delete-delay", metavar="DURATION",
                   help="old objects are deleted this long after the switch (e.g. 1h; default: the policy's)")
    for opt in PRICE_OPTIONS:
        p.add_argument(opt.flag, dest=opt.field, metavar="N", help=opt.help)
    args = p.parse_args(argv)

    def plan(run: Run) -> Planned:
        th = parse_thresholds(args.min_object_size, args.target_size, args.delete_delay)
        cost = parse_prices(vars(args))
        with Workspace(run.config) as ws:
            return plan_run(ws, run, args.namespace, args.topic, th, cost)

    def describe(planned: Planned) -> str:
        overrides = {k: v for k, v in planned.thresholds.as_dict().items() if v is not None}
        return (f"{len(planned.topics)} topic(s) planned"
                + (f", {len(planned.notes)} note(s)" if planned.notes else "")
                + (f", thresholds {overrides}" if overrides else ""))

    def execute(spark, run: Run, planned: Planned) -> CompactionReport:
        rows: list[dict[str, Any]] = []
        if planned.topics:
            sc = spark.sparkContext
            slices = max(1, min(len(planned.topics), sc.defaultParallelism * 2))
            config, as_of, dry, th = run.config, run.as_of_ms, run.dry_run, planned.thresholds
            rows = (sc.parallelize(planned.topics, slices)
                    .mapPartitions(counted_partitions(
                        lambda it: run_topics(config, it, as_of_ms=as_of, dry_run=dry, thresholds=th)))
                    .collect())
        return CompactionReport(run.as_of_ms, run.dry_run, rows, list(planned.topics), list(planned.notes),
                                cost=planned.cost, thresholds=planned.thresholds.as_dict())

    return run_job(JOB, args, plan, describe, execute)


if __name__ == "__main__":
    sys.exit(main())
