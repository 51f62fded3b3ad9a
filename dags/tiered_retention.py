"""
### Retention (PIP-186 two-phase deletion: trim + deletion-lag cleanup, then drain)

Hourly (env `TIERED_RETENTION_SCHEDULE`: a cron expression or preset, `none` to disable), apply the
namespaces' retention and deletion-lag policies at the run's logical time, then drain the deletion log.

1. **preflight** — the configuration loads and the object store is reachable (fails fast, no retry).
2. **plan** — the jobs' arguments (namespace names validated before Spark starts): `--as-of` is the
   run's data-interval end, `--run-id` the run id. Planned here with tieredcore at the run's clock: with
   nothing past retention or its lag there is no retention job, and with no deletion record due either
   no drain (an idle hour costs seconds).
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
log more often (records retried later, records of other producers). Params: `config` (only with an allow-list),
`dry_run` (both jobs report what they would do and change nothing), `namespaces` (override list;
empty: every namespace).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import TriggerRule, get_current_context, task
from tiered_assets import DELETION_EVENTS, DELETIONS_PENDING, Announcement, schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import as_of_ms, job_args, namespace_args, namespaces_param
from tiered_pipeline import NOTHING_DUE_KEY, deletions_due, split_due, standard_pipeline
from tiered_spark import spark_task

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
        """The two jobs' arguments (namespace names validated here, before Spark starts); a job with
        nothing due gets [] (its Spark task is skipped): no ledger past retention or hot copy past its
        lag -> no retention job; and no deletion record due either -> no drain."""
        from tieredcore.lifecycle.retention import plan_retention
        from tieredcore.lifecycle.sweep import plan_lag_cleanup

        ctx: Any = get_current_context()
        config = load_config(ctx["params"])
        extra = namespace_args(ctx["params"])
        at = as_of_ms(ctx)
        namespaces = extra[1::2] or None
        phase1, _ = split_due(config, ["phase 1"], lambda ws, _: bool(
            plan_retention(ws, namespaces, at) or plan_lag_cleanup(ws, namespaces, at)), "retention")
        phase2, _ = split_due(config, ["phase 2"], lambda ws, _: deletions_due(ws, at), "retention")
        idle = [what for what, due in (("retention", phase1), ("deletion log", phase1 or phase2)) if not due]
        if idle:
            print(f"retention plan: nothing due for: {', '.join(idle)} (no Spark job)")
            ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=idle)
        return {JOB: job_args(ctx, extra=extra) if phase1 else [],
                DRAIN_JOB: job_args(ctx) if phase1 or phase2 else []}

    def phases(planned: Any) -> list[Any]:
        """Phase 1, then phase 2 also after a failed phase 1 (what it appended is drained), never without
        a plan."""
        retention = spark_task("retention", JOB, planned[JOB])
        drain = spark_task("drain", DRAIN_JOB, planned[DRAIN_JOB], trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS)
        retention >> drain
        return [retention, drain]

    standard_pipeline(plan, phases, [JOB, DRAIN_JOB],
                      announce=Announcement(DELETION_EVENTS, DELETIONS_PENDING, trimmed_or_marked))
