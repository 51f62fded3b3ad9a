"""A DAG run's report (tieredcore.reports layout, written by the DAGs' summary task): run.json for every
run, also when nothing was due (with the plan's reasons) and when the plan never ran; dag.test() runs
without Spark (nothing is due, or the run fails before any Spark job)."""

from __future__ import annotations

import datetime as dt
import json
import socket
from dataclasses import replace
from pathlib import Path

from .conftest import SWEEP_AT, make_workspace, run_dag, set_policy, xcom


def _run_json(cfg: Path, dag_id: str, run_id: str) -> dict:
    from tieredcore.config import Config
    from tieredcore.reports import RunReports, report_name

    reports = RunReports(Config.load(cfg, env={}).reports_dir)
    assert report_name(run_id) in reports.runs(dag_id)
    assert reports.run_id(dag_id, report_name(run_id)) == run_id  # the unaltered id beside the reports
    return reports.read_run(dag_id, report_name(run_id))


def test_a_sweep_with_nothing_due_records_its_run_and_why(tmp_path: Path) -> None:
    """No Spark job ran, yet the run has its run.json: nothing due per namespace with the plan's reason,
    no parts, no failure; the summary XCom names it."""
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", ["acme/idle"], topics=1, ledgers=1, entries=5)
    set_policy(cfg, "acme/idle", offload_threshold_bytes=2**40)  # 1 TiB may stay hot: nothing due
    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states["summary"] == states["verdict"] == TaskInstanceState.SUCCESS
    rec = _run_json(cfg, "tiered_offload_sweep", dr.run_id)
    assert not rec.get("synthesized")
    assert (rec["dag_id"], rec["dag_run_id"], rec["jobs"]) == ("tiered_offload_sweep", dr.run_id, ["offload_sweep"])
    assert rec["parts"] == [] and rec["missing_parts"] == []
    assert [e["namespace"] for e in rec["nothing_due"]] == ["acme/idle"]
    assert all(e["reason"] for e in rec["nothing_due"])
    assert rec["totals"]["failures"] == 0 and rec["totals"]["failed_jobs"] == [] and rec["totals"]["data_loss"] == []
    assert rec["as_of"] == SWEEP_AT.isoformat() and rec["written_ms"] > 0
    summary = xcom(dr, "summary")
    assert summary["nothing_due"] == rec["nothing_due"] and summary["run_report"].endswith("/run.json")


def test_jobs_run_one_after_the_other_get_one_run_json(tmp_path: Path) -> None:
    """tiered_retention (retention, then the drain): one run.json naming both jobs; nothing due in either."""
    from airflow.sdk import DagRunState

    cfg = make_workspace(tmp_path / "ws", ["acme/orders"], topics=1, ledgers=1, entries=5)
    dr, states = run_dag("tiered_retention", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    rec = _run_json(cfg, "tiered_retention", dr.run_id)
    assert rec["jobs"] == ["retention_sweep", "deletion_drain"] and rec["parts"] == []
    assert set(rec["totals"]["by_job"]) == {"retention_sweep", "deletion_drain"}
    assert [e["namespace"] for e in rec["nothing_due"]] == ["retention", "deletion log"]


def test_a_run_whose_plan_never_ran_records_it_failed(tmp_path: Path) -> None:
    """The preflight fails (ZooKeeper unreachable): no plan, no Spark job; run.json says the job was not
    planned, and the run fails (the summary skipped, not green)."""
    from airflow.sdk import DagRunState, TaskInstanceState

    from tieredcore.config import Config
    from tieredcore.reports import NOT_PLANNED

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=1, entries=5)
    cfg.write_text(replace(Config.load(cfg, env={}), metadata_url=f"zk://127.0.0.1:{port}/t?timeout=1s").to_toml())
    dr, states = run_dag("tiered_scrub", SWEEP_AT + dt.timedelta(days=1), {"config": str(cfg)})
    assert dr.state == DagRunState.FAILED
    assert states["plan"] == TaskInstanceState.UPSTREAM_FAILED and states["summary"] == TaskInstanceState.SKIPPED  # run.json written, nothing added up
    rec = _run_json(cfg, "tiered_scrub", dr.run_id)
    assert rec["totals"]["failed_jobs"] == [NOT_PLANNED] and rec["parts"] == [] and rec["nothing_due"] == []
    assert json.loads(json.dumps(rec)) == rec
