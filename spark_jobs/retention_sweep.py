"""Retention trim + deletion-lag cleanup (phase 1 of two-phase deletion, docs/deletion.md) as a Spark job.

    spark-submit spark_jobs/retention_sweep.py --config tiered.toml --as-of 2026-11-22T04:00:00Z

The driver plans, at --as-of (the job's only clock), for the given namespaces (default: every
namespace):

- retention units (tieredcore.lifecycle.retention.plan_retention): topics with ledgers past their
  namespace's retention (time or size over both tiers, Pulsar's semantics, docs/metadata.md);
- deletion-lag units (tieredcore.lifecycle.sweep.plan_lag_cleanup): hot copies whose offload completed
  more than the deletion lag before --as-of, minus the ledgers this run trims anyway.

Spark distributes the units (one topic per unit, run_work dispatches by kind). Phase 1 only: each unit
appends its deletion records and then changes the metadata (ledgers removed from the topic,
`bookkeeperDeleted` set); the storage itself is deleted by the deletion drain
(spark_jobs/deletion_drain.py), which the `tiered_retention` DAG runs next.

Report: `<reports>/<group>/<run key>/<part>/summary.json` + `detail.parquet` (one row per ledger, kind
`retention` or `lag-cleanup`; outcomes trimmed / marked / planned / skipped / failed / verify-failed).
Exit 0 when every unit succeeded, 1 when any ledger failed, 2 on bad input (nothing started).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from spark_jobs._jobkit import Run, base_parser, run_ledger_job
from tieredcore.lifecycle.retention import plan_retention
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.lifecycle.work import OPTION_UNREADABLE, TopicWork
from tieredcore.workspace import Workspace

JOB = "retention_sweep"


def plan_units(ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, dry_run: bool = False) -> list[TopicWork]:
    """Retention units, then deletion-lag units without the ledgers retention trims (they go with all
    their copies); a topic's two units are adjacent (both update its record with a CAS, so any order
    is safe)."""
    namespaces = list(namespaces) if namespaces else None
    retention = plan_retention(ws, namespaces, as_of_ms, dry_run)
    trimmed = {w.topic: set(w.ledgers) for w in retention}
    lag: dict[str, TopicWork] = {}
    for w in plan_lag_cleanup(ws, namespaces, as_of_ms, dry_run):
        if w.options.get(OPTION_UNREADABLE):  # the topic's record cannot be read: one failed unit per topic
            if w.topic not in trimmed:
                lag[w.topic] = w
            continue
        ids = [lid for lid in w.ledgers if lid not in trimmed.get(w.topic, ())]
        if ids:
            lag[w.topic] = TopicWork(w.topic, w.kind, ids, w.as_of_ms, w.dry_run)
    out: list[TopicWork] = []
    for w in retention:
        out.append(w)
        if w.topic in lag:
            out.append(lag.pop(w.topic))
    return out + sorted(lag.values(), key=lambda w: w.topic)


def main(argv: Sequence[str] | None = None) -> int:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)

    def plan(run: Run):
        with Workspace(run.config) as ws:
            return plan_units(ws, args.namespace, run.as_of_ms, args.dry_run)

    return run_ledger_job(JOB, args, plan)


if __name__ == "__main__":
    sys.exit(main())
