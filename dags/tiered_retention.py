"""
### Retention (PIP-186 two-phase deletion: trim + deletion-lag cleanup, then drain)

Hourly (env `TIERED_RETENTION_SCHEDULE`: a cron expression or preset, `none` to disable), apply the
namespaces' retention and deletion-lag policies at the run's logical time, then drain the deletion log.

1. **preflight** — the configuration loads and the object store is reachable (fails fast, no retry).
2. **plan** — the jobs' arguments (namespace names validated before Spark starts): `--as-of` is the
   run's data-interval end, `--run-id` the run id.
3. **retention** — `spark-submit spark_jobs/retention_sweep.py`: phase 1 only. Ledgers past retention
   (time or size over both tiers, Pulsar's semantics) get their pending-deletion records (hot copy and
   every offload uuid) and are then removed from their topic; hot copies past the deletion lag (offloaded
   copy verified first) get a `ledger` record and then `bookkeeperDeleted`. Nothing is deleted here.
4. **drain** — `spark-submit spark_jobs/deletion_drain.py`: phase 2, deletes what the log names (after
   the still-in-use and ownership checks), retries with backoff, dead-letters what cannot be deleted.
   It runs when the retention job failed too (records already appended are still drained).
5. **summary** (runs even when jobs failed) — totals of both run reports as XCom and log (per job under
   `by_job`, the drain's PIP-186 counters included); **verdict** fails the run on any failure.
6. **announce** — one `tiered_deletions_pending` asset event per namespace retention trimmed or marked
   in (its records go to the `tiered_deletion_drain` DAG too, e.g. those retried later).

Idempotent: a rerun for the same logical date trims and drains only what is left; an older logical date
never deletes more (the jobs' only clock is `--as-of`). The `tiered_deletion_drain` DAG drains the same
log more often (records retried later, records of other producers). Params: `config` (tiered.toml),
`dry_run` (both jobs report what they would do and change nothing), `namespaces` (override list;
empty: every namespace).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import TriggerRule, get_current_context, task
from tiered_common import (
    DELETION_EVENTS,
    DELETIONS_PENDING,
    QUICK_TASK,
    announce_task,
    job_args,
    load_config,
    namespace_args,
    namespaces_param,
    preflight_task,
    schedule_from_env,
    spark_task,
    summary_task,
    tiered_dag,
    verdict_task,
)

JOB = "retention_sweep"
DRAIN_JOB = "deletion_drain"


def trimmed_or_marked(totals: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Namespaces whose ledgers retention trimmed or whose hot copies it marked: records appended."""
    part = (totals.get("by_job") or {}).get(JOB) or {}
    out = {}
    for ns, d in part.get("namespaces", {}).items():
        o = d.get("outcomes") or {}
        if o.get("trimmed") or o.get("marked"):
            out[ns] = {"trimmed": int(o.get("trimmed", 0)), "marked": int(o.get("marked", 0))}
    return out

with tiered_dag(
    "tiered_retention",
    description="Retention trim and deletion-lag cleanup (phase 1), then the deletion drain (phase 2) (Spark)",
    schedule=schedule_from_env("TIERED_RETENTION_SCHEDULE", "@hourly"),
    dagrun_timeout=dt.timedelta(hours=4),
    tags=["deletion", "retention"],
    doc_md=__doc__,
    params={
        "namespaces": namespaces_param("tenant/namespace list for retention and lag cleanup; empty: every "
                                       "namespace (the drain always covers the whole log)."),
    },
) as dag:

    @task(task_id="plan", multiple_outputs=True, **QUICK_TASK)
    def plan() -> dict[str, list[str]]:
        """The two jobs' arguments (namespace names validated here, before Spark starts)."""
        ctx: Any = get_current_context()
        load_config(ctx["params"])
        extra = namespace_args(ctx["params"])
        return {JOB: job_args(ctx, extra=extra), DRAIN_JOB: job_args(ctx)}

    planned = plan()
    preflight_task() >> planned
    retention = spark_task("retention", JOB, planned[JOB])
    # phase 2 also after a failed phase 1 (what it appended is drained), never without a plan
    drain = spark_task("drain", DRAIN_JOB, planned[DRAIN_JOB], trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS)
    retention >> drain
    summary = summary_task([JOB, DRAIN_JOB])
    drain >> summary
    [retention, drain, summary] >> verdict_task()
    summary >> announce_task(DELETION_EVENTS, DELETIONS_PENDING, trimmed_or_marked)
