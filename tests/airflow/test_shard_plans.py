"""Shards, not namespaces: the per-namespace DAGs (offload sweep, compaction) plan every namespace on one
Workspace and start one Spark application per shard (at most `spark_shards` / the `shards` param), each
mapped task labelled by its shard's namespaces; the report still has every namespace."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import jinja2.sandbox
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .conftest import SWEEP_AT, allowed_configs, get_dag, make_workspace, run_dag, set_policy, xcom

# tasks after the plan marked done without running (the fast tests look at the plan only)
AFTER_PLAN = "offload|compact|summary|verdict|announce"
NAMESPACES = [f"acme/ns{i}" for i in range(5)]


def _workspace(tmp_path: Path, entries: int = 20) -> Path:
    cfg = make_workspace(tmp_path / "ws", [*NAMESPACES, "acme/idle", "acme/off"], topics=1, ledgers=2,
                         entries=entries)
    for ns in NAMESPACES:
        set_policy(cfg, ns, offload_threshold_bytes=0)
    set_policy(cfg, "acme/idle", offload_threshold_bytes=2**40)  # offload on, nothing due
    return cfg  # acme/off: no policy, offload off: not planned at all


def _test(dag_id: str, **kw):
    """dag.test() with the run's configuration on the admin's allow-list (TIERED_CONFIG_ALLOWED)."""
    with allowed_configs(str(kw["run_conf"]["config"])):
        return get_dag(dag_id).test(**kw)


def _mapped(dr, task_id: str) -> list:
    return sorted((ti for ti in dr.get_task_instances() if ti.task_id == task_id and ti.map_index >= 0),
                  key=lambda ti: ti.map_index)


@pytest.mark.parametrize("conf, shards", [({}, 2), ({"shards": 3}, 3), ({"shards": 1}, 1), ({"shards": 50}, 5)])
def test_sweep_plans_shards_not_namespaces(tmp_path: Path, conf: dict, shards: int) -> None:
    """Five namespaces with work: `shards` argument lists (default: the configuration's spark_shards, 2;
    the param overrides it; never more than the namespaces with work), each namespace in exactly one,
    as many mapped Spark tasks; the idle namespace under nothing_due with its planning's reason."""
    cfg = _workspace(tmp_path)
    dr = _test("tiered_offload_sweep", logical_date=SWEEP_AT, run_conf={"config": str(cfg), **conf},
                                              mark_success_pattern=AFTER_PLAN)
    planned = xcom(dr, "plan")
    assert len(planned) == shards == len(_mapped(dr, "offload"))
    layout = xcom(dr, "plan", key="shards")
    assert [s["namespaces"] for s in layout] == [a[1:a.index("--as-of"):2] for a in planned]
    assert sorted(ns for s in layout for ns in s["namespaces"]) == NAMESPACES
    assert all(s["units"] == len(s["namespaces"]) and s["bytes"] > 0 for s in layout)
    (idle,) = xcom(dr, "plan", key="nothing_due")
    assert idle["namespace"] == "acme/idle"
    assert idle["reason"].startswith("no sealed ledger due by the policy in 1 topic(s) with offload on (threshold "
                                     f"{2**40} bytes hot; ")
    run_ids = [a[a.index("--run-id") + 1] for a in planned]
    assert len(set(run_ids)) == shards  # each shard its own report until the reports are the run's
    if shards > 1:
        assert all(r.endswith(f".shard-{i}") for i, r in enumerate(run_ids))


def test_nothing_due_anywhere_starts_no_spark_job(tmp_path: Path) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", ["acme/idle"], topics=1, ledgers=2, entries=5)
    set_policy(cfg, "acme/idle", offload_threshold_seconds=10**9)
    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states["offload"] == TaskInstanceState.SKIPPED and xcom(dr, "plan") == []
    assert xcom(dr, "plan", key="shards") == []
    (idle,) = xcom(dr, "plan", key="nothing_due")
    assert idle["namespace"] == "acme/idle" and f"sealed {10**9} s ago" in idle["reason"]
    assert xcom(dr, "summary")["nothing_due"] == [idle]


def test_compaction_plans_shards_with_reasons(tmp_path: Path) -> None:
    cfg = make_workspace(tmp_path / "ws", ["acme/a", "acme/b", "acme/c", "acme/empty"], topics=1, ledgers=2,
                         entries=5)
    for ns in ("acme/a", "acme/b", "acme/c"):
        set_policy(cfg, ns, compaction_enabled=True)
    dr = _test("tiered_compaction",
        logical_date=SWEEP_AT, run_conf={"config": str(cfg), "namespaces": ["acme/a", "acme/b", "acme/c", "acme/empty"]},
        mark_success_pattern=AFTER_PLAN)
    planned = xcom(dr, "plan")
    assert len(planned) == 2 == len(_mapped(dr, "compact"))
    assert sorted(ns for a in planned for ns in a[1:a.index("--as-of"):2]) == ["acme/a", "acme/b", "acme/c"]
    assert xcom(dr, "plan", key="nothing_due") == [
        {"namespace": "acme/empty", "reason": "compaction is off in the policy of its 1 topic(s)"}]
    # a dry run plans it too: what would enabling compaction save there?
    dry = _test("tiered_compaction",
        logical_date=SWEEP_AT + dt.timedelta(days=1),
        run_conf={"config": str(cfg), "dry_run": True, "namespaces": ["acme/empty"]}, mark_success_pattern=AFTER_PLAN)
    assert [a[:2] for a in xcom(dry, "plan")] == [["--namespace", "acme/empty"]] and xcom(dry, "plan", key="nothing_due") == []


@pytest.mark.parametrize("shards", [0, -2, 5000, "two"])
def test_bad_shards_param_refused_before_a_run(tmp_path: Path, shards) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError, match="shards"):
        get_dag("tiered_offload_sweep").test(logical_date=SWEEP_AT, run_conf={"config": "x", "shards": shards})


def test_bad_spark_shards_setting_fails_the_run_with_its_name(tmp_path: Path, monkeypatch, capfd) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = _workspace(tmp_path)
    monkeypatch.setenv("TIERED_SPARK_SHARDS", "0")
    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.FAILED and states["preflight"] == TaskInstanceState.FAILED, states
    out, err = capfd.readouterr()
    assert "spark_shards must be 1..1024 Spark applications per run, got 0" in out + err


# -- labels -----------------------------------------------------------------------------------------

names = st.from_regex(r"[a-c]{1,8}/[a-z0-9]{1,12}", fullmatch=True)


@given(st.lists(names, min_size=1, max_size=12, unique=True))
def test_the_label_template_renders_the_shards_rule(namespaces: list[str]) -> None:
    """dags/tiered_spark.py labels mapped tasks in Jinja from the shard's arguments: the same text as
    tieredcore.lifecycle.shards.shard_label."""
    from tiered_spark import SHARD_LABEL_TEMPLATE

    from tieredcore.lifecycle.shards import LABEL_WIDTH, shard_label

    class Task:
        application_args = [a for ns in namespaces for a in ("--namespace", ns)] + [
            "--as-of", "2026-01-01T00:00:00+00:00", "--run-id", "r", "--max-topics", "3"]

    rendered = jinja2.sandbox.SandboxedEnvironment().from_string(SHARD_LABEL_TEMPLATE).render(task=Task)
    assert rendered == shard_label(namespaces)
    assert len(rendered) <= LABEL_WIDTH or rendered == f"{namespaces[0]} +{len(namespaces) - 1} more"


# -- real Spark -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_shards_run_every_namespace_and_the_report_has_each(tmp_path: Path, spark_env) -> None:
    """Five namespaces with work, two shards: two spark-submits (labelled by their namespaces), every
    namespace's ledgers offloaded, the summary's per-namespace totals name all five."""
    from airflow.sdk import DagRunState, TaskInstanceState

    from tieredcore.lifecycle.shards import shard_label

    cfg = _workspace(tmp_path, entries=5)
    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states["offload[0]"] == states["offload[1]"] == TaskInstanceState.SUCCESS and "offload[2]" not in states
    layout = xcom(dr, "plan", key="shards")
    labels = {ti.map_index: ti.rendered_map_index for ti in _mapped(dr, "offload")}
    assert labels == {i: shard_label(s["namespaces"]) for i, s in enumerate(layout)}
    totals = xcom(dr, "summary")
    assert sorted(totals["namespaces"]) == NAMESPACES
    assert totals["ledgers"] == 5 * 2 and totals["outcomes"] == {"offloaded": 10} and not totals["failed_jobs"]
    assert [d["namespace"] for d in totals["nothing_due"]] == ["acme/idle"]
    # the next run 15 minutes later: everything offloaded, every namespace says why nothing is due
    dr2, states2 = run_dag("tiered_offload_sweep", SWEEP_AT + dt.timedelta(minutes=15), {"config": str(cfg)})
    assert states2["offload"] == TaskInstanceState.SKIPPED
    assert sorted(d["namespace"] for d in xcom(dr2, "plan", key="nothing_due")) == sorted([*NAMESPACES, "acme/idle"])
