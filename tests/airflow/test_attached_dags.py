"""The DAGs on a workspace attached to a Pulsar cluster (tests/support/pulsar_cluster.py): the offload
sweep, the deletion-lag cleanup, retention and compaction skip every namespace with one line saying they
are the brokers' jobs (visible in the plan task's log) and succeed without a Spark job; reconciliation,
drain and scrub run; Pulsar's ZooKeeper paths are the same before and after every run."""

from __future__ import annotations

import datetime as dt
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
def test_reconciliation_drain_and_scrub_run_on_an_attached_cluster(tmp_path: Path, pulsar_cluster, spark_env):
    """Their Spark jobs (real spark-submit) open the attached workspace on the executors too: each run ends
    with its summary, and Pulsar's ZooKeeper paths and its bucket are unchanged (reconciliation in a dry
    run: what it may delete there is its own work's to decide)."""
    from airflow.sdk import TaskInstanceState

    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    for dag_id, conf, spark in (("tiered_orphan_reconciliation", {"dry_run": True}, ("reconcile", "success")),
                                ("tiered_deletion_drain", {}, ("drain", "skipped")),  # no deletion record
                                ("tiered_scrub", {"deep": "always", "repair": False}, ("scrub", "success"))):
        dr, states = run_dag(dag_id, AT, {"config": str(cfg), **conf})
        assert states[spark[0]] == spark[1] and states["summary"] == TaskInstanceState.SUCCESS, (dag_id, states)
        assert not xcom(dr, "summary").get("failed_jobs"), (dag_id, xcom(dr, "summary"))
    assert cluster.snapshot() == zk and bucket(cluster) == objects
