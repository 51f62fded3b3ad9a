"""
### Deletion drain (PIP-186 two-phase deletion, phase 2)

Every 10 minutes (env `TIERED_DRAIN_SCHEDULE`: a cron expression or preset, `none` to disable) and on each
`tiered_deletions_pending` asset event (retention and orphan reconciliation appended records), process
the pending-deletion records due at the run's logical time: the records appended by retention, the
deletion-lag cleanup, offload retries, topic deletion and orphan reconciliation.

1. **preflight** — the configuration loads and the object store is reachable (fails fast, no retry).
2. **plan** — the job's arguments: `--as-of` = data-interval end, `--run-id` from the run id,
   `--max-attempts`, `--retry-delay-ms`. With no record due at the run's clock there is no Spark job
   (the run ends in seconds).
3. **drain** — `spark-submit spark_jobs/deletion_drain.py`: for each record, the still-in-use check
   against current metadata and the ownership check (hot ledger custom metadata / object owner), then
   idempotent deletes batched per object store over Spark tasks; a failed delete is retried later with
   doubling delay up to `max_attempts`, then dead-lettered; malformed records are dead-lettered at once.
4. **summary** (runs even when the job failed) — the run report's counts per outcome and PIP-186
   counters as XCom and log; **verdict** fails the run when anything was dead-lettered (an operator is
   needed: `tiered deletions dlq list`) or a Spark task failed. A record that will be retried is not a
   failure.

Safe to run next to the `tiered_retention` DAG's drain (several consumers are safe). Params: `config` (only with an allow-list),
`dry_run` (report what would be deleted, change nothing), `max_attempts`, `retry_delay_ms`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_assets import DELETIONS_PENDING, asset_or_time, schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import as_of_ms, job_args
from tiered_pipeline import NOTHING_DUE_KEY, deletions_due, split_due, standard_pipeline
from tiered_spark import spark_task

JOB = "deletion_drain"
# the job's defaults (tieredcore.meta.deletion_log); not imported: parse time stays light
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_DELAY_MS = 600_000

with tiered_dag(
    "tiered_deletion_drain",
    description="Drain the deletion log: delete pending ledgers and objects in both tiers (Spark)",
    schedule=asset_or_time(schedule_from_env("TIERED_DRAIN_SCHEDULE", "*/10 * * * *"), DELETIONS_PENDING),
    dagrun_timeout=dt.timedelta(hours=2),
    tags=["deletion"],
    doc_md=__doc__,
    params={
        "max_attempts": Param(DEFAULT_MAX_ATTEMPTS, type="integer", minimum=1, title="Max attempts",
                              description="Dead-letter a record after this many failed delete attempts."),
        "retry_delay_ms": Param(DEFAULT_RETRY_DELAY_MS, type="integer", minimum=0, title="Retry delay (ms)",
                                description="Delay before the first retry of a failed delete, doubled per attempt."),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The drain job's arguments (params checked here, before Spark starts)."""
        from airflow.sdk.exceptions import AirflowFailException

        ctx: Any = get_current_context()
        params = ctx["params"]
        config = load_config(params)
        attempts, delay = params.get("max_attempts"), params.get("retry_delay_ms")
        for name, value, low in (("max_attempts", attempts, 1), ("retry_delay_ms", delay, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AirflowFailException(f"{name} must be an integer >= {low}, got {value!r}")
        at = as_of_ms(ctx)
        due, _ = split_due(config, ["deletion log"], lambda ws, _: deletions_due(ws, at), "drain")
        if not due:
            print("drain plan: no deletion record due: no Spark job")
            ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=["deletion log"])
            return []
        return job_args(ctx, extra=["--max-attempts", str(attempts), "--retry-delay-ms", str(delay)])

    standard_pipeline(plan, lambda planned: spark_task("drain", JOB, planned), JOB)
