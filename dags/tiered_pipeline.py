"""The standard pipeline every tiered-storage DAG ends with, so a DAG file reads as its own steps only:

    [wait_turn >>] preflight >> plan >> spark task(s) >> summary >> verdict, summary >> announce

``standard_pipeline`` wires it from the DAG's plan task and its Spark step; ``preflight_task`` (the
configuration loads, the stores answer), ``summary_task`` (every part of the DAG run's reports added up
through tieredcore.reports: the run's ``run.json``, the summary XCom and log) and ``verdict_task`` (fails
the run on failures, missing parts and data loss) are its shared tasks, ``split_due`` / ``deletions_due`` / ``NOTHING_DUE_KEY`` what plan tasks use to skip
a Spark job when nothing is due."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import TriggerRule, get_current_context, task
from tiered_airflow import TieredObjectStoreHook
from tiered_assets import Announcement, announce_task
from tiered_common import AWS_CONN_ID, GCP_CONN_ID, QUICK_TASK, WASB_CONN_ID, duration_from_env, load_config
from tiered_params import as_of, job_args

from tieredcore.reports import RunReports, planned_parts, report_name, run_record, verdict_message
from tieredcore.run_totals import summary_lines

# XCom key of a plan task: what it left out because nothing was due (no Spark job for it)
NOTHING_DUE_KEY = "nothing_due"
# XCom key of a sharded plan task: per shard (Spark application) its namespaces, bytes and units
SHARDS_KEY = "shards"


def standard_pipeline(plan: Callable[[], Any], spark: Callable[[Any], Any], jobs: str | Sequence[str], *,
                      preflight: bool = True, announce: Announcement | None = None) -> None:
    """The DAG's tasks after its own: in a scheduled DAG the ``wait_turn`` gate first (each slot does its
    own work: see :func:`wait_turn_task`), ``plan()`` (the plan task; after the preflight check unless
    ``preflight`` is False), the Spark task(s) ``spark(planned)`` builds on the plan's XCom (one task, or
    a list whose last one runs last), the ``summary`` of ``jobs``' reports, the ``verdict`` over the
    Spark tasks and the summary, and, with ``announce``, the asset events of what the run changed."""
    planned = plan()
    head = planned
    if preflight:
        head = preflight_task()
        head >> planned
    if planned.operator.dag is not None and planned.operator.dag.timetable.can_be_scheduled:
        wait_turn_task() >> head
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


# -- the gate: one slot at a time, oldest first ----------------------------------------------------

# a scheduled run gives a backfill created with it (the UI's "unpause on trigger" sends both at once)
# this long to exist before it decides; at most GATE_MAX_WAIT of waiting, then it goes on (with a warning)
GATE_SETTLE = duration_from_env("TIERED_GATE_SETTLE", "15s")
GATE_MAX_WAIT = duration_from_env("TIERED_GATE_MAX_WAIT", "1h")
# between two looks (not much shorter: the scheduler must have seen a poke end before the next is due)
GATE_POKE = duration_from_env("TIERED_GATE_POKE", "30s")
GATE_RETRIES = 6


def older_run_unfinished(ti: Any) -> Any:
    """The older run (earlier logical date) of this DAG that this run waits for, or None: one running,
    or a backfill's still queued (backfill runs start on their own quota, so they will run; a queued
    scheduled or manual run may be waiting for this very run's place under max_active_runs=1)."""
    running = ti.get_previous_dagrun(state="running")
    if running is not None:
        return running
    queued = ti.get_previous_dagrun(state="queued")
    return queued if queued is not None and _value(queued.run_type) == "backfill" else None


def _value(enum: Any) -> str:
    """An Airflow enum's value (``DagRunType.BACKFILL_JOB`` -> ``backfill``), or the string given."""
    return str(getattr(enum, "value", enum))


def wait_turn_task():
    from airflow.sdk import PokeReturnValue

    @task.sensor(task_id="wait_turn", mode="reschedule", poke_interval=GATE_POKE.total_seconds(),
                 timeout=(GATE_MAX_WAIT + dt.timedelta(minutes=10)).total_seconds(),
                 # a retry (not a failed run) when a poke's end reaches the scheduler after the next
                 # poke was queued (Airflow then fails the try: "state changed externally", or "TI is
                 # already running elsewhere"); on a loaded machine that happened three times in one
                 # run, and a gate's retry costs one look
                 retries=GATE_RETRIES, retry_delay=GATE_POKE, retry_exponential_backoff=False,
                 execution_timeout=dt.timedelta(minutes=5))
    def wait_turn() -> PokeReturnValue:
        """Waits while an older run of this DAG is unfinished (a backfill's slots, a slot still being
        caught up), so each run does its own slot's work, oldest first (the jobs' only clock is the
        run's logical time: a newer run would do the older slots' work first). A failed or finished
        older run never blocks; after TIERED_GATE_MAX_WAIT (default 1 h) it goes on regardless, with
        a warning. A run without a logical date (asset-triggered) does not wait."""
        import logging
        import time

        log = logging.getLogger("tiered.wait_turn")  # at its level in the task log (the warning too)
        ctx: Any = get_current_context()
        ti, dag_run = ctx["ti"], ctx["dag_run"]
        if dag_run.logical_date is None:
            return PokeReturnValue(is_done=True)
        now = dt.datetime.now(dt.UTC)
        if _value(dag_run.run_type) == "scheduled" and dag_run.start_date is not None:
            settle = dag_run.start_date + GATE_SETTLE - now
            if settle > dt.timedelta(0):  # a backfill sent with the unpause may not exist yet
                time.sleep(settle.total_seconds())
        older = older_run_unfinished(ti)
        if older is None:
            log.info("wait_turn: no older run of %s unfinished; this run (%s) goes", ti.dag_id,
                     dag_run.logical_date.isoformat())
            return PokeReturnValue(is_done=True)
        waited = now - (ti.get_first_reschedule_date(ctx) or now)
        what = (f"{older.run_id} ({_value(older.run_type)}, {_value(older.state)}, logical date "
                f"{older.logical_date.isoformat()})")
        if waited >= GATE_MAX_WAIT:
            log.warning("wait_turn: waited %s for the older run %s; going on (this run may do the older slots' "
                        "work first; their runs then find it done)", waited, what)
            return PokeReturnValue(is_done=True)
        log.info("wait_turn: waiting for the older run %s to finish (waited %s so far)", what, waited)
        return PokeReturnValue(is_done=False)

    return wait_turn()


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


def shard_plan(ctx: Any, config: Any, plan_due: Callable[[Any], list[Any]], what: str,
               extra: Sequence[str] = ()) -> list[list[str]]:
    """The plan task of a per-namespace DAG: ``plan_due(ws)`` (tieredcore's planning on ONE Workspace: a
    NamespaceDue per namespace) spread over the run's shards by bytes (tieredcore.lifecycle.shards: the
    ``shards`` param, else the configuration's ``spark_shards``); one job argument list per shard
    (``--namespace a --namespace b ... --as-of ...``), [] when nothing is due anywhere (no Spark job).
    XComs: ``shards`` (per shard its namespaces, bytes, units) and ``nothing_due`` (namespace, reason)."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.config import check_spark_shards
    from tieredcore.errors import TieredError
    from tieredcore.lifecycle.shards import assign_shards, nothing_due
    from tieredcore.workspace import Workspace

    override = ctx["params"].get("shards")
    try:
        n = config.spark_shards if override is None else check_spark_shards(override, "shards param")
        with Workspace(config) as ws:
            due = plan_due(ws)
        shards = assign_shards(due, n)
    except TieredError as e:
        raise AirflowFailException(f"planning the {what}: {e}") from None
    idle = nothing_due(due)
    ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=idle)
    ctx["ti"].xcom_push(key=SHARDS_KEY, value=[s.as_dict() for s in shards])
    busy = len(due) - len(idle)
    print(f"{what} plan: {len(due)} namespace(s); work due in {busy}, on {len(shards)} Spark application(s) "
          f"(at most {n}); nothing due (no Spark job) in {len(idle)}")
    for i, s in enumerate(shards):
        print(f"{what} plan: shard {i}: {len(s.namespaces)} namespace(s), {s.units} unit(s), {s.bytes} bytes: "
              f"{', '.join(s.namespaces[:20])}{f' +{len(s.namespaces) - 20} more' if len(s.namespaces) > 20 else ''}")
    for d in idle[:20]:
        print(f"{what} plan: nothing due in {d['namespace']}: {d['reason']}")
    if len(idle) > 20:
        print(f"{what} plan: nothing due in {len(idle) - 20} more namespace(s) (XCom nothing_due lists them all)")
    several = len(shards) > 1
    return [job_args(ctx, namespaces=s.namespaces, shard=i if several else None, extra=extra)
            for i, s in enumerate(shards)]


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
        if config.replica:  # a read replica: its jobs would write (refused there anyway); only its sync runs
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"preflight: refused: this workspace is a read replica of {config.replica_of} (cluster "
                f"{config.cluster!r}); it serves reads and changes only by the tiered_replica_sync DAG")
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
        if all(v is None for v in planned.values()):
            # the plan task failed (bad params, an unreachable store): nothing ran; run.json says so, but a
            # green summary would read as a clean run (the run itself fails: the verdict is upstream_failed)
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"{plan_task_id} failed: no job ran, nothing to add up (see its log)")
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
