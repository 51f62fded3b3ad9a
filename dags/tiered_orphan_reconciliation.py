"""
### Orphan reconciliation (both tiers)

Daily (env `TIERED_RECONCILE_SCHEDULE`: a cron expression or preset, `none` to disable), find what leaked
anyway: objects in the object store that no metadata and no pending deletion references, hot-tier
ledgers whose topic does not list them, and stale incomplete multipart uploads, all older than the
grace period before the run's logical time.

1. **preflight** — the configuration loads and the object store is reachable (fails fast, no retry).
2. **plan** — the job's arguments (the grace period validated before Spark starts): `--as-of` = the
   data-interval end, `--run-id` from the run id, `--grace`, `--apply`.
3. **reconcile** — `spark-submit spark_jobs/reconcile_orphans.py`: Spark lists the store (split by key
   prefix), anti-joins it with the referenced uuids, and appends one `offloaded` record (reason
   `orphan`) per orphan group and one `ledger` record per hot orphan; stale uploads are aborted. Keys
   this project did not write are counted, never touched. It deletes nothing itself: the records are
   deleted by the `tiered_deletion_drain` DAG (after the drain's own still-in-use checks).
4. **summary** (runs even when the job failed) — orphan records, bytes, per-namespace counts as XCom and
   log (the report also has the oldest orphan age and sample keys); **verdict** fails the run when the
   job reported errors (a listing, an append or an abort failed).
5. **announce** — one `tiered_deletions_pending` asset event per namespace orphan records were appended
   for: the `tiered_deletion_drain` DAG runs on them.

Params: `config` (only with an allow-list), `dry_run` (write the report only: no record appended, no upload aborted),
`grace` (e.g. `1h`, `90m`, `3600s` or milliseconds; empty: the workspace's default, 1h, or 7d when
attached to a Pulsar cluster), `apply` (attached to a Pulsar cluster, docs/pulsar.md: append the records;
without it such a run only plans; elsewhere runs apply unless `dry_run`). `apply` and `dry_run` together
fail the run in **plan**, before Spark starts. The report lists every candidate (key, size, age, why) and
what was withheld and why.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_airflow import DURATION_FORMAT
from tiered_assets import DELETION_EVENTS, DELETIONS_PENDING, Announcement, schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args, optional_param
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "reconcile_orphans"


def orphans_recorded(totals: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Namespaces the run appended orphan records for (none when nothing was appended, e.g. a dry run)."""
    if not (totals.get("outcomes") or {}).get("records_appended"):
        return {}
    return {ns: {"orphans": int(d.get("ledgers", 0)), "bytes": int(d.get("bytes", 0))}
            for ns, d in totals.get("namespaces", {}).items() if d.get("ledgers")}

with tiered_dag(
    "tiered_orphan_reconciliation",
    description="Find orphan objects, hot ledgers and uploads in both tiers; append deletion records (Spark)",
    schedule=schedule_from_env("TIERED_RECONCILE_SCHEDULE", "@daily"),
    dagrun_timeout=dt.timedelta(hours=6),
    tags=["deletion", "reconciliation"],
    doc_md=__doc__,
    params={
        "grace": optional_param(DURATION_FORMAT, "Grace period",
                               "Only orphans older than this before the logical time are reported "
                               "(e.g. 1h, 90m, 3600s, or milliseconds); protects in-flight offloads. Empty: "
                               "the workspace's default, 1h, or 7d on a workspace attached to a Pulsar "
                               "cluster (well above the brokers' offload deletion lag, 4h by default, and "
                               "the longest offload)."),
        "apply": Param(False, type="boolean", title="Apply (attached to a Pulsar cluster)",
                       description="On a workspace attached to a Pulsar cluster, append the deletion records "
                                   "(the drain then deletes the orphans from the brokers' bucket); off, the run "
                                   "only plans and reports. Other workspaces apply unless Dry run is set. "
                                   "Not together with Dry run."),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The reconciliation job's arguments (the grace period checked here, before Spark starts)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import ValidationError
        from tieredcore.units import non_negative_duration_ms

        ctx: Any = get_current_context()
        params = ctx["params"]
        load_config(params)
        grace = str(params.get("grace") or "").strip()
        if params.get("apply") and params.get("dry_run"):
            raise AirflowFailException("apply and dry_run params contradict each other: set one")
        try:
            if grace:
                non_negative_duration_ms(grace, "grace")
        except ValidationError as e:
            raise AirflowFailException(f"grace param: {e}") from None
        return job_args(ctx, extra=(["--grace", grace] if grace else []) + (["--apply"] if params.get("apply") else []))

    standard_pipeline(plan, lambda planned: spark_task("reconcile", JOB, planned), JOB,
                      announce=Announcement(DELETION_EVENTS, DELETIONS_PENDING, orphans_recorded))
