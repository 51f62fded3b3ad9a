"""The orphan reconciliation and drain DAGs on a workspace attached to a Pulsar cluster
(tests/support/pulsar_cluster.py, built from Pulsar's MetaStoreImpl, OffloadUtils and
BlobStoreManagedLedgerOffloader): with ``apply`` off (the default) a run only plans and its report lists
exactly the planted orphans; with ``apply`` on it appends their records, and the drain DAG then deletes
exactly them (bucket diff); Pulsar's ZooKeeper paths are byte-identical throughout. ``apply`` with
``dry_run`` fails the run before Spark starts."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.support.pulsar_cluster import LOCAL, ORPHAN

from .conftest import run_dag, xcom
from .test_attached_dags import attach, bucket

AT = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)


def test_apply_with_dry_run_fails_in_plan_before_spark(tmp_path: Path, pulsar_cluster):
    from airflow.sdk import DagRunState, TaskInstanceState

    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    dr, states = run_dag("tiered_orphan_reconciliation", AT, {"config": str(cfg), "apply": True, "dry_run": True})
    assert dr.state == DagRunState.FAILED and states["plan"] == TaskInstanceState.FAILED
    assert states["reconcile"] == TaskInstanceState.UPSTREAM_FAILED
    assert not list((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))  # no job ran: no part wrote a report


def _report(tmp_path: Path, job: str, dr) -> dict:
    """The report of the DAG run's one Spark task (tieredcore.reports layout: DAG id, run key, task id)."""
    from tiered_airflow import tiered_run_id

    task_id = {"reconcile_orphans": "reconcile", "deletion_drain": "drain"}[job]
    path = tmp_path / "ws" / "reports" / dr.dag_id / tiered_run_id(dr.run_id) / task_id / "summary.json"
    report = json.loads(path.read_text())
    assert report["job"] == job
    return report


@pytest.mark.slow
def test_reconciliation_plans_then_applies_and_the_drain_deletes_only_the_orphans(tmp_path: Path, pulsar_cluster,
                                                                                 spark_env):
    from airflow.sdk import DagRunState, TaskInstanceState

    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    # the objects carry the wall clock: runs far enough after them, the grace reaching back exactly to the
    # moment between the old orphans and the young ones (PulsarCluster.boundary_ms)
    first = dt.datetime.fromtimestamp(cluster.boundary_ms / 1000, dt.UTC).replace(
        hour=12, minute=0, second=0, microsecond=0) + dt.timedelta(days=9)
    runs = {}
    for n, apply in ((0, False), (1, True)):
        at = first + dt.timedelta(days=n)
        grace = int(at.timestamp() * 1000) - cluster.boundary_ms  # --as-of: the run's data interval end
        dr, states = run_dag("tiered_orphan_reconciliation", at, {"config": str(cfg), "apply": apply,
                                                                   "grace": str(grace)})
        assert dr.state == DagRunState.SUCCESS and states["reconcile"] == TaskInstanceState.SUCCESS, states
        runs[apply] = rep = _report(tmp_path, "reconcile_orphans", dr)
        assert rep["as_of_ms"] == int(at.timestamp() * 1000), rep["as_of_ms"]
        assert rep["attached"] and rep["dry_run"] is (not apply) and rep["grace_ms"] == grace
        assert {c["key"] for c in rep["candidates"]} == cluster.keys(ORPHAN)
        assert {w["reason"] for w in rep["withheld"]} == {"other-cluster", "young", "foreign-key"}
        assert rep["records_appended"] == (3 if apply else 0)
        assert bucket(cluster) == objects and cluster.snapshot() == zk
    assert runs[False]["orphans_by_namespace"] == runs[True]["orphans_by_namespace"]
    assert xcom(dr, "summary")["failures"] == 0

    dr, states = run_dag("tiered_deletion_drain", first + dt.timedelta(days=3), {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS and states["drain"] == TaskInstanceState.SUCCESS, states
    drained = _report(tmp_path, "deletion_drain", dr)
    assert drained["deleted"] == 3 and drained["referenced_again"] == 0, drained
    after = bucket(cluster)
    assert set(objects) - set(after) == cluster.keys(ORPHAN)
    assert {k: v for k, v in objects.items() if k in after} == after
    assert cluster.snapshot() == zk
