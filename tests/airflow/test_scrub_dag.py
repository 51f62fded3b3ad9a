"""The tiered_scrub DAG end to end: dag.test() with a real spark-submit of spark_jobs/scrub.py. One
damaged copy is repaired from its hot copy, one without a hot copy is reported as data loss (the run
fails and names it); nothing is deleted by the scrub itself."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from .conftest import SWEEP_AT, make_workspace, run_dag, set_policy, topic_ledgers, xcom


@pytest.mark.slow
def test_scrub_dag_repairs_and_reports_data_loss(tmp_path: Path, spark_env) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    from tieredcore.config import Config
    from tieredcore.formats.keys import data_key, index_key
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.sweep import plan_offload
    from tieredcore.meta.managed_ledgers import find_ledger
    from tieredcore.offload.context import context_uuid
    from tieredcore.workspace import Workspace

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=2, ledgers=2, entries=30)
    set_policy(cfg, "public/default", offload_threshold_bytes=0)
    config = Config.load(cfg, env={})
    with Workspace(config) as ws:
        rows = list(run_work(config, [w.as_dict() for w in plan_offload(ws, None, int(SWEEP_AT.timestamp() * 1000))]))
        assert {r["outcome"] for r in rows} == {"offloaded"}
    (t0, ledgers0), (t1, ledgers1) = sorted(topic_ledgers(cfg).items())
    repairable, lost = ledgers0[0], ledgers1[1]
    with Workspace(config) as ws:
        # a store that lost a ledger's index; and a flipped payload byte in a ledger whose hot copy is gone
        ws.store.delete([index_key("", context_uuid(repairable), repairable.ledgerId)])
        dkey = data_key("", context_uuid(lost), lost.ledgerId)
        md, data = ws.store.head(dkey).metadata, bytearray(ws.store.get(dkey))
        data[128 + 12 + 20] ^= 1
        ws.store.put(dkey, bytes(data), md)
        ws.hot.delete_ledger(lost.ledgerId)

        def mark(info):
            find_ledger(info, lost.ledgerId).offloadContext.bookkeeperDeleted = True

        ws.ml.update_topic(t1, mark)

    dr, states = run_dag("tiered_scrub", SWEEP_AT + dt.timedelta(days=1),
                         {"config": str(cfg), "deep": "always", "repair": True})
    assert dr.state == DagRunState.FAILED  # data loss fails the run
    assert states["scrub"] == TaskInstanceState.FAILED  # the job exits 3: data loss
    (ti,) = [ti for ti in dr.get_task_instances() if ti.task_id == "scrub"]
    assert ti.try_number == 1  # not retried: a retry cannot bring the data back
    assert states["summary"] == TaskInstanceState.SUCCESS and states["verdict"] == TaskInstanceState.UPSTREAM_FAILED

    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"ok": 2, "repaired": 1, "unrecoverable": 1}
    assert totals["data_loss"] == [f"{t1} ledger {lost.ledgerId}"]
    assert totals["namespaces"]["public/default"]["outcomes"] == {"ok": 2, "repaired": 1, "unrecoverable": 1}
    assert totals["bytes"] > 0
    report = tmp_path / "ws" / "reports" / "tiered_scrub" / tiered_run_id(dr.run_id) / "scrub" / "summary.json"
    summary = json.loads(report.read_text())
    assert summary["data_loss"] == totals["data_loss"] and summary["failures"] == 1

    after = dict(topic_ledgers(cfg))
    fixed = find_ledger_list(after[t0], repairable.ledgerId)
    assert context_uuid(fixed) != context_uuid(repairable) and fixed.offloadContext.complete
    still = find_ledger_list(after[t1], lost.ledgerId)
    assert context_uuid(still) == context_uuid(lost)  # the damaged copy is kept: nothing was deleted
    with Workspace(config) as ws:
        assert ws.store.head(dkey).size == len(data)


def find_ledger_list(ledgers, lid):
    (li,) = [li for li in ledgers if li.ledgerId == lid]
    return li
