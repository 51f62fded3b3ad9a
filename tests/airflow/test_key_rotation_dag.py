"""The tiered_key_rotation DAG: its target param refuses what is not a key id (the trigger form), and one
dag.test() run with a real spark-submit of spark_jobs/rotate_keys.py re-wraps every encrypted object
under the newly active key (unencrypted ones skipped), after which the old key retires and every entry
still reads back."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from .conftest import SWEEP_AT, get_dag, run_dag, xcom

ENC, ZSTD = "public/default", "acme/logs"
LEDGERS = 2


def test_structure_and_target_param() -> None:
    """preflight → plan → rotate → summary → verdict (which also waits on the Spark task); manual only;
    the target param takes key ids only."""
    from airflow.sdk.exceptions import ParamValidationError

    dag = get_dag("tiered_key_rotation")
    assert dag.schedule is None and dag.params["dry_run"] is False and dag.params["target"] == ""
    edges = {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}
    assert edges == {("preflight", "plan"), ("plan", "rotate"), ("rotate", "summary"), ("rotate", "verdict"),
                     ("summary", "verdict")}
    assert dag.get_task("rotate").job == "rotate_keys" and dag.get_task("rotate").retries >= 1
    param = dag.params.get_param("target")
    for good in ("", "kek-2026", "k.1_a"):
        assert param.resolve(good) == good
    for bad in ("bad:id", "a b", "x" * 65, "../k"):
        with pytest.raises(ParamValidationError):
            param.resolve(bad)


@pytest.mark.slow
def test_key_rotation_dag_rewraps_everything(tmp_path: Path, spark_env) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    from tests.support.workspaces import build_workspace
    from tieredcore.cold.keyring import KeyRing
    from tieredcore.config import Config
    from tieredcore.lifecycle.keys import key_status, retire
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.sweep import plan_offload
    from tieredcore.names import TopicName
    from tieredcore.offload.copies import open_offloaded
    from tieredcore.workspace import Workspace

    ring = tmp_path / "ring"
    KeyRing.add_key(ring, "k1", bits=2048)
    cfg = build_workspace(tmp_path / "ws", [ENC, ZSTD], ledgers=LEDGERS, entries=40, entry_size="20-2000",
                          config_overrides={"key_ring": str(ring)})
    config = Config.load(cfg, env={})

    def entries(ws: Workspace) -> dict[str, list[bytes]]:
        out = {}
        for ns in (ENC, ZSTD):
            topic = f"persistent://{ns}/topic-0000"
            out[ns] = []
            for li in ws.ml.get_topic(topic)[0].ledgerInfo[:-1]:
                h = open_offloaded(li, ws.offloader, TopicName.parse(topic).managed_ledger_name,
                                   ws.offloader_for_driver)
                try:
                    out[ns] += [bytes(e.data) for e in h.read(0, li.entries - 1)]
                finally:
                    h.close()
        return out

    with Workspace(config) as ws:
        ps = ws.policies
        ps.set_namespace(ENC, {"offload_threshold_bytes": 0, "transform": "zstd+aes", "transform_chunk_size": 4096})
        ps.set_namespace(ZSTD, {"offload_threshold_bytes": 0, "transform": "zstd", "transform_chunk_size": 4096})
        rows = list(run_work(config, [w.as_dict() for w in plan_offload(ws, None, int(SWEEP_AT.timestamp() * 1000))]))
        assert len(rows) == 2 * LEDGERS and {r["outcome"] for r in rows} == {"offloaded"}, rows
        before = entries(ws)
    n = 2 * LEDGERS  # objects per namespace: data and index per ledger
    KeyRing.add_key(ring, "k2", bits=2048)  # active at once

    dr, states = run_dag("tiered_key_rotation", SWEEP_AT + dt.timedelta(hours=1), {"config": str(cfg), "target": ""})
    assert dr.state == DagRunState.SUCCESS, states
    assert all(s == TaskInstanceState.SUCCESS for s in states.values()), states
    assert xcom(dr, "plan")[-2:] == ["--run-id", tiered_run_id(dr.run_id)]  # no --to: the active key
    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"rewrapped": n, "skipped": n} and totals["failures"] == 0
    assert totals["ledgers"] == 2 * n and totals["failed_jobs"] == []
    report = json.loads((tmp_path / "ws" / "reports" / "tiered_key_rotation" / tiered_run_id(dr.run_id) / "rotate" /
                         "summary.json").read_text())
    assert report["target"] == "k2" and list(report["locations"].values()) == [{"rewrapped": n, "skipped": n}]

    with Workspace(config) as ws:
        st = key_status(ws)
        assert st.needing("k1") == 0 and st.needing("k2") == n and st.unencrypted.objects == n
        retire(ws, "k1")
    with Workspace(config) as ws:
        assert entries(ws) == before
