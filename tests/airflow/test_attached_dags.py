"""The DAGs on a workspace attached to a Pulsar cluster (tests/support/pulsar_cluster.py): the offload
sweep, the deletion-lag cleanup, retention and compaction skip every namespace with one line saying they
are the brokers' jobs (visible in the plan task's log) and succeed without a Spark job; reconciliation,
drain and scrub run (the scrub fails, not retried, on the fixture's damaged message: repair impossible without
BookKeeper); Pulsar's ZooKeeper paths are the same before and after every run."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.support.pulsar_cluster import LOCAL

from .conftest import run_dag, tiered, xcom

AT = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
BROKERS_DAGS = {  # dag -> (its Spark tasks, the job named in the skip line)
    "tiered_offload_sweep": (["offload"], "offload sweep"),
    "tiered_deletion_lag_cleanup": (["cleanup"], "deletion-lag cleanup"),
    "tiered_retention": (["retention", "drain"], "retention"),
    "tiered_compaction": (["compact"], "compaction"),
}


def attach(tmp_path: Path, cluster) -> Path:
    ws = tmp_path / "ws"
    extra = ["--brokers-default"] if cluster.spec.driver == LOCAL else []
    assert tiered("init", str(ws), "--pulsar-zk", cluster.pulsar_zk, "--store-url", cluster.store_url, *extra) == 0
    return ws / "tiered.toml"


def bucket(cluster) -> dict[str, int]:
    from tieredcore.cold.blob import iter_objects

    return {o.key: o.size for o in iter_objects(cluster.store, "")}


@pytest.mark.parametrize("dag_id", BROKERS_DAGS)
def test_the_brokers_jobs_skip_an_attached_cluster_with_one_line(tmp_path: Path, pulsar_cluster, caplog, dag_id):
    """Each of them: success, no Spark job, and in the plan task's log one line per planning naming the job
    and the cluster whose brokers do it (the core planners' warning: CLI, Spark jobs and DAGs alike)."""
    from airflow.sdk import DagRunState, TaskInstanceState

    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    spark, job = BROKERS_DAGS[dag_id]
    caplog.clear()
    with caplog.at_level("WARNING", logger="tieredcore"):
        dr, states = run_dag(dag_id, AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert all(states[t] == TaskInstanceState.SKIPPED for t in spark), states
    lines = [r.getMessage() for r in caplog.records if r.name == "tieredcore.lifecycle.work"]
    assert [ln for ln in lines if ln.startswith(f"{job}: skipped every namespace: attached to Pulsar cluster "
                                                f"'pulsar-a', whose brokers do ")] == lines[:1], lines
    assert len(lines) == (2 if dag_id == "tiered_retention" else 1), lines  # retention: and its lag cleanup
    assert xcom(dr, "summary")["failures"] == 0
    assert cluster.snapshot() == zk and bucket(cluster) == objects


@pytest.mark.slow
def test_reconciliation_drain_and_scrub_run_on_an_attached_cluster(tmp_path: Path, pulsar_cluster, spark_env, capfd):
    """Their Spark jobs (real spark-submit) open the attached workspace on the executors too: each run ends
    with its summary, and Pulsar's ZooKeeper paths and its bucket are unchanged (reconciliation in a dry
    run: what it may delete there is its own work's to decide).

    The scrub finds the fixture's damaged message (2001:4 of acme/orders/audit): on an attached cluster it
    is ``unrepairable`` (repair impossible without BookKeeper, which is Pulsar's), not data loss. The job
    reports it per namespace and position and exits 4; the DAG fails the scrub task without a retry (a
    retry reads the same bytes) with a message saying so, the summary still runs and carries the damage,
    the verdict is upstream_failed. The default ``repair`` param is forced off with one line."""
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    for dag_id, conf, spark in (("tiered_orphan_reconciliation", {"dry_run": True}, ("reconcile", "success")),
                                ("tiered_deletion_drain", {}, ("drain", "skipped"))):  # no deletion record
        dr, states = run_dag(dag_id, AT, {"config": str(cfg), **conf})
        assert states[spark[0]] == spark[1] and states["summary"] == TaskInstanceState.SUCCESS, (dag_id, states)
        assert not xcom(dr, "summary").get("failed_jobs"), (dag_id, xcom(dr, "summary"))

    capfd.readouterr()
    dr, states = run_dag("tiered_scrub", AT, {"config": str(cfg), "deep": "always"})  # repair: the default (on)
    logged = "".join(capfd.readouterr())
    assert dr.state == DagRunState.FAILED
    assert states["scrub"] == TaskInstanceState.FAILED and states["summary"] == TaskInstanceState.SUCCESS
    assert states["verdict"] == TaskInstanceState.UPSTREAM_FAILED, states
    (ti,) = [ti for ti in dr.get_task_instances() if ti.task_id == "scrub"]
    assert ti.try_number == 1  # not retried
    assert ("spark job scrub failed (spark-submit exit 4); its ERROR lines are above: DAMAGED offloaded copies "
            "on the attached Pulsar cluster, repair impossible without BookKeeper: the job reported them "
            "(namespace, topic, position) and changed nothing; an operator must act (docs/pulsar.md, Scrub); "
            "not retried") in logged
    assert ("scrub: repair off: attached to Pulsar cluster 'pulsar-a': repair impossible without BookKeeper "
            "(damaged copies are reported, never replaced or deleted)") in logged
    damaged_line = "DAMAGED acme/orders persistent://acme/orders/audit 2001:4 CRC32C mismatch"
    assert damaged_line in logged and "outcome DAMAGED (repair impossible without BookKeeper)" in logged
    assert "DATA LOSS" not in logged

    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"ok": 5, "unrepairable": 1} and totals["data_loss"] == [] and totals["failures"] == 1
    (damage,) = totals["namespaces"]["acme/orders"]["damage"]
    audit = cluster.ledger("acme/orders/persistent/audit", 2001)
    assert {k: damage[k] for k in ("topic", "ledger", "uuid", "outcome", "repair")} == {
        "topic": "persistent://acme/orders/audit", "ledger": 2001, "uuid": audit.uuid, "outcome": "unrepairable",
        "repair": "impossible without BookKeeper"}
    assert [m["position"] for m in damage["damaged_messages"]] == ["2001:4"]
    assert damage["damaged_messages"][0]["reason"].startswith("CRC32C mismatch")
    assert all("damage" not in d for ns, d in totals["namespaces"].items() if ns != "acme/orders")
    report = tmp_path / "ws" / "reports" / "tiered_scrub" / tiered_run_id(dr.run_id) / "scrub" / "summary.json"
    summary = json.loads(report.read_text())
    assert summary["namespaces"]["acme/orders"]["damage"] == [damage]
    assert summary["damaged_messages"] == ["persistent://acme/orders/audit 2001:4"]
    assert cluster.snapshot() == zk and bucket(cluster) == objects
