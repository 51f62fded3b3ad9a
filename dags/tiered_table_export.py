"""
### Iceberg export: offloaded ledgers into Iceberg tables, exactly once

Daily (env `TIERED_EXPORT_SCHEDULE`: a cron expression or preset, `none` to disable) **and** on each
`tiered_offloaded` asset event of the offload sweep (a run per batch of events, covering the namespaces they
name; the clock's run covers every namespace). Every offloaded, sealed ledger closed at or before the run's
logical time (data-interval end) that its table does not hold yet is written into Iceberg tables
(pyiceberg SQL catalog: SQLite in the workspace by default, `export_catalog_url` / `export_warehouse` in the
configuration): one table per topic, or per namespace (`tiered export-settings NS --layout namespace`),
partitioned by day of publish time; with a JSON schema, a typed `value` column and a `<table>_dlq` table for
payloads that do not match. The exported ledgers are recorded in the table's own commit: a rerun, a retry
or an overlapping run never adds a ledger twice (docs/export.md).

1. **preflight** — configuration loads, object store reachable (fails fast).
2. **plan** — the job's arguments (`--as-of` = data-interval end, `--run-id`, namespaces, `orphan_age`).
3. **export** — `spark-submit spark_jobs/export_tables.py`: executors read the parts and write Parquet, the
   driver commits per table.
4. **summary** (runs even when the job failed) — per namespace: tables, ledgers, rows, bytes, DLQ rows;
   **verdict** fails the run when a ledger could not be read or committed (the next run retries it).

Params: `config` (only with an allow-list), `dry_run` (plan only), `namespaces` (empty: every namespace, or on
asset events the namespaces they name), `orphan_age` (seconds: uncommitted files older than this are deleted).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_assets import OFFLOADED, asset_or_time, schedule_from_env, triggering_namespaces
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args, namespace_args, namespaces_param
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "export_tables"

with tiered_dag(
    "tiered_table_export",
    description="Export offloaded ledgers into Iceberg tables, exactly once (Spark + pyiceberg)",
    schedule=asset_or_time(schedule_from_env("TIERED_EXPORT_SCHEDULE", "@daily"), OFFLOADED),
    dagrun_timeout=dt.timedelta(hours=12),
    tags=["export", "iceberg"],
    doc_md=__doc__,
    params={
        "namespaces": namespaces_param(),
        "orphan_age": Param(3600, type="integer", minimum=0, maximum=7 * 24 * 3600, title="Orphan age (s)",
                            description="Data files no snapshot references and older than this are deleted after "
                                        "the commit (an overlapping run's files are younger)."),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The export job's arguments (params validated here, before Spark starts)."""
        from airflow.sdk.exceptions import AirflowFailException

        ctx: Any = get_current_context()
        params = ctx["params"]
        load_config(params)
        age = params.get("orphan_age", 3600)
        if isinstance(age, bool) or not isinstance(age, int) or age < 0:
            raise AirflowFailException(f"orphan_age param {age!r}: a whole number of seconds >= 0")
        extra = namespace_args(params)
        if not extra:  # a run on the sweep's events: the namespaces it offloaded in
            for ns in triggering_namespaces(ctx, OFFLOADED):
                extra += ["--namespace", ns]
        return job_args(ctx, extra=extra + ["--orphan-age", str(age)])

    standard_pipeline(plan, lambda planned: spark_task("export", JOB, planned), JOB)
