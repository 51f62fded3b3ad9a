"""What every tiered-storage DAG shares: the ONE place that builds the project's SparkSubmitOperator
(standard conf, environment, names, application), default args, params, and the preflight / summary /
verdict tasks. No business rules: the object-store check is the plugin's TieredObjectStoreHook, the
Spark jobs' run-time environment the plugin's TieredSparkSubmitOperator; the summary only adds up the
totals the jobs' reports carry.

Parse time reads only the process environment (TIERED_CONFIG, TIERED_SPARK_JOBS_DIR, TIERED_PY_FILES,
TIERED_SPARK_UI, TIERED_SPARK_LOG_LEVEL, PYSPARK_PYTHON, schedules): no Airflow connection, Variable or
metadata-store access.
Everything else (the configuration file, the AWS connection, the metadata store) is read when a task
runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import (
    Asset,
    AssetAlias,
    AssetOrTimeSchedule,
    CronTriggerTimetable,
    Param,
    TriggerRule,
    get_current_context,
    task,
)
from tiered_airflow import TieredObjectStoreHook, TieredSparkSubmitOperator, on_failure, tiered_run_id

REPO_ROOT = Path(__file__).resolve().parent.parent
JOBS_DIR = Path(os.environ.get("TIERED_SPARK_JOBS_DIR") or REPO_ROOT / "spark_jobs")
START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SPARK_CONN_ID = "spark_default"
AWS_CONN_ID = "aws_default"
WASB_CONN_ID = "wasb_default"  # azure:// stores (tiered_hooks.azure_environment)
GCP_CONN_ID = "google_cloud_default"  # gs:// stores (tiered_hooks.gcs_environment)
# every Spark task runs in this pool (scripts/airflow-init.sh and docker-compose's airflow-init create it):
# its slots bound the concurrent spark-submits, so the quick Python tasks are never starved by them
SPARK_POOL = os.environ.get("TIERED_SPARK_POOL") or "spark"
TAGS = ["tiered-storage", "spark"]
# Spark's own log level in task logs (spark_jobs/log4j2.properties); the jobs' lines are not affected
SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")


def spark_log_level() -> str:
    """TIERED_SPARK_LOG_LEVEL (default WARN); a bad value fails the DAG import naming the variable."""
    level = (os.environ.get("TIERED_SPARK_LOG_LEVEL") or "WARN").strip().upper()
    if level not in SPARK_LOG_LEVELS:
        raise ValueError(f"TIERED_SPARK_LOG_LEVEL={os.environ.get('TIERED_SPARK_LOG_LEVEL')!r}: "
                         f"one of {', '.join(SPARK_LOG_LEVELS)}")
    return level


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


def schedule_from_env(var: str, default: str) -> str | None:
    """A cron expression or preset from the environment; "none" (or empty) disables scheduling."""
    value = os.environ.get(var, default).strip()
    return None if value.lower() in ("", "none", "null") else value


# -- assets: the DAGs chained by what they changed ----------------------------------------------------
# The sweep emits one OFFLOADED event per namespace it offloaded something in (extra: namespace, ledgers,
# bytes, segments, as_of); the deletion-lag cleanup runs on those events (or its clock), so hot copies
# go soon after their lag instead of at the next hourly slot. Retention and reconciliation emit one
# DELETIONS_PENDING event per namespace they appended deletion records for; the drain runs on those (or
# its clock). Events are added through an alias outlet, so a run that changed nothing emits none.
OFFLOADED = Asset(name="tiered_offloaded", uri="tiered://lifecycle/offloaded")
DELETIONS_PENDING = Asset(name="tiered_deletions_pending", uri="tiered://lifecycle/deletions-pending")
OFFLOAD_EVENTS = AssetAlias(name="tiered_offload_events")
DELETION_EVENTS = AssetAlias(name="tiered_deletion_events")


def asset_or_time(cron: str | None, asset: Asset) -> Any:
    """A run on each event of ``asset`` or on the ``cron`` clock (UTC), whichever comes first; None (no
    schedule at all) when the clock is disabled."""
    if cron is None:
        return None
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=asset)


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
    shared default args (owner, retries with backoff, the failure hook), base tags, the `config` /
    `dry_run` params; a scheduled DAG must say how long a run may take (``dagrun_timeout``: a run stuck
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
        params={"config": config_param(), "dry_run": dry_run_param(), **(params or {})},
    )


def config_param() -> Param:
    return Param(
        os.environ.get("TIERED_CONFIG", ""),
        type="string",
        title="Configuration file",
        description="Path of tiered.toml on the workers (default: $TIERED_CONFIG when the DAG was parsed; "
                    "TIERED_* environment variables of the workers override its values).",
    )


# the trigger form's own checks of names (tieredcore.names parses them again in the plan tasks)
NAME_PART = r"[A-Za-z0-9_.=:%-]+"
NAMESPACE_PATTERN = rf"^\s*{NAME_PART}/{NAME_PART}\s*$"
TOPIC_PATTERN = rf"^\s*(persistent://)?{NAME_PART}/{NAME_PART}/{NAME_PART}\s*$"


def namespaces_param(description: str = "tenant/namespace list; empty: every namespace.") -> Param:
    return Param([], type="array", items={"type": "string", "pattern": NAMESPACE_PATTERN}, title="Namespaces",
                 description=description)


def namespace_args(params: dict[str, Any]) -> list[str]:
    """``--namespace`` arguments of the ``namespaces`` param, each name validated (before Spark starts)."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.errors import ValidationError
    from tieredcore.names import NamespaceName

    out: list[str] = []
    try:
        for ns in params.get("namespaces") or []:
            out += ["--namespace", NamespaceName.parse(ns).name]
    except ValidationError as e:
        raise AirflowFailException(f"namespaces param: {e}") from None
    return out


def dry_run_param() -> Param:
    return Param(False, type="boolean", title="Dry run", description="Plan and report; change nothing.")


# -- the Spark task -----------------------------------------------------------------------------------


def pyspark_python() -> str:
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def spark_kwargs(task_id: str, job: str, **kw: Any) -> dict[str, Any]:
    """Arguments of the project's SparkSubmitOperator for `spark_jobs/<job>.py` (everything but
    application_args). `kw` overrides or adds operator arguments (conf and env_vars are merged)."""
    application = JOBS_DIR / f"{job}.py"
    python = pyspark_python()
    log4j = JOBS_DIR / "log4j2.properties"
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
        # the configuration the job loads; secrets (AWS, Azure, GCS) are added at submit time by the operator
        "TIERED_CONFIG": "{{ params.config }}",
        # the job keeps each try's report apart (attempt-<n>); the "Run report" link opens this try's
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
        "doc_md": f"spark-submit `{application}`; report: `<reports_dir>/{job}/<run id>/attempt-<try>/"
                  "summary.json`, the latest attempt's also as `<run id>/summary.json` (extra link *Run report*).",
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


def spark_task_per_namespace(task_id: str, job: str, planned: Any, **kw: Any):
    """One Spark task per namespace planned (argument lists starting ``--namespace <ns>``), each mapped
    task labelled by its namespace; a namespace the plan left out (nothing due) gets no task, and an
    empty plan skips the task altogether."""
    return spark_task_mapped(task_id, job, planned, map_index_template="{{ task.application_args[1] }}", **kw)


# -- run-time helpers (called inside tasks) ---------------------------------------------------------


def planned_namespaces(params: dict[str, Any], config: Any, enabled: str, what: str) -> list[str]:
    """The ``namespaces`` param, or every namespace whose policy enables ``enabled`` (``offload`` |
    ``compaction``), read from the metadata store now (at run time, never at parse time)."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.errors import TieredError
    from tieredcore.names import NamespaceName
    from tieredcore.workspace import Workspace

    try:
        if params.get("namespaces"):
            return sorted({NamespaceName.parse(n).name for n in params["namespaces"]})
        with Workspace(config) as ws:
            return getattr(ws.policies, f"namespaces_with_{enabled}")()
    except TieredError as e:
        raise AirflowFailException(f"planning the {what}: {e}") from None


def load_config(params: dict[str, Any]):
    """The run's configuration; a clear, non-retried failure when it cannot be loaded."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.config import Config
    from tieredcore.errors import ValidationError

    try:
        return Config.load(params.get("config") or None)
    except ValidationError as e:
        raise AirflowFailException(f"tiered configuration: {e}") from None


def as_of(context: dict[str, Any], field: str = "data_interval_end") -> str:
    """The run's logical time for the job's --as-of (ISO 8601): the data interval end (scheduled runs)
    or the logical date; a run without one (manual trigger without a date) uses its run_after."""
    when = context.get(field) or context["dag_run"].run_after
    return when.isoformat()


def as_of_ms(context: dict[str, Any], field: str = "data_interval_end") -> int:
    """:func:`as_of` in epoch milliseconds (the plan tasks' clock: the same one the job gets)."""
    from tieredcore.clock import parse_time_ms

    return parse_time_ms(as_of(context, field), "--as-of")


# XCom key of a plan task: what it left out because nothing was due (no Spark job for it)
NOTHING_DUE_KEY = "nothing_due"


def split_due(config: Any, names: Sequence[str], has_work: Any, what: str) -> tuple[list[str], list[str]]:
    """``names`` split into (work due, nothing due) by ``has_work(ws, name)``, tieredcore's own planning
    on one Workspace (the Spark job plans the same again on its driver, on the same --as-of clock), so
    a no-op costs a metadata read here instead of a spark-submit."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.errors import TieredError
    from tieredcore.workspace import Workspace

    due: list[str] = []
    idle: list[str] = []
    try:
        with Workspace(config) as ws:
            for name in names:
                (due if has_work(ws, name) else idle).append(name)
    except TieredError as e:
        raise AirflowFailException(f"planning the {what}: {e}") from None
    return due, idle


def deletions_due(ws: Any, at_ms: int) -> bool:
    """Does the deletion log hold a record due at ``at_ms``?"""
    from tieredcore.meta.deletion_log import DeletionLog

    return bool(DeletionLog(ws.metadata).due(at_ms, 1))


def job_args(context: dict[str, Any], *, as_of_field: str = "data_interval_end", namespace: str | None = None,
             extra: Sequence[str] = ()) -> list[str]:
    params = context["params"]
    args = ["--namespace", namespace] if namespace else []
    args += ["--as-of", as_of(context, as_of_field), "--run-id", tiered_run_id(context["run_id"], namespace)]
    if params.get("dry_run"):
        args.append("--dry-run")
    return args + list(extra)


def _run_ids(planned: Any) -> list[str]:
    """--run-id values of the planned job argument lists (one list, or a list of lists)."""
    if not planned:
        return []
    lists = planned if isinstance(planned[0], list) else [planned]
    out = []
    for args in lists:
        args = [str(a) for a in args]
        out.append(args[args.index("--run-id") + 1])
    return out


# streaming offload (PIP-76) totals of a report: segments written, their bytes, tails held for their rollover
SEGMENT_KEYS = ("segments", "segment_bytes", "segments_held")


def segments_text(d: dict[str, Any]) -> str:
    """'; N segment(s) (B bytes), H tail(s) held for their rollover' when a report has streaming totals."""
    if not any(d.get(k) for k in SEGMENT_KEYS):
        return ""
    held = d.get("segments_held", 0)  # streaming only: compaction writes segments but holds no tail
    return (f"; {d.get('segments', 0)} segment(s) ({d.get('segment_bytes', 0):,} bytes)"
            + (f", {held} tail(s) held for their rollover" if held else ""))


def counters_text(counters: dict[str, int] | None) -> str:
    """'; objects 48 → 4, bytes 34,502 → 29,852, deleted_hot=2': ``X_before`` / ``X_after`` pairs as
    before → after, other counters as name=value; '' without counters."""
    if not counters:
        return ""
    parts = []
    for k, v in counters.items():
        if k.endswith("_before") and k[:-7] + "_after" in counters:
            parts.append(f"{k[:-7]} {v:,} → {counters[k[:-7] + '_after']:,}")
        elif not (k.endswith("_after") and k[:-6] + "_before" in counters):
            parts.append(f"{k}={v}")
    return "; " + ", ".join(parts)


def summarize_reports(reports_dir: str, job: str, run_ids: Sequence[str]) -> dict[str, Any]:
    """Totals over `<reports_dir>/<job>/<run_id>/summary.json` of the run's jobs (each report's
    ``totals``: the same shape for every job, tieredcore.reports.Totals); a job without a report (it
    failed before writing one) counts in `failed_jobs`."""
    totals: dict[str, Any] = {"job": job, "jobs": len(run_ids), "topics": 0, "ledgers": 0, "bytes": 0,
                              "failures": 0, "failed_jobs": [], "outcomes": {}, "namespaces": {},
                              "reports": [], "data_loss": [], **dict.fromkeys(SEGMENT_KEYS, 0)}
    for rid in run_ids:
        path = Path(reports_dir) / job / rid / "summary.json"
        try:
            s = json.loads(path.read_text())["totals"]
        except (OSError, ValueError, KeyError, TypeError):
            totals["failed_jobs"].append(rid)
            continue
        totals["reports"].append(str(path))
        for k in ("topics", "ledgers", "bytes", "failures", *SEGMENT_KEYS):
            totals[k] += int(s.get(k, 0))
        for k, v in s.get("outcomes", {}).items():
            totals["outcomes"][k] = totals["outcomes"].get(k, 0) + v
        for k, v in s.get("counters", {}).items():
            counters = totals.setdefault("counters", {})
            counters[k] = counters.get(k, 0) + v
        totals["data_loss"] += s.get("data_loss", [])
        for ns, d in s.get("namespaces", {}).items():
            acc = totals["namespaces"].setdefault(ns, {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
            for k in ("ledgers", "bytes", "failures"):
                acc[k] += int(d.get(k, 0))
            for k in SEGMENT_KEYS:  # streaming namespaces only
                if k in d:
                    acc[k] = acc.get(k, 0) + int(d[k])
            for k, v in (d.get("counters") or {}).items():  # a job's own per-namespace counters (compaction)
                acc.setdefault("counters", {})[k] = acc.get("counters", {}).get(k, 0) + int(v)
            for k, v in (d.get("outcomes") or {}).items():
                acc["outcomes"][k] = acc["outcomes"].get(k, 0) + int(v)
    return totals


def combine_totals(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals of several jobs of one run (e.g. retention_sweep then deletion_drain): summed, with each
    job's own totals under `by_job`."""
    out: dict[str, Any] = {"job": "+".join(p["job"] for p in parts), "jobs": 0, "topics": 0, "ledgers": 0,
                           "bytes": 0, "failures": 0, "failed_jobs": [], "outcomes": {}, "namespaces": {},
                           "reports": [], "by_job": {p["job"]: p for p in parts}, **dict.fromkeys(SEGMENT_KEYS, 0)}
    for p in parts:
        for k in ("jobs", "topics", "ledgers", "bytes", "failures"):
            out[k] += p[k]
        for k in SEGMENT_KEYS:
            out[k] += p.get(k, 0)
        out["failed_jobs"] += [f"{p['job']}/{rid}" for rid in p["failed_jobs"]]
        out["reports"] += p["reports"]
        for k, v in p["outcomes"].items():
            out["outcomes"][f"{p['job']}.{k}"] = v
    return out


# -- tasks shared by the DAGs -------------------------------------------------------------------------


def preflight_task():
    @task(task_id="preflight", **QUICK_TASK)
    def preflight() -> str:
        """Fails fast with a clear message when the configuration does not load, or the configured
        metadata store (SQLite file, ZooKeeper) or object store is unreachable (before any Spark job)."""
        ctx = get_current_context()
        config = load_config(ctx["params"])
        meta = config.open_metadata()  # MetadataStoreError names the URL and why (e.g. ZooKeeper down)
        try:
            meta.children("/")
        finally:
            meta.close()
        print(f"preflight: metadata store {config.metadata_url}: reachable")
        result = TieredObjectStoreHook(config.store_url, aws_conn_id=AWS_CONN_ID, wasb_conn_id=WASB_CONN_ID,
                                       gcp_conn_id=GCP_CONN_ID).check()
        print(f"preflight: {config.store_url}: {result}")
        return result

    return preflight()


def summary_task(job: str | Sequence[str], plan_task_id: str = "plan"):
    """The run's totals. `job`: one job whose argument list(s) the plan task returns; or several jobs
    run one after the other, whose argument lists the plan task returns under their names
    (multiple_outputs: one XCom per job)."""
    jobs = [job] if isinstance(job, str) else list(job)

    @task(task_id="summary", trigger_rule=TriggerRule.ALL_DONE, **QUICK_TASK)
    def summary() -> dict[str, Any]:
        """Totals of the run's reports (topics, ledgers, bytes, failures; segments of streaming
        namespaces; a job's counters, e.g. compaction's objects and bytes before → after, per
        namespace too): the run's XCom and log."""
        ctx = get_current_context()
        parts = []
        config = None
        idle = ctx["ti"].xcom_pull(task_ids=plan_task_id, key=NOTHING_DUE_KEY) or []
        for j in jobs:
            if isinstance(job, str):
                planned = ctx["ti"].xcom_pull(task_ids=plan_task_id)
            else:
                planned = ctx["ti"].xcom_pull(task_ids=plan_task_id, key=j)
            if planned is None:
                totals = summarize_reports("", j, [])
                totals["failed_jobs"] = ["(not planned: an upstream task failed)"]
            else:
                config = config or load_config(ctx["params"])
                totals = summarize_reports(config.reports_dir, j, _run_ids(planned))
            parts.append(totals)
        totals = parts[0] if len(parts) == 1 else combine_totals(parts)
        totals["nothing_due"] = list(idle)
        if idle:
            print(f"{totals['job']}: nothing due, no Spark job: {', '.join(idle)}")
        for p in parts:
            print(f"{p['job']} summary: {p['jobs']} job(s), {p['topics']} topic(s), {p['ledgers']} "
                  f"ledger(s)/record(s), {p['bytes']:,} bytes, {p['failures']} failure(s), "
                  f"failed jobs: {p['failed_jobs'] or 'none'}; outcomes {p['outcomes']}"
                  + counters_text(p.get("counters")) + segments_text(p))
            for ns, d in sorted(p["namespaces"].items()):
                print(f"  {ns}: {d['ledgers']} ledger(s), {d['bytes']:,} bytes, {d['failures']} failure(s)"
                      + (f"; {d['outcomes']}" if d.get("outcomes") else "") + counters_text(d.get("counters"))
                      + segments_text(d))
            for what in p.get("data_loss", []):
                print(f"DATA LOSS: {what}: no copy of it can be read")
        return totals

    return summary()


def triggering_namespaces(context: dict[str, Any], asset: Asset) -> list[str]:
    """The namespaces named by the asset events that triggered this run ([] for a run on the clock or by
    hand)."""
    events = context.get("triggering_asset_events") or {}
    try:
        found = events[asset]
    except KeyError:
        return []
    return sorted({str(e.extra["namespace"]) for e in found if isinstance(e.extra, dict) and e.extra.get("namespace")})


def announce_task(alias: AssetAlias, asset: Asset, changed: Any):
    """The ``announce`` task: one event on ``asset`` (through ``alias``) per namespace the run changed,
    from the summary's totals: ``changed(totals) -> {namespace: extra}``. Nothing in a dry run."""

    @task(task_id="announce", outlets=[alias], trigger_rule=TriggerRule.ALL_DONE, **QUICK_TASK)
    def announce() -> list[str]:
        """Emits one asset event per namespace this run changed (they trigger the DAGs downstream)."""
        ctx: Any = get_current_context()
        totals = ctx["ti"].xcom_pull(task_ids="summary") or {}
        if ctx["params"].get("dry_run") or not totals:
            print(f"announce: no {asset.name} event (dry run or no summary)")
            return []
        per_ns = changed(totals)
        for ns, extra in sorted(per_ns.items()):
            ctx["outlet_events"][alias].add(asset, extra={"namespace": ns, **extra, "as_of": as_of(ctx),
                                                          "run_id": ctx["run_id"]})
        print(f"announce: {asset.name} event(s) for {len(per_ns)} namespace(s): {', '.join(sorted(per_ns)) or '-'}")
        return sorted(per_ns)

    return announce()


def offloaded_namespaces(totals: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Namespaces a sweep offloaded something in (ledgers, segments, replaced copies)."""
    out = {}
    for ns, d in totals.get("namespaces", {}).items():
        o = d.get("outcomes") or {}
        if o.get("offloaded") or o.get("replaced"):
            out[ns] = {"ledgers": int(d.get("ledgers", 0)), "bytes": int(d.get("bytes", 0)),
                       "segments": int(d.get("segments", 0))}
    return out


def verdict_task():
    @task(task_id="verdict", trigger_rule=TriggerRule.NONE_FAILED, **QUICK_TASK)
    def verdict() -> None:
        """Fails the run when a job reported failures (its Spark task failing fails this one too)."""
        from airflow.sdk.exceptions import AirflowFailException

        totals = get_current_context()["ti"].xcom_pull(task_ids="summary") or {}
        if totals.get("failures") or totals.get("failed_jobs"):
            lost = totals.get("data_loss") or []
            raise AirflowFailException(
                (f"DATA LOSS in {len(lost)} ledger(s): {', '.join(lost[:10])}; " if lost else "")
                + f"{totals.get('failures', 0)} ledger failure(s), jobs without a report: "
                f"{totals.get('failed_jobs') or 'none'}; see the run reports {totals.get('reports')}"
            )

    return verdict()
