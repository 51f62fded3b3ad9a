"""The project's DAG conventions, shared by every tiered-storage DAG: connections, the Spark pool, default
args, the `tiered_dag` factory and the run's configuration. The rest lives by role beside it:
``tiered_params.py`` (params, name patterns, the jobs' arguments), ``tiered_assets.py`` (assets, aliases,
schedules, asset events), ``tiered_spark.py`` (the ONE place that builds the project's
SparkSubmitOperator) and ``tiered_pipeline.py`` (preflight / summary / verdict tasks and the standard
plan → spark → summary → verdict → announce wiring). No business rules: the object-store check is the
plugin's TieredObjectStoreHook, the Spark jobs' run-time environment the plugin's
TieredSparkSubmitOperator; the summary only adds up the totals the jobs' reports carry
(tieredcore.reports.RunReports).

The configuration is the deployment's: ``TIERED_CONFIG`` in the workers' environment; an admin may allow
a run to choose among more files (``TIERED_CONFIG_ALLOWED``, separated like PATH: the forms' `config`
drop-down); a run cannot name any other file (``load_config``).

Parse time reads only the process environment (TIERED_CONFIG_ALLOWED, TIERED_SPARK_JOBS_DIR, TIERED_PY_FILES,
TIERED_SPARK_UI, TIERED_SPARK_LOG_LEVEL, PYSPARK_PYTHON, schedules): no Airflow connection, Variable or
metadata-store access.
Everything else (the configuration file, the AWS connection, the metadata store) is read when a task
runs.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiered_airflow import ConfigNotAllowed, on_failure, run_config_path
from tiered_params import config_param, dry_run_param

REPO_ROOT = Path(__file__).resolve().parent.parent
START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SPARK_CONN_ID = "spark_default"
AWS_CONN_ID = "aws_default"
WASB_CONN_ID = "wasb_default"  # azure:// stores (tiered_hooks.azure_environment)
GCP_CONN_ID = "google_cloud_default"  # gs:// stores (tiered_hooks.gcs_environment)
# every Spark task runs in this pool (scripts/airflow-init.sh and docker-compose's airflow-init create it):
# its slots bound the concurrent spark-submits, so the quick Python tasks are never starved by them
SPARK_POOL = os.environ.get("TIERED_SPARK_POOL") or "spark"
TAGS = ["tiered-storage", "spark"]

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "tiered",
    "on_failure_callback": on_failure,  # the alerting hook point (TIERED_ON_FAILURE_CALLBACK)
    "retries": 3,
    "retry_delay": dt.timedelta(minutes=1),
    "retry_exponential_backoff": True,
    "max_retry_delay": dt.timedelta(minutes=30),
    "execution_timeout": dt.timedelta(hours=2),
}
# Python-side checks and bookkeeping: short; bad input or an unreachable store is not retried (the
# next scheduled run tries again), so they fail fast
QUICK_TASK: dict[str, Any] = {"retries": 0, "execution_timeout": dt.timedelta(minutes=10)}


def tiered_dag(
    dag_id: str,
    *,
    description: str,
    schedule: str | None,
    doc_md: str | None,
    tags: Sequence[str] = (),
    params: dict[str, Any] | None = None,
    max_active_runs: int = 1,
    dagrun_timeout: dt.timedelta | None = None,
):
    """The project's DAG conventions in one place: start date, no catchup, one run at a time (sweeps),
    shared default args (owner, retries with backoff, the failure hook), base tags, the `dry_run` param
    (and `config` when an admin allows a choice); a scheduled DAG must say how long a run may take (``dagrun_timeout``: a run stuck
    longer fails, and the next scheduled run can start)."""
    from airflow.sdk import DAG

    if schedule is not None and dagrun_timeout is None:
        raise ValueError(f"{dag_id}: a scheduled DAG needs a dagrun_timeout")
    return DAG(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        dagrun_timeout=dagrun_timeout,
        on_failure_callback=on_failure,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=max_active_runs,
        default_args=DEFAULT_ARGS,
        tags=[*TAGS, *tags],
        doc_md=doc_md,
        params={**shared_params(), **(params or {})},
    )


def shared_params() -> dict[str, Any]:
    """Every DAG's params: ``dry_run``, and ``config`` only when an admin allows a choice of files."""
    config = config_param()
    return {**({"config": config} if config is not None else {}), "dry_run": dry_run_param()}


def load_config(params: dict[str, Any]):
    """The run's configuration: the deployment's ($TIERED_CONFIG of the worker), or the allowed file the
    run's ``config`` param names (tiered_airflow.run_config_path: any other value fails the task before
    a file is read); a clear, non-retried failure when it cannot be loaded."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.config import Config
    from tieredcore.errors import ValidationError

    try:
        return Config.load(run_config_path(params))
    except ConfigNotAllowed as e:
        raise AirflowFailException(str(e)) from None
    except ValidationError as e:
        raise AirflowFailException(f"tiered configuration: {e}") from None
