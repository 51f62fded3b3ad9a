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

Parse time reads only the process environment (TIERED_CONFIG_ALLOWED, TIERED_SPARK_JOBS_DIR,
TIERED_PY_FILES, TIERED_SPARK_UI, TIERED_SPARK_LOG_LEVEL, PYSPARK_PYTHON, schedules, TIERED_CATCHUP_WINDOW):
no Airflow connection, Variable or metadata-store access.

Catch-up and backfills (README "Backfills", docs/deploy.md "Catch-up and backfills"): a scheduled DAG
runs one slot at a time, oldest first; after an outage the scheduler runs each missed slot of the last
TIERED_CATCHUP_WINDOW (tiered_timetables.CatchUpCronTimetable), and every run of a scheduled DAG starts
with the ``wait_turn`` gate (tiered_pipeline.py): it waits while an older run of the DAG (a backfill's)
is unfinished, so each slot does its own work.

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
from tiered_timetables import CatchUpCronTimetable

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


def duration_from_env(var: str, default: str) -> dt.timedelta:
    """A duration from the environment: seconds, or a number with s / m / h / d (``90m``, ``6h``)."""
    text = (os.environ.get(var) or default).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        raise ValueError(f"{var}={text!r}: a duration like 90m, 6h or 1d (a number is seconds)") from None
    if seconds < 0:
        raise ValueError(f"{var}={text!r}: must not be negative")
    return dt.timedelta(seconds=seconds)


# how far back the scheduler catches up missed slots after an outage (or a pause): each one a run of its
# own, oldest first; 0 runs only the newest slot (Airflow's catchup=False)
CATCHUP_WINDOW = duration_from_env("TIERED_CATCHUP_WINDOW", "6h")


CATCH_UP_DOC = (
    "\n**One slot at a time, oldest first.** A run starts with `wait_turn`: it waits while an older run of "
    "this DAG is running or a backfill's older run is queued (at most TIERED_GATE_MAX_WAIT), so each run, "
    "a backfill's included, does its own slot's work. After an outage the scheduler runs each missed slot "
    "of the last TIERED_CATCHUP_WINDOW. README \"Catch-up and backfills\".\n")


def cron_clock(cron: str) -> CatchUpCronTimetable:
    """The scheduled DAGs' clock: ``cron`` in UTC, catching up the missed slots of CATCHUP_WINDOW."""
    return CatchUpCronTimetable(cron, timezone="UTC", window=CATCHUP_WINDOW)

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


def schedule_text(schedule: Any) -> str:
    """What a DAG's schedule is, in words, both halves of an asset-or-time one: the DAG list shows only
    the asset of such a schedule, so the DAG's description says it (tiered_dag)."""
    if schedule is None:
        return "manual (no schedule)"
    clock = getattr(schedule, "timetable", schedule)
    cron = getattr(clock, "expression", None) or str(clock)
    when = f"cron {cron} UTC ({getattr(clock, 'description', '') or cron})"
    from airflow.sdk import Asset, AssetOrTimeSchedule

    if not isinstance(schedule, AssetOrTimeSchedule):
        return when
    condition = schedule.asset_condition
    assets = [condition] if isinstance(condition, Asset) else list(getattr(condition, "objects", [condition]))
    assets = sorted({getattr(a, "name", None) or str(a) for a in assets})
    return f"on each {' or '.join(assets)} asset event, or {when}, whichever comes first"


def tiered_dag(
    dag_id: str,
    *,
    description: str,
    schedule: Any,
    doc_md: str | None,
    tags: Sequence[str] = (),
    params: dict[str, Any] | None = None,
    max_active_runs: int = 1,
    dagrun_timeout: dt.timedelta | None = None,
):
    """The project's DAG conventions in one place: start date, catch-up of the missed slots of
    CATCHUP_WINDOW (``schedule``: a cron expression or preset, run on :func:`cron_clock`; or an
    asset-or-time schedule from tiered_assets.asset_or_time), one run at a time, shared default args
    (owner, retries with backoff, the failure hook), base tags, the `dry_run` param (and `config` when an admin allows a choice); a
    scheduled DAG must say how long a run may take (``dagrun_timeout``: a run stuck longer fails, and the
    next scheduled run can start). The description and doc_md end with what the schedule is, both halves
    of an asset-or-time one (the DAG list shows the description)."""
    from airflow.sdk import DAG

    if schedule is not None and dagrun_timeout is None:
        raise ValueError(f"{dag_id}: a scheduled DAG needs a dagrun_timeout")
    if isinstance(schedule, str):
        schedule = cron_clock(schedule)
    when = schedule_text(schedule)
    return DAG(
        dag_id=dag_id,
        description=f"{description}. Schedule: {when}",
        schedule=schedule,
        dagrun_timeout=dagrun_timeout,
        on_failure_callback=on_failure,
        start_date=START_DATE,
        catchup=schedule is not None,
        max_active_runs=max_active_runs,
        default_args=DEFAULT_ARGS,
        tags=[*TAGS, *tags],
        doc_md=None if doc_md is None else f"{doc_md.rstrip()}\n\n**Schedule:** {when}\n" + (
            "" if schedule is None else CATCH_UP_DOC),
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
