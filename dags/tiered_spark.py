"""The ONE place that builds the project's SparkSubmitOperator for `spark_jobs/<job>.py`: standard conf,
environment, names, pool and application (the plugin's TieredSparkSubmitOperator adds the run-time
environment when it submits). Reads the process environment when a DAG is built (TIERED_SPARK_JOBS_DIR,
TIERED_PY_FILES, TIERED_SPARK_UI, TIERED_SPARK_LOG_LEVEL, PYSPARK_PYTHON), nothing else."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from tiered_airflow import TieredSparkSubmitOperator
from tiered_common import AWS_CONN_ID, GCP_CONN_ID, REPO_ROOT, SPARK_CONN_ID, SPARK_POOL, WASB_CONN_ID

# Spark's own log level in task logs (spark_jobs/log4j2.properties); the jobs' lines are not affected
SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")


def jobs_dir() -> Path:
    """Where the Spark jobs are: $TIERED_SPARK_JOBS_DIR, else this checkout's spark_jobs/."""
    return Path(os.environ.get("TIERED_SPARK_JOBS_DIR") or REPO_ROOT / "spark_jobs")


def spark_log_level() -> str:
    """TIERED_SPARK_LOG_LEVEL (default WARN); a bad value fails the DAG import naming the variable."""
    level = (os.environ.get("TIERED_SPARK_LOG_LEVEL") or "WARN").strip().upper()
    if level not in SPARK_LOG_LEVELS:
        raise ValueError(f"TIERED_SPARK_LOG_LEVEL={os.environ.get('TIERED_SPARK_LOG_LEVEL')!r}: "
                         f"one of {', '.join(SPARK_LOG_LEVELS)}")
    return level


def pyspark_python() -> str:
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def spark_kwargs(task_id: str, job: str, **kw: Any) -> dict[str, Any]:
    """Arguments of the project's SparkSubmitOperator for `spark_jobs/<job>.py` (everything but
    application_args). `kw` overrides or adds operator arguments (conf and env_vars are merged)."""
    jobs = jobs_dir()
    application = jobs / f"{job}.py"
    python = pyspark_python()
    log4j = jobs / "log4j2.properties"
    conf = {
        "spark.ui.enabled": "true" if os.environ.get("TIERED_SPARK_UI") == "1" else "false",
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
    }
    level = spark_log_level()
    if log4j.is_file():
        # Spark's INFO lines drowned the job's own in task logs: WARN unless TIERED_SPARK_LOG_LEVEL says
        # otherwise (client mode: spark-submit starts the driver JVM with these options)
        conf["spark.driver.extraJavaOptions"] = (f"-Dlog4j2.configurationFile={log4j.resolve().as_uri()} "
                                                 f"-Dtiered.spark.log.level={level}")
    conf.update(kw.pop("conf", None) or {})
    env_vars = {
        # the configuration the job loads (TIERED_CONFIG: the run's, checked against the allow-list) and the
        # secrets (AWS, Azure, GCS) are added at submit time by the operator
        # where the job writes its report (tieredcore.reports.report_place): its DAG run's part
        # <task_id>[.<map_index>], each try apart (attempt-<n>); the "Run report" link opens this try's
        "TIERED_DAG_ID": "{{ ti.dag_id }}",
        "TIERED_DAG_RUN_ID": "{{ run_id }}",  # unaltered: the job derives the run key
        "TIERED_TASK_ID": "{{ ti.task_id }}",
        "TIERED_MAP_INDEX": "{{ ti.map_index }}",
        "TIERED_ATTEMPT": "{{ ti.try_number }}",
        "PYSPARK_PYTHON": python,
    }
    env_vars.update(kw.pop("env_vars", None) or {})
    args: dict[str, Any] = {
        "task_id": task_id,
        "job": job,
        "application": str(application),
        "conn_id": SPARK_CONN_ID,
        "aws_conn_id": AWS_CONN_ID,
        "wasb_conn_id": WASB_CONN_ID,
        "gcp_conn_id": GCP_CONN_ID,
        "pool": SPARK_POOL,
        "name": f"tiered-{job}-{{{{ run_id }}}}",
        "conf": conf,
        "env_vars": env_vars,
        "doc_md": f"spark-submit `{application}`; report: `<reports_dir>/<dag id>/<run key>/<task id>[.<map index>]/"
                  "attempt-<try>/summary.json` (the latest try's also one level up; the run key is the run id "
                  "made one path component), added up with the run's other parts by the `summary` task into "
                  "`<run key>/run.json`. Extra link *Run report*: this try's report page.",
    }
    py_files = os.environ.get("TIERED_PY_FILES")
    if py_files:  # a zip of tieredcore + spark_jobs for clusters whose workers do not have the package
        args["py_files"] = py_files
    args.update(kw)
    return args


def spark_task(task_id: str, job: str, application_args: Any, **kw: Any) -> TieredSparkSubmitOperator:
    """One Spark task (application_args: a list, possibly templated, or an XComArg). An empty argument
    list (the plan found nothing due) skips the task: no spark-submit."""
    return TieredSparkSubmitOperator(application_args=application_args, **spark_kwargs(task_id, job, **kw))


def spark_task_mapped(task_id: str, job: str, application_args: Any, **kw: Any):
    """One Spark task per element of `application_args` (an XComArg of argument lists)."""
    return TieredSparkSubmitOperator.partial(**spark_kwargs(task_id, job, **kw)).expand(
        application_args=application_args
    )


# a shard's mapped task label: its namespaces (the arguments before --as-of), comma separated when they fit
# in 40 characters, else "first +N more" (tieredcore.lifecycle.shards.shard_label, the same rule)
SHARD_LABEL_TEMPLATE = (
    "{%- set a = task.application_args -%}{%- set ns = a[1:a.index('--as-of'):2] -%}"
    "{%- set joined = ns | join(', ') -%}"
    "{{ joined if joined | length <= 40 else ns[0] ~ ' +' ~ (ns | length - 1) ~ ' more' }}"
)


def spark_task_per_shard(task_id: str, job: str, planned: Any, **kw: Any):
    """One Spark task per shard planned (argument lists starting ``--namespace a --namespace b ...``,
    tieredcore.lifecycle.shards), each mapped task labelled by its shard's namespaces; namespaces the plan
    left out (nothing due) are in no shard, and an empty plan skips the task altogether."""
    return spark_task_mapped(task_id, job, planned, map_index_template=SHARD_LABEL_TEMPLATE, **kw)
