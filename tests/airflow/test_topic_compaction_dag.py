"""The tiered_topic_compaction DAG: topics and a threshold together fail the plan (no Spark job); one
dag.test() run with a real spark-submit of spark_jobs/compact_topics.py over a namespace whose policy sets a
compaction threshold: its keyed topics compacted, the other namespace untouched, the summary's keys and bytes
before → after, the part's report per topic (horizon, compacted ledger, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import SWEEP_AT, make_workspace, run_dag, set_policy, xcom

NS, OFF = "acme/keys", "acme/plain"


def test_topics_with_a_threshold_fail_the_plan(tmp_path: Path) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", [NS], topics=1, ledgers=1, entries=5)
    dr, states = run_dag("tiered_topic_compaction", SWEEP_AT,
                         {"config": str(cfg), "topics": [f"{NS}/topic-0000"], "threshold": "1M"})
    assert dr.state == DagRunState.FAILED
    assert states["plan"] == TaskInstanceState.FAILED and states["compact"] == TaskInstanceState.UPSTREAM_FAILED
    assert not any((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))


@pytest.mark.slow
def test_topic_compaction_dag_compacts_the_namespace_over_its_threshold(tmp_path: Path, spark_env, capfd) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    from tieredcore.config import Config
    from tieredcore.offload.compacted_state import compaction_state
    from tieredcore.workspace import Workspace

    cfg = make_workspace(tmp_path / "ws", [NS, OFF], topics=2, ledgers=2, entries=30)
    set_policy(cfg, NS, topic_compaction_threshold_bytes=1024)

    dr, states = run_dag("tiered_topic_compaction", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states == {"wait_turn": TaskInstanceState.SUCCESS, "preflight": TaskInstanceState.SUCCESS,
                      "plan": TaskInstanceState.SUCCESS, "compact[0]": TaskInstanceState.SUCCESS,
                      "summary": TaskInstanceState.SUCCESS, "verdict": TaskInstanceState.SUCCESS}
    (planned,) = xcom(dr, "plan")
    assert planned[:2] == ["--namespace", NS] and "--namespace" not in planned[2:]
    totals = xcom(dr, "summary")
    assert totals["failures"] == 0 and totals["outcomes"] == {"compacted": 2} and set(totals["namespaces"]) == {NS}
    c = totals["namespaces"][NS]["counters"]
    assert 0 < c["keys_after"] <= c["keys_before"] and 0 < c["bytes_after"] < c["bytes_before"]

    report = (tmp_path / "ws" / "reports" / "tiered_topic_compaction" / tiered_run_id(dr.run_id) / "compact.0"
              / "summary.json")
    part = json.loads(report.read_text())
    with Workspace(Config.load(cfg, env={})) as ws:
        for t in ws.ml.list_topics(NS):
            st = compaction_state(ws.ml.get_topic(t)[0])
            row = part["topics"][t.full]
            assert (row["outcome"], row["new_ledger"], row["uuid"]) == ("compacted", st.ledger_id, st.uuid)
            assert row["horizon"] == str(st.horizon) and row["seconds"] > 0
        assert all(compaction_state(ws.ml.get_topic(t)[0]) is None for t in ws.ml.list_topics(OFF))
    assert sum(r["keys_before"] for r in part["topics"].values()) == c["keys_before"]
    out, err = capfd.readouterr()
    (line,) = [x for x in (out + err).splitlines() if x.startswith(f"  {NS}: ")]  # the summary's
    assert f"keys {c['keys_before']:,} → {c['keys_after']:,}" in line
    assert f"bytes {c['bytes_before']:,} → {c['bytes_after']:,}" in line

    # a manual trigger naming topics: compacted whatever their policy (acme/plain sets no threshold); the one
    # compacted above has nothing to compact (not a failure); the mapped task is labelled by its topics
    import datetime as dt

    from tieredcore.names import TopicName

    named = [f"{OFF}/topic-0001", f"persistent://{NS}/topic-0000"]
    dr, states = run_dag("tiered_topic_compaction", SWEEP_AT + dt.timedelta(hours=1),
                         {"config": str(cfg), "topics": named, "retain_null_key": True, "shards": 1})
    assert dr.state == DagRunState.SUCCESS, states
    (planned,) = xcom(dr, "plan")
    assert planned[:4] == ["--topic", TopicName.parse(named[0]).full, "--topic", named[1]] or \
        planned[:4] == ["--topic", named[1], "--topic", TopicName.parse(named[0]).full]
    assert "--retain-null-key" in planned and "--namespace" not in planned
    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"compacted": 1, "nothing": 1} and totals["failures"] == 0
    with Workspace(Config.load(cfg, env={})) as ws:
        assert compaction_state(ws.ml.get_topic(named[0])[0]) is not None
        assert compaction_state(ws.ml.get_topic(f"{OFF}/topic-0000")[0]) is None
