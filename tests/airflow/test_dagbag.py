"""DAG files import cleanly, follow the project's conventions, and touch nothing at parse time."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from .conftest import DAGS, REPO, asset_of, cron_of

DAG_IDS = {"tiered_offload_sweep", "tiered_offload_topic", "tiered_deletion_lag_cleanup", "tiered_retention",
           "tiered_deletion_drain", "tiered_orphan_reconciliation", "tiered_scrub", "tiered_compaction",
           "tiered_key_rotation", "tiered_table_export", "tiered_topic_compaction", "tiered_recover",
           "tiered_replica_sync"}
# Spark tasks per DAG (every other DAG has one; a replica's sync is a listing and a few reads: none)
SPARK_TASKS = {"tiered_retention": 2, "tiered_replica_sync": 0}


def _bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_dags_import_without_errors_and_follow_conventions() -> None:
    from tiered_airflow import TieredSparkSubmitOperator

    bag = _bag()
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == DAG_IDS
    for dag_id in DAG_IDS:
        dag = bag.get_dag(dag_id)
        assert dag.tags and "tiered-storage" in dag.tags, dag_id
        assert dag.doc_md and len(dag.doc_md) > 200, dag_id
        # scheduled: the missed slots of the catch-up window, one run each (tiered_timetables.py)
        assert dag.catchup is (dag.schedule is not None), dag_id
        for t in dag.tasks:
            assert t.owner == "tiered", (dag_id, t.task_id)
            assert t.execution_timeout is not None, (dag_id, t.task_id)
        spark = [t for t in dag.tasks if getattr(t, "operator_class", type(t)) is TieredSparkSubmitOperator
                 or isinstance(t, TieredSparkSubmitOperator)]
        assert len(spark) == SPARK_TASKS.get(dag_id, 1), dag_id
        for st in spark:
            kw = getattr(st, "partial_kwargs", None) or st.__dict__
            retries = kw.get("retries", getattr(st, "retries", None))
            assert retries >= 1, dag_id
            assert kw.get("retry_exponential_backoff", getattr(st, "retry_exponential_backoff", False)), dag_id
    sweep = bag.get_dag("tiered_offload_sweep")
    lag = bag.get_dag("tiered_deletion_lag_cleanup")
    assert sweep.max_active_runs == 1 and lag.max_active_runs == 1
    assert bag.get_dag("tiered_offload_topic").schedule is None
    assert cron_of(sweep) == "*/15 * * * *" and cron_of(lag) == "0 * * * *"
    assert asset_of(lag).name == "tiered_offloaded"  # ... or on the sweep's events
    # no `config` param: without an allow-list (TIERED_CONFIG_ALLOWED) every run uses the deployment's
    assert set(sweep.params.keys()) == {"dry_run", "max_topics", "namespaces", "shards"}
    assert set(bag.get_dag("tiered_offload_topic").params.keys()) == {"topic", "mode", "value", "dry_run"}
    scrub = bag.get_dag("tiered_scrub")
    assert scrub.max_active_runs == 1 and cron_of(scrub) == "0 0 * * *"
    assert set(scrub.params.keys()) == {"dry_run", "deep", "messages", "repair", "namespaces"}
    assert scrub.get_task("scrub").application.endswith("spark_jobs/scrub.py")
    from tiered_spark import SHARD_LABEL_TEMPLATE

    compaction = bag.get_dag("tiered_compaction")
    assert compaction.max_active_runs == 1 and cron_of(compaction) == "0 0 * * *"
    assert set(compaction.params.keys()) == {"dry_run", "namespaces", "min_object_size", "target_size",
                                             "delete_delay", "shards"}
    compact = compaction.get_task("compact")
    assert compact.partial_kwargs["application"].endswith("spark_jobs/compact_segments.py")
    assert compact.partial_kwargs["map_index_template"] == SHARD_LABEL_TEMPLATE  # labelled by its shard
    assert [t.task_id for t in compaction.topological_sort()] == ["wait_turn", "preflight", "plan", "compact", "summary",
                                                                  "verdict"]
    topic_compaction = bag.get_dag("tiered_topic_compaction")
    assert topic_compaction.max_active_runs == 1 and cron_of(topic_compaction) == "0 * * * *"
    assert set(topic_compaction.params.keys()) == {"dry_run", "topics", "namespaces", "shards", "threshold",
                                                   "retain_null_key"}
    tc = topic_compaction.get_task("compact")
    assert tc.partial_kwargs["application"].endswith("spark_jobs/compact_topics.py")
    assert tc.partial_kwargs["map_index_template"] == SHARD_LABEL_TEMPLATE
    assert [t.task_id for t in topic_compaction.topological_sort()] == ["wait_turn", "preflight", "plan", "compact",
                                                                        "summary", "verdict"]
    keys = bag.get_dag("tiered_key_rotation")
    assert keys.schedule is None and keys.max_active_runs == 1  # manual trigger only
    assert set(keys.params.keys()) == {"dry_run", "target"}
    assert keys.get_task("rotate").application.endswith("spark_jobs/rotate_keys.py")
    rec = bag.get_dag("tiered_recover")
    assert rec.schedule is None and rec.max_active_runs == 1  # manual trigger only
    assert set(rec.params.keys()) == {"dry_run", "apply", "merge"}
    assert rec.params["apply"] is False and rec.params["merge"] is False  # a dry run by default
    assert rec.get_task("recover").application.endswith("spark_jobs/recover.py")
    assert [t.task_id for t in rec.topological_sort()] == ["preflight", "plan", "recover", "summary", "verdict"]


def test_spark_task_is_built_in_one_place() -> None:
    from tiered_spark import SHARD_LABEL_TEMPLATE

    dag = _bag().get_dag("tiered_deletion_lag_cleanup")
    op = dag.get_task("cleanup")
    assert op.application == str(REPO / "spark_jobs" / "deletion_lag_cleanup.py")
    assert Path(op.application).is_file()
    assert op.name.startswith("tiered-deletion_lag_cleanup-")
    assert op._conn_id == "spark_default"
    assert op.conf["spark.ui.enabled"] == "false"
    assert op.conf["spark.pyspark.python"]
    assert "TIERED_CONFIG" not in op.env_vars  # the run's (checked against the allow-list) at submit time
    # where the job writes its report: its DAG run's part and try (tieredcore.reports.report_place)
    assert {k: op.env_vars[k] for k in ("TIERED_DAG_ID", "TIERED_DAG_RUN_ID", "TIERED_TASK_ID", "TIERED_MAP_INDEX",
                                        "TIERED_ATTEMPT")} == {
        "TIERED_DAG_ID": "{{ ti.dag_id }}", "TIERED_DAG_RUN_ID": "{{ run_id }}", "TIERED_TASK_ID": "{{ ti.task_id }}",
        "TIERED_MAP_INDEX": "{{ ti.map_index }}", "TIERED_ATTEMPT": "{{ ti.try_number }}"}
    assert not any(k.startswith("AWS_") for k in op.env_vars)  # secrets only at submit time
    sweep = _bag().get_dag("tiered_offload_sweep").get_task("offload")
    assert sweep.partial_kwargs["map_index_template"] == SHARD_LABEL_TEMPLATE
    assert sweep.partial_kwargs["application"].endswith("spark_jobs/offload_sweep.py")


def test_schedules_and_jobs_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    monkeypatch.setenv("TIERED_SWEEP_SCHEDULE", "*/5 * * * *")
    monkeypatch.setenv("TIERED_LAG_CLEANUP_SCHEDULE", "none")
    monkeypatch.setenv("TIERED_SPARK_JOBS_DIR", str(jobs))
    monkeypatch.setenv("TIERED_PY_FILES", str(tmp_path / "tiered.zip"))
    monkeypatch.setenv("TIERED_CONFIG", "/etc/tiered/tiered.toml")
    import sys

    saved = sys.modules.pop("tiered_common")  # re-read the environment as a fresh parse would
    try:
        bag = _bag()
        assert not bag.import_errors, bag.import_errors
        assert cron_of(bag.get_dag("tiered_offload_sweep")) == "*/5 * * * *"
        assert bag.get_dag("tiered_deletion_lag_cleanup").schedule is None  # no clock, no events either
        op = bag.get_dag("tiered_deletion_lag_cleanup").get_task("cleanup")
        assert op.application == str(jobs / "deletion_lag_cleanup.py")
        assert op.py_files == str(tmp_path / "tiered.zip")
        assert "config" not in bag.get_dag("tiered_offload_sweep").params  # the deployment's: no choice
    finally:
        sys.modules["tiered_common"] = saved


def test_spark_log_level_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's own lines at WARN by default (spark_jobs/log4j2.properties), TIERED_SPARK_LOG_LEVEL
    otherwise; a bad level fails the DAG import naming the variable."""
    import sys

    op = _bag().get_dag("tiered_deletion_drain").get_task("drain")
    opts = op.conf["spark.driver.extraJavaOptions"]
    assert f"-Dlog4j2.configurationFile={(REPO / 'spark_jobs' / 'log4j2.properties').as_uri()}" in opts
    assert "-Dtiered.spark.log.level=WARN" in opts
    saved = sys.modules.pop("tiered_common")
    try:
        monkeypatch.setenv("TIERED_SPARK_LOG_LEVEL", "info")
        bag = _bag()
        assert "-Dtiered.spark.log.level=INFO" in bag.get_dag("tiered_deletion_drain").get_task("drain").conf[
            "spark.driver.extraJavaOptions"]
        sys.modules.pop("tiered_common")
        monkeypatch.setenv("TIERED_SPARK_LOG_LEVEL", "LOUD")
        errors = _bag().import_errors
        assert errors and all("TIERED_SPARK_LOG_LEVEL='LOUD': one of OFF, FATAL" in e for e in errors.values())
    finally:
        sys.modules["tiered_common"] = saved


def test_no_connection_or_metadata_access_at_parse_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Parsing with a configuration that does not exist, and every connection / Variable / config /
    metadata-store lookup booby-trapped, still yields the DAGs without errors."""
    import sys

    from airflow.sdk import BaseHook, Connection, Variable

    from tieredcore.config import Config
    from tieredcore.meta.sqlite import SqliteMetadataStore

    def boom(*a, **k):
        raise AssertionError("accessed at parse time")

    monkeypatch.setenv("TIERED_CONFIG", str(tmp_path / "does-not-exist.toml"))
    monkeypatch.setattr(BaseHook, "get_connection", classmethod(boom))
    monkeypatch.setattr(Connection, "get", classmethod(boom))
    monkeypatch.setattr(Variable, "get", staticmethod(boom))
    monkeypatch.setattr(Config, "load", classmethod(boom))
    monkeypatch.setattr(SqliteMetadataStore, "__init__", boom)
    saved = sys.modules.pop("tiered_common")
    try:
        bag = _bag()
        assert not bag.import_errors, bag.import_errors
        assert set(bag.dag_ids) == DAG_IDS
    finally:
        sys.modules["tiered_common"] = saved


def test_plugin_registers_macros_and_report_link(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow import plugins_manager
    from tiered_airflow import TieredReportLink, tiered_report_path, tiered_report_url, tiered_run_id

    names = {p.name for p in plugins_manager._get_plugins()[0]}
    assert "tiered" in names
    links = plugins_manager.get_operator_extra_links()
    # tiered_airflow.py is in plugins/.airflowignore: the plugins manager imports it normally instead of
    # executing it as a plugin file, so DAGs and plugin share one link and operator class
    assert any(isinstance(link, TieredReportLink) for link in links)
    macros = next(p for p in plugins_manager._get_plugins()[0] if p.name == "tiered").macros
    assert {m.__name__ for m in macros} >= {"tiered_run_id", "tiered_report_path"}

    rid = "manual__2026-01-01T00:00:00+00:00"
    key = "manual__2026-01-01T00=3A00=3A00+00=3A00"  # tieredcore.reports.report_name: one path component
    assert tiered_run_id(rid) == key and tiered_run_id(rid, "acme/orders") == key  # one key per DAG run
    assert tiered_report_path("tiered_scrub", rid, reports_dir=str(tmp_path)) == str(
        tmp_path / "tiered_scrub" / key / "run.json")
    assert tiered_report_path("tiered_scrub", rid, "scrub", reports_dir=str(tmp_path)) == str(
        tmp_path / "tiered_scrub" / key / "scrub" / "summary.json")
    assert tiered_report_path("tiered_offload_sweep", rid, "offload.2", 3, reports_dir=str(tmp_path)) == str(
        tmp_path / "tiered_offload_sweep" / key / "offload.2" / "attempt-3" / "summary.json")
    # the report pages of the plugin's FastAPI app: same-site paths the UI renders as links
    quoted = "manual__2026-01-01T00%3D3A00%3D3A00%2B00%3D3A00"
    assert tiered_report_url("tiered_scrub", rid) == f"/tiered/reports/tiered_scrub/{quoted}/"
    assert tiered_report_url("tiered_scrub", rid, "scrub", 3) == f"/tiered/reports/tiered_scrub/{quoted}/scrub/attempt-3/"
    # the "Run report" link of a task instance: its DAG run's part and its try
    from types import SimpleNamespace

    from airflow.models.taskinstancekey import TaskInstanceKey

    link = TieredReportLink()
    mapped = TaskInstanceKey("tiered_offload_sweep", "offload", rid, try_number=2, map_index=4)
    assert link.get_link(SimpleNamespace(job="offload_sweep"), ti_key=mapped) == (
        f"/tiered/reports/tiered_offload_sweep/{quoted}/offload.4/attempt-2/")
    single = TaskInstanceKey("tiered_scrub", "scrub", rid, try_number=1, map_index=-1)
    assert link.get_link(SimpleNamespace(job="scrub"), ti_key=single) == (
        f"/tiered/reports/tiered_scrub/{quoted}/scrub/attempt-1/")
    assert link.get_link(SimpleNamespace(), ti_key=single) == ""  # not a Spark job's task
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/af/")
    assert tiered_report_url("tiered_scrub", "r1", "scrub", 1) == (
        "https://airflow.example/af/tiered/reports/tiered_scrub/r1/scrub/attempt-1/")
    monkeypatch.setenv("TIERED_REPORTS_URL", "https://reports.example/tiered/")
    assert tiered_report_url("tiered_scrub", "r1") == "https://reports.example/tiered/tiered_scrub/r1/"
    plugin = next(p for p in plugins_manager._get_plugins()[0] if p.name == "tiered")
    assert [(a["url_prefix"], a["name"]) for a in plugin.fastapi_apps] == [("/tiered", "Tiered storage")]
    assert plugin.external_views[0]["name"] == "Tiered storage"


class _FakeSparkSubmit:
    """Stands in for subprocess.Popen in the Spark hook's module: records the spark-submit command line
    and environment, prints nothing and exits with ``returncode``."""

    returncode = 0
    calls: list[tuple[list[str], dict[str, str]]] = []

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, **kw) -> None:
        type(self).calls.append((list(cmd), dict(env or {})))
        self.stdout: list[str] = []

    def wait(self) -> int:
        return self.returncode


def _submit_with_fake_spark(monkeypatch: pytest.MonkeyPatch, returncode: int = 0):
    """Runs the operator's public execute() up to spark-submit: returns a function executing an operator
    and giving (command line, environment) of the spark-submit it started."""
    import subprocess
    import types

    import airflow.providers.apache.spark.hooks.spark_submit as hook_module
    from airflow.sdk.bases.operator import ExecutorSafeguard

    monkeypatch.setattr(ExecutorSafeguard, "test_mode", True)  # execute() called here, not by a task runner
    fake = type("FakeSparkSubmit", (_FakeSparkSubmit,), {"returncode": returncode, "calls": []})
    monkeypatch.setattr(hook_module, "subprocess", types.SimpleNamespace(
        Popen=fake, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT, run=subprocess.run,
        TimeoutExpired=subprocess.TimeoutExpired))

    def run(op) -> tuple[list[str], dict[str, str]]:
        try:
            op.execute({})
        finally:
            op._hook = None  # as a fresh task instance would have it
        [(cmd, env)] = fake.calls
        fake.calls.clear()
        return cmd, env

    return run


def test_runtime_env_carries_aws_connection_but_command_line_does_not(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Credentials and endpoint of the AWS connection reach spark-submit's environment when the operator
    executes; the logged command line and the declared (rendered) env_vars never contain them, and the
    declared env_vars win over the run-time defaults."""
    conn = {"conn_type": "aws", "login": "AKIATIEREDTEST", "password": "tiered-secret-value-123",
            "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))
    from airflow.sdk import DAG
    from tiered_spark import spark_task

    with DAG("t", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)):
        op = spark_task("cleanup", "deletion_lag_cleanup", ["--as-of", "2026-01-01T00:00:00+00:00"])
    declared = {"TIERED_CONFIG": "/x/tiered.toml", "PYSPARK_PYTHON": "/venv/bin/python"}
    op.env_vars = dict(declared)
    env = op.runtime_env()
    assert env["AWS_ACCESS_KEY_ID"] == "AKIATIEREDTEST"
    assert env["AWS_SECRET_ACCESS_KEY"] == "tiered-secret-value-123"
    assert env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9"
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"  # spark_default is local[2]
    assert env["PYSPARK_PYTHON"] != "/venv/bin/python"

    submit = _submit_with_fake_spark(monkeypatch)
    capfd.readouterr()
    cmd, sub_env = submit(op)
    assert sub_env["AWS_SECRET_ACCESS_KEY"] == "tiered-secret-value-123"
    assert sub_env["AWS_ACCESS_KEY_ID"] == "AKIATIEREDTEST"
    assert sub_env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert sub_env["TIERED_CONFIG"] == "/x/tiered.toml"
    assert sub_env["PYSPARK_PYTHON"] == "/venv/bin/python"  # declared wins over the run-time default
    assert op.env_vars == declared  # the operator's declared fields stay clean
    line = " ".join(cmd)
    assert "tiered-secret-value-123" not in line and "AKIATIEREDTEST" not in line
    assert "--master local[2]" in line and "--name tiered-deletion_lag_cleanup-" in line
    logged = "".join(capfd.readouterr())  # the task log (printed by Airflow's log handlers)
    assert "Spark-Submit cmd" in logged and "--master local[2]" in logged
    assert "tiered-secret-value-123" not in logged and "AKIATIEREDTEST" not in logged
    assert "run-time environment adds" in logged and "AWS_SECRET_ACCESS_KEY" in logged  # names, not values


def test_no_retry_exit_code_fails_task_and_restores_declared_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job exiting 2 (bad input) fails the task without retries; the declared env_vars are restored
    even then."""
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_spark import spark_task

    with DAG("t", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)):
        op = spark_task("cleanup", "deletion_lag_cleanup", ["--as-of", "2026-01-01T00:00:00+00:00"])
    declared = dict(op.env_vars)
    submit = _submit_with_fake_spark(monkeypatch, returncode=2)
    with pytest.raises(AirflowFailException,
                       match=r"exit 2\); its ERROR lines are above: bad input: nothing was started; not retried"):
        submit(op)
    assert op.env_vars == declared


def test_offload_topic_takes_one_mode_and_one_single_line_value() -> None:
    """One `mode` drop-down (up_to | keep_bytes: both can never be given) and one single-line `value`
    (type string, not the multi-type JSON editor) taking a position or a size like 64M; a bad value is
    refused with the format's words, never a regex (`validate` parses it again, against the mode)."""
    from airflow.sdk.exceptions import ParamValidationError

    params = _bag().get_dag("tiered_offload_topic").params
    mode, value = params.get_param("mode"), params.get_param("value")
    assert mode.schema["enum"] == ["up_to", "keep_bytes"] and mode.value == "up_to"
    assert value.schema["type"] == "string" and "pattern" not in value.schema
    for good in ("12:0", " 3:41 ", "0", "1048576", "64M", "512k", " 1G "):
        assert value.resolve(good) == good
    for bad in ("", "12:", ":0", "-1:0", "-1", "64Q", "1.5M", "64 MB", str(2**63), 0, None):
        with pytest.raises(ParamValidationError) as e:
            value.resolve(bad)
        assert "^" not in str(e.value).splitlines()[0]
    with pytest.raises(ParamValidationError) as e:
        value.resolve("64Q")
    assert str(e.value).startswith("'64Q' is not a 'position LEDGER:ENTRY (e.g. 12:0) for mode up_to, or a size")


def test_offload_topic_value_must_fit_its_mode() -> None:
    from tiered_offload_topic import manual_offload

    from tieredcore.errors import ValidationError

    assert manual_offload("up_to", " 12:0 ").job_args() == ["--up-to", "12:0"]
    assert manual_offload("keep_bytes", "64M").job_args() == ["--keep-bytes", str(64 * 2**20)]
    for mode, value, why in (("keep_bytes", "12:0", "value (mode keep_bytes): size '12:0'"),
                             ("up_to", "64M", "value (mode up_to) '64M'"), ("up_to", "", "needs a position"),
                             ("both", "1:0", "mode param 'both'")):
        with pytest.raises(ValidationError, match=re.escape(why)):
            manual_offload(mode, value)


def test_airflow_conventions_pool_timeouts_and_failure_hook() -> None:
    """Every Spark task runs in the `spark` pool, every scheduled DAG has a dagrun_timeout, every DAG and
    task has the project's on_failure_callback."""
    from tiered_airflow import TieredSparkSubmitOperator, on_failure

    bag = _bag()
    for dag_id in DAG_IDS:
        dag = bag.get_dag(dag_id)
        if dag.schedule is not None:
            assert dag.dagrun_timeout is not None and dag.dagrun_timeout.total_seconds() >= 3600, dag_id
        assert dag.on_failure_callback in (on_failure, [on_failure]), dag_id
        for t in dag.tasks:
            kw = getattr(t, "partial_kwargs", None) or {}
            callbacks = kw.get("on_failure_callback", t.on_failure_callback)
            assert callbacks in (on_failure, [on_failure]), (dag_id, t.task_id)
            if getattr(t, "operator_class", type(t)) is TieredSparkSubmitOperator or isinstance(
                    t, TieredSparkSubmitOperator):
                assert kw.get("pool", getattr(t, "pool", None)) == "spark", (dag_id, t.task_id)
            else:
                assert t.pool == "default_pool", (dag_id, t.task_id)


def test_failure_hook_setting_is_checked_and_called(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from tiered_airflow import failure_hook, on_failure

    from tests.support.alerts import record

    assert failure_hook("") is None
    assert failure_hook("tests.support.alerts:record") is record is failure_hook("tests.support.alerts.record")
    for bad, why in (("no.such.module:f", "cannot import"), ("tests.support.alerts:nope", "not a callable"),
                     ("json", "not a callable")):
        with pytest.raises(ValueError, match=rf"TIERED_ON_FAILURE_CALLBACK=.*{why}"):
            failure_hook(bad)
    sink = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("TIERED_TEST_ALERTS", str(sink))
    monkeypatch.setenv("TIERED_ON_FAILURE_CALLBACK", "tests.support.alerts:record")
    on_failure({"reason": "task_failure"})
    assert json.loads(sink.read_text()) == {"task_id": None, "dag_id": None, "exception": "task_failure"}
    monkeypatch.setenv("TIERED_ON_FAILURE_CALLBACK", "no.such.module:f")
    on_failure({"reason": "x"})  # logged, never raised
    assert "cannot import" in caplog.text


def test_param_schemas_refuse_malformed_names() -> None:
    """The trigger form checks names with tieredcore's own parser (the format named in words)."""
    from airflow.sdk.exceptions import ParamValidationError

    topic_dag = _bag().get_dag("tiered_offload_topic")
    topic = topic_dag.params.get_param("topic")
    for good in ("public/default/t-1", "persistent://acme/orders/t.v2"):
        assert topic.resolve(good) == good
    for bad in ("", " a/b/c ", "public/default", "public/default/../etc", "a b/c/d", "http://a/b/c", 7):
        with pytest.raises(ParamValidationError):
            topic.resolve(bad)
    tc = _bag().get_dag("tiered_topic_compaction").params.get_param("topics")
    assert tc.resolve(["public/default/t-1", "persistent://acme/orders/t.v2"]) == \
        ["public/default/t-1", "persistent://acme/orders/t.v2"]
    for bad in (["public/default"], ["a b/c/d"], ["http://a/b/c"]):
        with pytest.raises(ParamValidationError):
            tc.resolve(bad)
    for dag_id in ("tiered_offload_sweep", "tiered_deletion_lag_cleanup", "tiered_scrub", "tiered_compaction",
                   "tiered_retention", "tiered_topic_compaction"):
        ns = _bag().get_dag(dag_id).params.get_param("namespaces")
        assert ns.resolve(["public/default", "acme/orders"]) == ["public/default", "acme/orders"]
        for bad in (["public"], ["a/b/c"], ["a b/c"]):
            with pytest.raises(ParamValidationError):
                ns.resolve(bad)
