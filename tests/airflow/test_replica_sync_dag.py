"""The tiered_replica_sync DAG: scheduled from TIERED_REPLICA_SYNC_SCHEDULE (default every 15 minutes), one
task retried with backoff; dag.test() runs on a real replica of an embedded workspace's bucket: the first
run creates the topics, the source deletes one, the next run removes it, and the bucket never changes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from .conftest import SWEEP_AT, cron_of, get_dag, make_workspace, run_dag, tiered, xcom

NS = "public/default"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_structure() -> None:
    dag = get_dag("tiered_replica_sync")
    assert cron_of(dag) == "*/15 * * * *" and dag.max_active_runs == 1
    assert [t.task_id for t in dag.roots] == ["wait_turn"]  # one slot at a time, as every scheduled DAG
    task = dag.get_task("sync")
    assert task.upstream_task_ids == {"wait_turn"} and task.downstream_task_ids == set()
    assert task.retries >= 1 and task.retry_exponential_backoff
    assert task.execution_timeout == dt.timedelta(minutes=30)


def test_runs_follow_the_source_and_never_touch_its_bucket(tmp_path: Path) -> None:
    src_cfg = make_workspace(tmp_path / "source", [NS], topics=2, ledgers=2, entries=20)
    assert tiered("--config", str(src_cfg), "offload", "--namespace", NS, "--keep-bytes", "0") == 0
    bucket = tmp_path / "source" / "cold"
    rep = tmp_path / "replica"
    assert tiered("init", str(rep), "--replica-of", f"file://{bucket}") == 0
    rep_cfg = rep / "tiered.toml"
    objects = tree(bucket)

    dr, states = run_dag("tiered_replica_sync", SWEEP_AT, {"config": str(rep_cfg)})
    assert states == {"wait_turn": "success", "sync": "success"}, states
    res = xcom(dr, "sync")
    assert res["created"] == [f"{NS}/persistent/topic-0000", f"{NS}/persistent/topic-0001"]
    assert res["lag"]["behind"] == 0 and tree(bucket) == objects

    assert tiered("--config", str(src_cfg), "topics", "delete", f"{NS}/topic-0000", "--yes") == 0
    objects = tree(bucket)
    dr, states = run_dag("tiered_replica_sync", SWEEP_AT + dt.timedelta(minutes=15), {"config": str(rep_cfg)})
    assert states == {"wait_turn": "success", "sync": "success"}, states
    res = xcom(dr, "sync")
    assert res["removed"] == [f"{NS}/persistent/topic-0000"] and not res["created"]
    assert tree(bucket) == objects
    assert tiered("--config", str(rep_cfg), "verify") == 0

    # a workspace that is not a replica: the task fails at once (no retry helps)
    _, states = run_dag("tiered_replica_sync", SWEEP_AT + dt.timedelta(minutes=30), {"config": str(src_cfg)})
    assert states == {"wait_turn": "success", "sync": "failed"}, states


def test_other_dags_refuse_a_replica_in_preflight(tmp_path: Path) -> None:
    """The drain (a DAG that deletes) on a replica's configuration: preflight fails with the one line, no job
    runs, the bucket is unchanged."""
    src_cfg = make_workspace(tmp_path / "source", [NS], topics=1, ledgers=2, entries=10)
    assert tiered("--config", str(src_cfg), "offload", "--namespace", NS, "--keep-bytes", "0") == 0
    bucket = tmp_path / "source" / "cold"
    rep = tmp_path / "replica"
    assert tiered("init", str(rep), "--replica-of", f"file://{bucket}") == 0
    assert tiered("--workspace", str(rep), "replica-sync") == 0
    objects = tree(bucket)
    _, states = run_dag("tiered_deletion_drain", SWEEP_AT, {"config": str(rep / "tiered.toml")})
    assert states["preflight"] == "failed" and states.get("drain") != "success", states
    assert tree(bucket) == objects
