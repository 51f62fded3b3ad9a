"""Issue 27's forms and logs: a run uses the deployment's configuration or a file of the admin's
allow-list, never another file (checked before anything is read); the Spark job's lines reach Airflow's
log at their own level; a failed spark-submit's exception does not repeat the job's lines; the forms'
nullable fields; the job's log lines give instants in ISO 8601 UTC."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from .conftest import REPO, SWEEP_AT, allowed_configs, get_dag, make_workspace, run_dag

# -- the run's configuration ------------------------------------------------------------------------


def test_run_config_path_is_the_deployments_or_an_allowed_one() -> None:
    from tiered_airflow import ConfigNotAllowed, run_config_path

    env = {"TIERED_CONFIG": "/etc/tiered/tiered.toml", "TIERED_CONFIG_ALLOWED": f"/srv/a.toml{os.pathsep}/srv/b.toml"}
    assert run_config_path({}, env) == "/etc/tiered/tiered.toml"
    assert run_config_path({"config": None}, env) == run_config_path({"config": " "}, env) == "/etc/tiered/tiered.toml"
    assert run_config_path({}, {}) is None  # tieredcore's own default (./tiered.toml, the TIERED_* environment)
    for ok in ("/etc/tiered/tiered.toml", "/srv/a.toml", "/srv/b.toml"):
        assert run_config_path({"config": ok}, env) == ok
    # compared as given: another spelling of an allowed path is another file
    for bad in ("/etc/passwd", "/srv/a.toml/../../etc/passwd", "/srv//a.toml", "/srv/a.toml ", ["/srv/a.toml"], 7):
        with pytest.raises(ConfigNotAllowed, match="not a configuration this deployment allows"):
            run_config_path({"config": bad}, env)
    with pytest.raises(ConfigNotAllowed, match="TIERED_CONFIG_ALLOWED is not set"):
        run_config_path({"config": "/srv/a.toml"}, {"TIERED_CONFIG": "/etc/tiered/tiered.toml"})


def test_config_param_is_a_choice_of_the_allowed_files_never_free_text(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    assert "config" not in get_dag("tiered_offload_sweep").params  # no allow-list: the deployment's only
    a, b = str(tmp_path / "a.toml"), str(tmp_path / "b.toml")
    with allowed_configs(a, b):
        param = get_dag("tiered_offload_sweep").params.get_param("config")
    assert param.value is None and param.schema["enum"] == [None, a, b]  # a drop-down; empty: the deployment's
    for good in (None, a, b):
        assert param.resolve(good) == good
    with pytest.raises(ParamValidationError):
        param.resolve(str(tmp_path / "other.toml"))


class _Opens:
    """Every file the process opens meanwhile (a sys.addaudithook: the proof that a file was not read)."""

    def __init__(self) -> None:
        self.paths: list[str] | None = None
        sys.addaudithook(self._hook)  # hooks cannot be removed: it records only while active

    def _hook(self, event: str, args: tuple) -> None:
        if self.paths is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            self.paths.append(os.fsdecode(args[0]))

    def __enter__(self) -> list[str]:
        self.paths = []
        return self.paths

    def __exit__(self, *exc: object) -> None:
        self.paths = None


_OPENS: _Opens | None = None


def test_a_run_cannot_make_a_task_read_another_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployment's workspace is $TIERED_CONFIG; a run's conf names another workspace's tiered.toml
    (readable by the worker). Allowed, the run's first task reads it (the control: the audit hook sees a
    task's reads). Not allowed, the first task fails naming the allow-list and the file is never opened.
    With an allow-list, a file outside it is refused by the trigger itself: no run."""
    from airflow.sdk import DagRunState, TaskInstanceState
    from airflow.sdk.exceptions import ParamValidationError

    global _OPENS
    deployment = make_workspace(tmp_path / "deployed", ["public/default"], topics=1, ledgers=2, entries=10)
    other = make_workspace(tmp_path / "other", ["acme/secret"], topics=1, ledgers=2, entries=10)
    monkeypatch.setenv("TIERED_CONFIG", str(deployment))
    _OPENS = _OPENS or _Opens()
    # tiered_key_rotation: preflight reads the configuration, then the plan fails (no key ring): no Spark
    with _OPENS as opened:
        _, states = run_dag("tiered_key_rotation", SWEEP_AT, {"config": str(other)})  # on the allow-list
    assert states["preflight"] == TaskInstanceState.SUCCESS and str(other) in opened, (states, opened)

    dag = get_dag("tiered_key_rotation")  # no allow-list: no `config` param, the conf key is still passed
    assert "config" not in dag.params
    with _OPENS as opened:
        dr = dag.test(logical_date=SWEEP_AT + dt.timedelta(hours=1), run_conf={"config": str(other)})
    ti = {t.task_id: t for t in dr.get_task_instances()}
    assert dr.state == DagRunState.FAILED
    assert ti["preflight"].state == TaskInstanceState.FAILED and ti["plan"].state == TaskInstanceState.UPSTREAM_FAILED
    assert not any(p.startswith(str(other.parent)) for p in opened), opened

    with allowed_configs(str(deployment)):
        dag = get_dag("tiered_key_rotation")
        with pytest.raises(ParamValidationError, match="config"):
            dag.test(logical_date=SWEEP_AT + dt.timedelta(hours=2), run_conf={"config": str(other)})


def test_load_config_fails_clearly_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_config (every task's first step) with a file outside the allow-list: AirflowFailException
    naming the setting; the file, unreadable by anyone, is not even tried (no permission error)."""
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_common import load_config

    secret = tmp_path / "secret.toml"
    secret.write_text("not toml at all [[[")
    secret.chmod(0)
    monkeypatch.setenv("TIERED_CONFIG_ALLOWED", str(tmp_path / "fine.toml"))
    with pytest.raises(AirflowFailException, match=r"config param '.*secret.toml': not a configuration this "
                                                   r"deployment allows.*TIERED_CONFIG_ALLOWED: .*fine.toml"):
        load_config({"config": str(secret)})
    assert stat.S_IMODE(secret.stat().st_mode) == 0


# -- the forms --------------------------------------------------------------------------------------


def test_optional_fields_may_stay_empty_and_required_ones_say_so() -> None:
    """A field whose empty value means a default is nullable (the UI's Trigger button stays enabled with
    the documented defaults); required ones are refused empty with words, never a regex."""
    from airflow.sdk.exceptions import ParamValidationError

    optional = {"tiered_key_rotation": ["target"], "tiered_orphan_reconciliation": ["grace"],
                "tiered_compaction": ["min_object_size", "target_size", "delete_delay"],
                "tiered_topic_compaction": ["threshold"]}
    for dag_id, names in optional.items():
        params = get_dag(dag_id).params
        for name in names:
            p = params.get_param(name)
            assert "null" in p.schema["type"] and p.value is None and "pattern" not in p.schema, (dag_id, name)
            assert p.resolve(None) is None
    topic = get_dag("tiered_offload_topic").params.get_param("value")
    with pytest.raises(ParamValidationError, match="should be non-empty"):
        topic.resolve("")
    for dag_id in ("tiered_offload_sweep", "tiered_scrub", "tiered_compaction", "tiered_topic_compaction"):
        ns = get_dag(dag_id).params.get_param("namespaces")
        with pytest.raises(ParamValidationError) as e:
            ns.resolve(["public/default", "no-slash"])
        assert str(e.value).startswith("'no-slash' is not a 'namespace name: tenant/namespace")


# -- the job's lines at their level; each failure once -----------------------------------------------


FAILURE = "FAILED persistent://acme/orders/t-1 ledger 12: verify-failed (size 10 != 12)"


def _fake_spark_submit(bin_dir: Path, code: int) -> None:
    """A spark-submit on PATH that prints what a failing job prints (through spark_jobs._jobkit.say, the
    jobs' own function) and Spark's log4j lines, then exits ``code``."""
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text(f"""#!{sys.executable}
import sys
sys.path.insert(0, {str(REPO)!r})
from spark_jobs._jobkit import say
print("26/11/28 08:00:00 WARN SparkContext: spark's own warning", flush=True)
say("tj", "INFO", "run r1 as of 2026-03-01T12:15:00+00:00: 1 topic(s)")
say("tj", "WARNING", "BUSY persistent://acme/orders/t-2: leased by another run")
say("tj", "ERROR", {FAILURE!r})
say("tj", "ERROR", "outcome FAILED: 1 topic(s), 1 unit(s), 0 bytes; 1 failure(s); failed=1; exit {code}")
sys.exit({code})
""")
    script.chmod(0o755)


@pytest.mark.parametrize("code", [1, 2])
def test_job_lines_reach_the_log_at_their_level_and_each_failure_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """The real Spark hook reads a real spark-submit process (a stand-in script on PATH printing the jobs'
    lines): ERROR lines are logged as errors, WARNING/WARN as warnings, the rest as info; the task's
    exception names the exit code only, so the failure is in the task's log once (the exception and the
    failure callback's line repeat the exception's text)."""
    import structlog
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import ExecutorSafeguard
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
    from tiered_airflow import JobLineLevels
    from tiered_spark import spark_task

    monkeypatch.setattr(ExecutorSafeguard, "test_mode", True)  # execute() called here, not by a task runner
    _fake_spark_submit(tmp_path / "bin", code)
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "bin"), venv_bin, os.environ.get("PATH", "")]))
    with DAG("t", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)):
        op = spark_task("job", "deletion_lag_cleanup", ["--as-of", "2026-01-01T00:00:00+00:00"])
    assert isinstance(op._get_hook().log, JobLineLevels)
    with structlog.testing.capture_logs() as logs, pytest.raises(AirflowException) as e:
        op.execute({"params": {}})
    levels = {ev["event"]: ev["log_level"] for ev in logs}
    assert levels[f"ERROR tj: {FAILURE}"] == "error"
    assert levels["WARNING tj: BUSY persistent://acme/orders/t-2: leased by another run"] == "warning"
    assert levels["26/11/28 08:00:00 WARN SparkContext: spark's own warning"] == "warning"
    assert levels["INFO tj: run r1 as of 2026-03-01T12:15:00+00:00: 1 topic(s)"] == "info"
    assert isinstance(e.value, AirflowFailException) == (code == 2)  # bad input: not retried
    message = str(e.value)
    assert "\n" not in message and FAILURE not in message and "ledger 12" not in message, message
    assert f"exit {code}" in message and "ERROR lines are above" in message
    logged = [ev["event"] for ev in logs]
    assert sum(FAILURE in line for line in logged) == 1


def test_line_levels() -> None:
    from tiered_airflow import line_level

    assert line_level("ERROR offload_sweep: FAILED x") == "error"
    assert line_level("WARNING deletion_drain: BUSY y") == "warning"
    assert line_level("INFO scrub: report /r") == "info"
    assert line_level("26/01/01 12:00:00 ERROR Executor: boom") == "error"
    assert line_level("26/01/01 12:00:00 INFO SparkContext: hi") == "info"
    assert line_level("Traceback (most recent call last):") == "info"
    assert line_level("ERRORS everywhere") == "info"  # not a level word followed by a job name


def test_job_summary_line_gives_instants_in_iso_and_counts_of_failures() -> None:
    """The TIERED_RUN_SUMMARY log line: instants as ISO 8601 UTC (summary.json keeps epoch ms); the
    ledgers lost or damaged as counts (the job's DATA LOSS / DAMAGED lines name them, once)."""
    from spark_jobs._jobkit import log_view

    lost = "persistent://a/b/t ledger 7"
    damage = {"topic": "persistent://a/b/t", "ledger": 8, "outcome": "damaged"}
    doc = {"as_of_ms": 1772367300000, "written_ms": 1772367301500, "seconds": 1.5, "deletion_lag_ms": 3600000,
           "data_loss": [lost], "totals": {"data_loss": [lost], "failures": 2},
           "namespaces": {"a/b": {"ledgers": 3, "damage": [damage]}}}
    logged = log_view(doc)
    assert logged == {"as_of": "2026-03-01T12:15:00+00:00", "written": "2026-03-01T12:15:01+00:00",
                      "seconds": 1.5, "deletion_lag_ms": 3600000,  # durations stay as they are
                      "data_loss": 1, "totals": {"data_loss": 1, "failures": 2},
                      "namespaces": {"a/b": {"ledgers": 3, "damage": 1}}}
    assert lost not in json.dumps(logged) and "ledger\": 8" not in json.dumps(logged)


def test_summary_is_skipped_not_green_when_the_plan_failed(tmp_path: Path) -> None:
    """tiered_key_rotation without a key ring: its plan fails, nothing runs; the summary says so by being
    skipped (never success in a failed run) and the run fails."""
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=2, entries=10)
    dr, states = run_dag("tiered_key_rotation", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.FAILED
    assert states["plan"] == TaskInstanceState.FAILED and states["summary"] == TaskInstanceState.SKIPPED, states
    assert states["verdict"] == TaskInstanceState.UPSTREAM_FAILED, states
