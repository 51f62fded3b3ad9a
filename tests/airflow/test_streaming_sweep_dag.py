"""tiered_offload_sweep over a namespace in streaming mode (PIP-76): the summary task adds up the segment
totals of the jobs' reports (no Spark), and one dag.test() run (real spark-submit, filesystem store)
whose summary shows the segments written and the tails held."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tieredcore.lifecycle.work import KIND_OFFLOAD, LedgerResult, LedgerRunReport, RunSummary
from tieredcore.reports import summary_document

from .conftest import END, SWEEP_AT, asset_events, run_dag, set_policy, tiered, topic_ledgers, verify, xcom

MINUTE_MS = 60 * 1000


def _seg(topic: str, outcome: str, nbytes: int = 0, covers: str = "1:0-9") -> dict:
    ns = "/".join(topic.removeprefix("persistent://").split("/")[:2])
    return asdict(LedgerResult(topic, ns, 1, KIND_OFFLOAD, outcome, nbytes, unit="segment", covers=covers))


def test_summary_adds_up_segment_totals(tmp_path: Path) -> None:
    from tieredcore.reports import RunReports, RunTotals, combine_totals, report_name, segments_text

    streaming = [_seg("persistent://a/s/t0", "offloaded", 4096), _seg("persistent://a/s/t0", "offloaded", 1024),
                 _seg("persistent://a/s/t1", "held", 512)]
    ledger = [asdict(LedgerResult("persistent://a/l/t0", "a/l", 7, KIND_OFFLOAD, "offloaded", 100))]
    reports = RunReports(tmp_path)
    for part, rows in (("offload.0", streaming), ("offload.1", ledger)):
        rep = LedgerRunReport(RunSummary.of("offload_sweep", "r", 0, False, rows, 1.0), rows)
        (tmp_path / "dag" / report_name("r") / part).mkdir(parents=True)
        (tmp_path / "dag" / report_name("r") / part / "summary.json").write_text(
            json.dumps(summary_document(rep, "offload_sweep", "r", 1.0)))
    sweep = RunTotals("offload_sweep")
    for part in ("offload.0", "offload.1"):
        sweep.add(reports.read_summary("dag", "r", part)["totals"], part)
    t = sweep.as_dict()
    assert (t["segments"], t["segment_bytes"], t["segments_held"]) == (2, 5120, 1)
    assert (t["ledgers"], t["bytes"], t["failures"], t["topics"]) == (1, 5220, 0, 3)
    assert t["outcomes"] == {"offloaded": 3, "held": 1}
    assert t["namespaces"]["a/s"]["segments"] == 2 and t["namespaces"]["a/s"]["segments_held"] == 1
    assert "segments" not in t["namespaces"]["a/l"]  # a ledger-mode namespace keeps its shape
    assert segments_text(t) == "; 2 segment(s) (5,120 bytes), 1 tail(s) held for their rollover"
    assert segments_text(t["namespaces"]["a/l"]) == ""
    assert segments_text({"segments": 3, "segment_bytes": 10}) == "; 3 segment(s) (10 bytes)"  # compaction
    ledger_only = RunTotals("offload_sweep")
    ledger_only.add(reports.read_summary("dag", "r", "offload.1")["totals"], "offload.1")
    both = combine_totals([sweep, ledger_only]).as_dict()
    assert both["segments"] == 2 and both["segment_bytes"] == 5120 and both["segments_held"] == 1


@pytest.mark.slow
def test_sweep_dag_streams_a_namespace_and_its_summary_shows_the_segments(tmp_path: Path, spark_env,
                                                                          capfd) -> None:
    """One namespace in streaming mode (small segments and blocks), one in ledger mode: the mapped job of
    each runs on the logical date; the streaming topics' open ledgers are in segments after it (their
    tails are older than the rollover), the summary XCom and log carry the segment totals."""
    from airflow.sdk import DagRunState, TaskInstanceState

    root = tmp_path / "ws"
    assert tiered("init", str(root)) == 0
    for ns, open_entries in (("acme/stream", "40"), ("acme/ledger", "0")):
        assert tiered("--workspace", str(root), "generate", "--namespace", ns, "--topics", "2", "--ledgers", "2",
                      "--entries", "60", "--entry-size", "50-900", "--end-time", END.isoformat(),
                      "--open-entries", open_entries) == 0
    cfg = root / "tiered.toml"
    set_policy(cfg, "acme/stream", offload_mode="streaming", max_segment_size=16 * 1024,
               streaming_block_size=4096, max_segment_rollover_ms=5 * MINUTE_MS)
    set_policy(cfg, "acme/ledger", offload_threshold_bytes=0)

    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    planned = xcom(dr, "plan")
    assert [a[1] for a in planned] == ["acme/ledger", "acme/stream"]

    totals = xcom(dr, "summary")
    assert totals["failures"] == 0 and not totals["failed_jobs"]
    assert totals["segments"] > 2 and totals["segment_bytes"] > 0 and totals["segments_held"] == 0
    assert totals["ledgers"] == 4  # the ledger-mode namespace's sealed ledgers
    assert totals["namespaces"]["acme/stream"]["segments"] == totals["segments"]
    assert totals["outcomes"] == {"offloaded": 4 + totals["segments"]}
    out, err = capfd.readouterr()
    assert f"{totals['segments']} segment(s) ({totals['segment_bytes']:,} bytes)" in out + err
    assert "tail(s) held" not in out + err  # none held: not mentioned

    from tieredcore.offload.context import covered_through, is_offloaded

    for topic, ledgers in topic_ledgers(cfg).items():
        if "/acme/stream/" in topic:
            *sealed, newest = ledgers
            assert all(is_offloaded(li) for li in sealed), topic
            assert covered_through(newest) == 39, topic  # the open ledger's entries, all of them
    verify(cfg)

    # the next scheduled run has nothing new to offload (no entry was written since): no Spark job at all
    dr2, states2 = run_dag("tiered_offload_sweep", SWEEP_AT + dt.timedelta(minutes=15), {"config": str(cfg)})
    assert dr2.state == DagRunState.SUCCESS, states2
    assert states2["offload"] == TaskInstanceState.SKIPPED and xcom(dr2, "plan") == []
    again = xcom(dr2, "summary")
    assert again["segments"] == again["ledgers"] == again["failures"] == again["jobs"] == 0
    assert [e["namespace"] for e in again["nothing_due"]] == ["acme/ledger", "acme/stream"]
    # the first run announced both namespaces (asset events), the second one, which changed nothing, none
    assert sorted(e["namespace"] for _, e in asset_events(dr)) == ["acme/ledger", "acme/stream"]
    assert {e["namespace"]: e["segments"] > 0 for _, e in asset_events(dr)} == {"acme/ledger": False,
                                                                               "acme/stream": True}
    assert asset_events(dr2) == []
