"""The tiered_table_export DAG end to end: dag.test() with a real spark-submit of spark_jobs/export_tables.py.
Its plan's arguments (logical time, run id), the summary's totals, the run's report, the Iceberg tables."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from .conftest import SWEEP_AT, get_dag, make_workspace, run_dag, set_policy, xcom


def test_params_refuse_bad_input() -> None:
    """The trigger form refuses what the plan would (the plan checks again), the schedule has both halves."""
    from airflow.sdk.exceptions import ParamValidationError

    dag = get_dag("tiered_table_export")
    age = dag.params.get_param("orphan_age")
    for good in (0, 3600):
        assert age.resolve(good) == good
    for bad in (-1, "1h", 1.5, 10**9):
        with pytest.raises(ParamValidationError):
            age.resolve(bad)
    ns = dag.params.get_param("namespaces")
    assert ns.resolve(["public/default"]) == ["public/default"]
    with pytest.raises(ParamValidationError):
        ns.resolve(["public/default/topic"])
    assert "tiered_offloaded" in dag.description and dag.default_args["retries"] >= 1


@pytest.mark.slow
def test_table_export_dag_exports_offloaded_ledgers(tmp_path: Path, spark_env) -> None:
    from airflow.sdk import DagRunState
    from tiered_airflow import tiered_run_id

    from tieredcore.config import Config
    from tieredcore.lifecycle import export as ex
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.sweep import plan_offload
    from tieredcore.workspace import Workspace

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=2, ledgers=2, entries=30)
    set_policy(cfg, "public/default", offload_threshold_bytes=0)
    config = Config.load(cfg, env={})
    with Workspace(config) as ws:
        rows = list(run_work(config, [w.as_dict() for w in plan_offload(ws, None, int(SWEEP_AT.timestamp() * 1000))]))
        assert {r["outcome"] for r in rows} == {"offloaded"}
        offloaded = len(rows)

    dr, states = run_dag("tiered_table_export", SWEEP_AT + dt.timedelta(days=1), {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    args = xcom(dr, "plan")
    assert args[args.index("--as-of") + 1].startswith((SWEEP_AT + dt.timedelta(days=1)).date().isoformat())
    totals = xcom(dr, "summary")
    assert totals["ledgers"] == offloaded and totals["outcomes"] == {"exported": offloaded}
    assert totals["namespaces"]["public/default"]["ledgers"] == offloaded
    report = tmp_path / "ws" / "reports" / "tiered_table_export" / tiered_run_id(dr.run_id) / "export" / "summary.json"
    summary = json.loads(report.read_text())
    assert len(summary["tables"]) == 2 and all(t["snapshot_id"] for t in summary["tables"])
    cat = ex.open_catalog(config)
    assert sum(ex.read_table(cat, ("public_default", n)).num_rows for n in ("topic_0000", "topic_0001")) \
        == summary["totals"]["counters"]["rows"] > 0
