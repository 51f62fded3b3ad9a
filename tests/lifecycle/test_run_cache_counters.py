"""The chunk cache counters in run reports: a partition of a job over TopicWork units (run_work with
``with_cache``) ends with its cache's counters when it read transformed objects; the job adds the
partitions' counters up into its RunSummary (summary.json, the log's summary line). A Spark run of the
scrub job over a compressed namespace reports them (slow)."""

from __future__ import annotations

import json

import pytest

from tests.support.workspaces import END_ISO, END_MS
from tieredcore.lifecycle.runner import CACHE_RECORD, run_work, split_cache_records
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult, RunSummary

COUNTERS = {"hits", "misses", "evictions", "expirations", "loads", "load_failures", "prefetched", "waits"}


def _offloaded(make_ws, transform: str):
    ws = make_ws(["t/a"], topics=2, ledgers=3, entries=80, entry_size="500-3000")
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "transform": transform,
                                           "transform_chunk_size": 4096})
    rows = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])]
    assert len(rows) == 6 and {r.outcome for r in rows} == {"offloaded"}
    return ws, [u.as_dict() for u in plan_scrub(ws, None, END_MS, deep=True)]


def test_partitions_report_their_cache_counters_and_the_run_adds_them_up(make_ws):
    ws, units = _offloaded(make_ws, "zstd")
    assert len(units) == 2
    first = list(run_work(ws.config, units[:1], with_cache=True))
    second = list(run_work(ws.config, units[1:], with_cache=True))
    for part in (first, second):  # the last record of each partition, and only that one
        assert CACHE_RECORD in part[-1] and not any(CACHE_RECORD in r for r in part[:-1])
        assert set(part[-1][CACHE_RECORD]) == COUNTERS and part[-1][CACHE_RECORD]["loads"] > 0
    rows, cache = split_cache_records(first + second)
    assert len(rows) == 6 and {LedgerResult(**r).outcome for r in rows} == {"ok"}  # deep scrub read every byte
    assert cache == {k: first[-1][CACHE_RECORD][k] + second[-1][CACHE_RECORD][k] for k in COUNTERS}
    assert cache["misses"] > 0 and cache["load_failures"] == 0
    s = RunSummary.of("scrub", "r", END_MS, False, rows, 1.0)
    s.cache = cache
    assert s.as_dict()["cache"] == cache and s.totals()["ledgers"] == 6
    # callers that do not ask get rows only
    assert not any(CACHE_RECORD in r for r in run_work(ws.config, units))


def test_untransformed_data_opens_no_cache_and_reports_none(make_ws):
    ws, units = _offloaded(make_ws, "none")
    records = list(run_work(ws.config, units, with_cache=True))
    assert len(records) == 6 and not any(CACHE_RECORD in r for r in records)
    assert split_cache_records(records)[1] == {}
    assert RunSummary("scrub", "r", 0, False).as_dict()["cache"] == {}


@pytest.mark.slow
def test_scrub_job_reports_the_cache_counters(tmp_path):
    from spark_jobs._jobkit import SUMMARY_PREFIX
    from tests.spark.conftest import spark_submit
    from tests.support.workspaces import build_workspace
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    cfg = build_workspace(tmp_path / "ws", ["t/a"], topics=2, ledgers=2, entries=50, entry_size="1K-4K")
    with Workspace(Config.load(cfg, env={})) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "transform": "zstd",
                                               "transform_chunk_size": 8192})
        assert {r["outcome"] for r in run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])} \
            == {"offloaded"}
    rc, log = spark_submit("scrub", "--config", str(cfg), "--as-of", END_ISO, "--deep", "always", "--run-id", "c1",
                           log=tmp_path / "scrub.log")
    assert rc == 0, log[-3000:]
    summary = json.loads((tmp_path / "ws" / "reports" / "scrub" / "c1" / "scrub" / "summary.json").read_text())
    assert summary["outcomes"] == {"ok": 4}
    assert set(summary["cache"]) == COUNTERS and summary["cache"]["loads"] > 0 and summary["cache"]["misses"] > 0
    (line,) = [ln for ln in log.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    assert json.loads(line[len(SUMMARY_PREFIX):])["cache"] == summary["cache"]
