"""The standard pipeline every tiered-storage DAG ends with, so a DAG file reads as its own steps only:

    preflight >> plan >> spark task(s) >> summary >> verdict, summary >> announce

``standard_pipeline`` wires it from the DAG's plan task and its Spark step; ``preflight_task`` (the
configuration loads, the stores answer), ``summary_task`` (every part of the DAG run's reports added up
through tieredcore.reports: the run's ``run.json``, the summary XCom and log) and ``verdict_task`` (fails
the run on failures, missing parts and data loss) are its shared tasks, ``split_due`` / ``deletions_due`` / ``NOTHING_DUE_KEY`` what plan tasks use to skip
a Spark job when nothing is due."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import TriggerRule, get_current_context, task
from tiered_airflow import TieredObjectStoreHook
from tiered_assets import Announcement, announce_task
from tiered_common import AWS_CONN_ID, GCP_CONN_ID, QUICK_TASK, WASB_CONN_ID, load_config
from tiered_params import as_of

from tieredcore.reports import RunReports, planned_parts, report_name, run_record, verdict_message
from tieredcore.run_totals import summary_lines

# XCom key of a plan task: what it left out because nothing was due (no Spark job for it)
NOTHING_DUE_KEY = "nothing_due"


def standard_pipeline(plan: Callable[[], Any], spark: Callable[[Any], Any], jobs: str | Sequence[str], *,
                      preflight: bool = True, announce: Announcement | None = None) -> None:
    """The DAG's tasks after its own: ``plan()`` (the plan task; after the preflight check unless
    ``preflight`` is False), the Spark task(s) ``spark(planned)`` builds on the plan's XCom (one task, or
    a list whose last one runs last), the ``summary`` of ``jobs``' reports, the ``verdict`` over the
    Spark tasks and the summary, and, with ``announce``, the asset events of what the run changed."""
    planned = plan()
    if preflight:
        preflight_task() >> planned
    built = spark(planned)
    spark_tasks = list(built) if isinstance(built, list | tuple) else [built]
    job_names = [jobs] if isinstance(jobs, str) else list(jobs)
    if len(job_names) != len(spark_tasks):
        raise ValueError(f"standard_pipeline: {len(spark_tasks)} Spark task(s) for job(s) {job_names}: one each")
    summary = summary_task(jobs, plan_task_id=planned.operator.task_id,
                           task_ids=[t.task_id for t in spark_tasks])
    spark_tasks[-1] >> summary
    [*spark_tasks, summary] >> verdict_task()
    if announce is not None:
        summary >> announce_task(announce)


# -- planning: nothing due, no Spark job ------------------------------------------------------------


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


# -- the shared tasks -------------------------------------------------------------------------------


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
        if config.attached:  # a configuration from the environment only: the attach checks (reads only)
            from airflow.sdk.exceptions import AirflowFailException

            from tieredcore.attach import check_attach
            from tieredcore.errors import AttachError

            try:
                _, found = check_attach(config, cluster_given=True, brokers_default=config.brokers_default)
            except AttachError as e:
                raise AirflowFailException(f"preflight: {e}") from None
            print(f"preflight: attached to Pulsar cluster {found.cluster!r}, {len(found.namespaces)} namespace(s); "
                  "the bucket is " + (f"named by the policies of {', '.join(found.named_by)}" if found.named_by
                                        else "the brokers' default (as stated)"))
        result = TieredObjectStoreHook(config.store_url, aws_conn_id=AWS_CONN_ID, wasb_conn_id=WASB_CONN_ID,
                                       gcp_conn_id=GCP_CONN_ID).check()
        print(f"preflight: {config.store_url}: {result}")
        return result

    return preflight()


def summary_task(job: str | Sequence[str], plan_task_id: str = "plan", task_ids: Sequence[str] | None = None):
    """The run's totals and its ``run.json``. ``job``: one job whose argument list(s) the plan task
    returns (one list: one task; a list of lists: one mapped task instance each, per namespace or per
    shard); or several jobs run one after the other, whose argument lists the plan task returns under
    their names (multiple_outputs: one XCom per job). ``task_ids``: each job's Spark task, in the order of
    the jobs (standard_pipeline passes them; default: tasks named as their jobs)."""
    jobs = [job] if isinstance(job, str) else list(job)
    tasks = list(task_ids) if task_ids is not None else list(jobs)

    @task(task_id="summary", trigger_rule=TriggerRule.ALL_DONE, **QUICK_TASK)
    def summary() -> dict[str, Any]:
        """Totals of every part of this DAG run's reports (topics, ledgers, bytes, failures, data loss;
        segments of streaming namespaces; a job's counters, e.g. compaction's objects and bytes before →
        after, per namespace too), a part the plan asked for that wrote no report counted as failed; the
        run's ``run.json`` (also when nothing was due, with the plan's reasons, and when the plan failed),
        the run's XCom and log."""
        ctx = get_current_context()
        ti = ctx["ti"]
        planned: dict[str, Any] = {}
        as_of_arg: str | None = None
        for j, task_id in zip(jobs, tasks, strict=True):
            raw = ti.xcom_pull(task_ids=plan_task_id) if isinstance(job, str) else \
                ti.xcom_pull(task_ids=plan_task_id, key=j)
            planned[j] = planned_parts(task_id, j, raw)  # None: the plan failed
            as_of_arg = as_of_arg or _as_of_arg(raw)
        idle = ti.xcom_pull(task_ids=plan_task_id, key=NOTHING_DUE_KEY) or []
        reports = RunReports(load_config(ctx["params"]).reports_dir)
        dag_id, run_id = ti.dag_id, ctx["run_id"]
        logical = ctx.get("logical_date")
        record = run_record(reports, dag_id, run_id, planned, dag_id=dag_id,
                            logical_date=logical.isoformat() if logical is not None else None,
                            as_of=as_of_arg or as_of(ctx), nothing_due=idle)
        path = reports.write_run(dag_id, record)
        totals = record["totals"]
        for entry in record["nothing_due"]:
            print(f"{totals['job']}: nothing due, no Spark job: {entry['namespace']}: {entry['reason']}")
        for part in record["missing_parts"]:
            print(f"ERROR {totals['job']}: part {part} was planned and wrote no report")
        for line in summary_lines(totals):
            print(line)
        print(f"run report: {path}")
        return {**totals, "nothing_due": record["nothing_due"], "missing_parts": record["missing_parts"],
                "run_report": str(path), "run_key": report_name(run_id)}

    return summary()


def _as_of_arg(planned: Any) -> str | None:
    """The --as-of the plan gave its jobs (the run's logical time as the jobs see it)."""
    if not planned:
        return None
    args = [str(a) for a in (planned[0] if isinstance(planned[0], list | tuple) else planned)]
    return args[args.index("--as-of") + 1] if "--as-of" in args[:-1] else None


def verdict_task():
    @task(task_id="verdict", trigger_rule=TriggerRule.NONE_FAILED, **QUICK_TASK)
    def verdict() -> None:
        """Fails the run when a job reported failures (its Spark task failing fails this one too)."""
        from airflow.sdk.exceptions import AirflowFailException

        totals = get_current_context()["ti"].xcom_pull(task_ids="summary") or {}
        why = verdict_message(totals)  # data loss first, then failures and parts without a report
        if why is not None:
            raise AirflowFailException(why)

    return verdict()
