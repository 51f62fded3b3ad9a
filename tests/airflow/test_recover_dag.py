"""The tiered_recover DAG (manual trigger): a workspace whose topics are offloaded loses its SQLite metadata
store; the default run (a dry run) reports what it would create and writes nothing; a run with `apply`
gives back every topic record, and `tiered verify` passes; a second `apply` is refused by the plan with one
line (the store is not empty), before any Spark job."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from tests.support.workspaces import offload, sealed

from .conftest import SWEEP_AT, make_workspace, run_dag, verify, xcom

NS = ["acme/a", "acme/b"]


def bucket_listing(cfg: Path) -> list[tuple[str, int]]:
    from tieredcore.cold.blob import iter_objects
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(cfg, env={})) as ws:
        return [(o.key, o.size) for o in iter_objects(ws.store)]


def records(cfg: Path) -> dict[str, list[tuple[int, bool]]]:
    from tieredcore.config import Config
    from tieredcore.offload.context import is_complete
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(cfg, env={})) as ws:
        return {t.full: [(li.ledgerId, is_complete(li)) for li in ws.ml.get_topic(t)[0].ledgerInfo]
                for ns in ws.ml.list_namespaces() for t in ws.ml.list_topics(ns)}


@pytest.mark.slow
def test_recover_dag_dry_run_then_apply_then_refused(tmp_path: Path, spark_env, capfd) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    cfg = make_workspace(tmp_path / "ws", NS, topics=2, ledgers=3, entries=20)
    with Workspace(Config.load(cfg, env={})) as ws:
        for ns in NS:
            for t in ws.ml.list_topics(ns):
                offload(ws, t.full, sealed(ws, t.full))
    before = records(cfg)
    assert len(before) == 4 and all(any(c for _, c in v) for v in before.values())
    os.remove(tmp_path / "ws" / "metadata.db")  # the metadata store is lost
    listing = bucket_listing(cfg)

    # default params: a dry run, nothing written
    dr, states = run_dag("tiered_recover", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states == {"preflight": TaskInstanceState.SUCCESS, "plan": TaskInstanceState.SUCCESS,
                      "recover": TaskInstanceState.SUCCESS, "summary": TaskInstanceState.SUCCESS,
                      "verdict": TaskInstanceState.SUCCESS}
    assert "--apply" not in xcom(dr, "plan")
    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"create": 4} and totals["failures"] == 0
    assert totals["counters"]["from_manifests"] == 4 and totals["counters"]["from_index"] == 0
    assert records(cfg) == {} and bucket_listing(cfg) == listing
    run_dir = tmp_path / "ws" / "reports" / "tiered_recover" / tiered_run_id(dr.run_id)
    assert (run_dir / "run.json").is_file() and (run_dir / "recover" / "summary.json").is_file()
    out, err = capfd.readouterr()
    assert "from_manifests=4" in out + err and "damaged_manifests=0" in out + err, (out + err)[-3000:]

    # apply: every topic back, verified, the bucket untouched
    dr, states = run_dag("tiered_recover", SWEEP_AT + dt.timedelta(hours=1), {"config": str(cfg), "apply": True})
    assert dr.state == DagRunState.SUCCESS, states
    assert "--apply" in xcom(dr, "plan")
    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"created": 4} and totals["failures"] == 0
    assert records(cfg) == before and bucket_listing(cfg) == listing
    res = verify(cfg)  # every entry read back and checked against the generator's digest
    assert (res["verified"], res["failed"], len(res["topics"])) == (4, 0, 4)

    # the store is not empty now: refused in plan, one line, no Spark job
    dr, states = run_dag("tiered_recover", SWEEP_AT + dt.timedelta(hours=2), {"config": str(cfg), "apply": True})
    assert dr.state == DagRunState.FAILED
    assert states["plan"] == TaskInstanceState.FAILED and states["recover"] == TaskInstanceState.UPSTREAM_FAILED
    out, err = capfd.readouterr()
    assert "recover refused: the metadata store is not empty" in out + err
