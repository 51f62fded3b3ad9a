"""
### Deletion-lag cleanup (hot copies of offloaded ledgers)

Hourly (env `TIERED_LAG_CLEANUP_SCHEDULE`: a cron expression or preset, `none` to disable) **and** on each
`tiered_offloaded` asset event of the offload sweep (a run per batch of events, covering the namespaces
they name; the hourly run covers every namespace), so hot copies go soon after their lag: delete the
hot-tier (BookKeeper-role) copies of ledgers whose offload completed more than the namespace's
deletion lag before the run's logical time, after verifying the offloaded copy opens and matches the
metadata; then mark `bookkeeperDeleted`. A copy whose offloaded object fails verification is never
deleted (it is reported as a failure).

1. **preflight** — configuration loads, object store reachable (fails fast).
2. **plan** — the job's arguments: `--as-of` = data-interval end, `--run-id` from the run id. Planned
   here with tieredcore's own planning at the run's clock: with no hot copy past its lag and no deletion
   record due, there is no Spark job (the run ends in seconds).
3. **cleanup** — `spark-submit spark_jobs/deletion_lag_cleanup.py` (then it drains what is due).
4. **summary** (runs even when the job failed) — totals from the run report as XCom and log;
   **verdict** fails the run on failures.

Idempotent: a rerun redoes only what is left; an older logical date never deletes early.
Params: `config` (only with an allow-list), `dry_run`, `namespaces` (override list; empty: every namespace, or on asset events
the namespaces they name).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import get_current_context, task
from tiered_assets import OFFLOADED, asset_or_time, schedule_from_env, triggering_namespaces
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import as_of_ms, job_args, namespace_args, namespaces_param
from tiered_pipeline import NOTHING_DUE_KEY, deletions_due, split_due, standard_pipeline
from tiered_spark import spark_task

JOB = "deletion_lag_cleanup"

with tiered_dag(
    "tiered_deletion_lag_cleanup",
    description="Delete hot copies of offloaded ledgers past the deletion lag (Spark)",
    schedule=asset_or_time(schedule_from_env("TIERED_LAG_CLEANUP_SCHEDULE", "@hourly"), OFFLOADED),
    dagrun_timeout=dt.timedelta(hours=3),
    tags=["deletion"],
    doc_md=__doc__,
    params={
        "namespaces": namespaces_param(),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The cleanup job's arguments (namespace names validated here, before Spark starts); [] when
        nothing is due (the Spark task is skipped)."""
        from tieredcore.lifecycle.sweep import plan_lag_cleanup

        ctx: Any = get_current_context()
        config = load_config(ctx["params"])
        extra = namespace_args(ctx["params"])
        if not extra:  # a run on the sweep's events: the namespaces it offloaded in
            for ns in triggering_namespaces(ctx, OFFLOADED):
                extra += ["--namespace", ns]
        at = as_of_ms(ctx)
        namespaces = extra[1::2] or None
        due, _ = split_due(config, ["run"], lambda ws, _: bool(plan_lag_cleanup(ws, namespaces, at))
                           or deletions_due(ws, at), "deletion-lag cleanup")
        if not due:
            print("lag cleanup plan: no hot copy past its deletion lag, no deletion due: no Spark job")
            ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=[", ".join(namespaces or ["every namespace"])])
            return []
        return job_args(ctx, extra=extra)

    standard_pipeline(plan, lambda planned: spark_task("cleanup", JOB, planned), JOB)
