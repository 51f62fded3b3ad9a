"""The deletion drain and orphan reconciliation Spark jobs: bad input in-process (no Spark), then two real
spark-submit runs (slow): reconcile_orphans on seeded orphans (same result as reconcile()), then
deletion_drain deleting them."""

from __future__ import annotations

import json
import os
import time
import uuid as uuidlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs import _jobkit, deletion_drain, reconcile_orphans
from spark_jobs._jobkit import SUMMARY_PREFIX
from tests.support.workspaces import END_ISO, build_workspace, sealed
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.meta.deletion_log import DeletionLog, DeletionRecord, Entry
from tieredcore.workspace import Workspace

from .conftest import spark_submit

GRACE = 3600 * 1000
A = "t/a/persistent/topic-0000"
B = "t/a/persistent/topic-0001"  # deleted after its offload: its objects and hot ledgers leak


@pytest.fixture
def no_spark(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a Spark session was requested for bad input")

    monkeypatch.setattr(_jobkit, "session", boom)  # the job template (spark_jobs/_jobkit.run_job)
    monkeypatch.setattr(_jobkit, "exit_with_parent", lambda: None)  # not for the pytest process


@pytest.fixture
def small_config(tmp_path) -> str:
    return str(build_workspace(tmp_path / "ws", ["t/a"], ledgers=2))


@pytest.mark.parametrize(
    "job,args,message",
    [
        (deletion_drain, ["--as-of", "garbage"], "--as-of 'garbage'"),
        (deletion_drain, ["--as-of", END_ISO, "--max-attempts", "0"], "--max-attempts must be >= 1"),
        (deletion_drain, ["--as-of", END_ISO, "--retry-delay-ms", "-1"], "--retry-delay-ms must be >= 0"),
        (deletion_drain, ["--as-of", END_ISO, "--limit", "-3"], "--limit must be >= 0"),
        (reconcile_orphans, ["--as-of", "yesterday"], "--as-of 'yesterday'"),
        (reconcile_orphans, ["--as-of", END_ISO, "--grace", "soon"], "duration 'soon'"),
        (reconcile_orphans, ["--as-of", END_ISO, "--grace", "-1"], "--grace '-1': must not be negative"),
        (reconcile_orphans, ["--as-of", END_ISO, "--namespace", "t/a"], "--namespace is not supported"),
    ],
)
def test_bad_input_exits_2_without_spark(no_spark, small_config, capsys, job, args, message):
    assert job.main(["--config", small_config, *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_config_exits_2_without_spark(no_spark, tmp_path, capsys):
    missing = str(tmp_path / "nope.toml")
    for job in (deletion_drain, reconcile_orphans):
        assert job.main(["--config", missing, "--as-of", END_ISO]) == 2
        assert "does not exist" in capsys.readouterr().err


def test_drain_units_group_by_store_and_entries_pickle():
    import pickle

    def entry(i, typ, driver=None):
        rec = DeletionRecord(topic=A, ledger_id=i, type=typ, reason="retention", created_ms=i,
                             uuid=str(uuidlib.uuid4()) if typ != "ledger" else "", driver=driver or {})
        return Entry(f"e{i}", 1, rec)

    s1 = {"name": "filesystem", "properties": {"root": "/a"}}
    s2 = {"name": "filesystem", "properties": {"root": "/b"}}
    es = [entry(1, "offloaded", s1), entry(2, "ledger"), entry(3, "offloaded", s2), entry(4, "offloaded", s1),
          Entry("bad", 1, None, "malformed", b"{")]
    units = deletion_drain.plan_units(es, chunk=1000)
    assert sorted(len(u) for _, u in units) == [1, 1, 1, 2]
    [(_, both)] = [u for u in units if len(u[1]) == 2]
    assert [e.id for e in both] == ["e1", "e4"]
    assert len(deletion_drain.plan_units(es, chunk=1)) == 5
    assert pickle.loads(pickle.dumps(es)) == es


# -- real spark-submit ------------------------------------------------------------------------------


def age_all(root: Path, ms: int) -> None:
    for d, _dirs, files in os.walk(root):
        for f in files:
            os.utime(Path(d) / f, ns=(ms * 1_000_000, ms * 1_000_000))


def summary_of(log: str) -> dict:
    [line] = [ln for ln in log.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    return json.loads(line[len(SUMMARY_PREFIX):])


def comparable(rep: dict) -> dict:
    out = {k: v for k, v in rep.items() if k not in ("timings", "dry_run", "records_appended", "records",
                                                      "job", "run_id", "seconds", "totals",
                                                      # what the job template adds to every report
                                                      "attempt", "written_ms", "requests", "tiers", "spark",
                                                      # and where it is (tieredcore.reports.ReportPlace.fields)
                                                      "group", "run_key", "part", "dag_id", "dag_run_id", "task_id",
                                                      "map_index", "try_number", "planned_namespaces")}
    out["records"] = [{k: v for k, v in r.items() if k != "id"} for r in rep["records"]]
    return out


@pytest.mark.slow
def test_reconcile_then_drain_with_spark(tmp_path):
    cfg = build_workspace(tmp_path / "ws", ["t/a"], topics=2, ledgers=3, entries=8)
    config = Config.load(str(cfg))
    reports = tmp_path / "reports"
    with Workspace(config) as ws:
        for t in (A, B):
            res = ws.topic_offloader().offload_ledgers(t, sealed(ws, t))
            assert all(r.outcome == "offloaded" for r in res), res
        as_of = max(int(time.time() * 1000), 1_767_225_600_000) + 3 * GRACE
        # an abandoned attempt nothing references, and a deleted topic (objects + hot ledgers leak)
        a0 = sealed(ws, A)[0]
        ws.offloader.offload(ws.hot.open_ledger(a0), str(uuidlib.uuid4()), {"managedledgername": A})
        info_b, _ = ws.ml.get_topic(B)
        b_ledgers = [li.ledgerId for li in info_b.ledgerInfo]
        b_offloaded = sum(1 for li in info_b.ledgerInfo if li.HasField("offloadContext"))
        ws.ml.delete_topic(B)
        ws.store.put("notes/readme.txt", b"foreign")
        cold = Path(ws.store.root)
        age_all(cold, as_of - 2 * GRACE)
        expected = reconcile(ws, as_of, GRACE, dry_run=True).as_dict()
        entries_a = sum(li.entries for li in ws.ml.get_topic(A)[0].ledgerInfo)
        keys_before = {o.key for o in iter_objects(ws.store)}
    assert b_offloaded == 3 and expected["orphan_groups"] == 1 + b_offloaded and expected["hot_orphans"] == len(b_ledgers)
    assert expected["foreign_keys"] == 1 and expected["referenced_objects"] > 0

    # (a) reconciliation: the same result as reconcile(), records appended
    rc, log = spark_submit("reconcile_orphans", "--config", str(cfg), "--as-of", str(as_of), "--grace", "1h",
                           "--run-id", "r1", "--report-dir", str(reports), log=tmp_path / "reconcile.log")
    assert rc == 0, log
    summary = json.loads((reports / "reconcile_orphans" / "r1" / "reconcile_orphans" / "summary.json").read_text())
    assert comparable(summary) == comparable(expected)
    assert summary["records_appended"] == len(expected["records"])
    assert summary["totals"]["ledgers"] == len(expected["records"]) and summary["totals"]["failures"] == 0
    assert summary_of(log)["orphan_groups"] == 4
    # the listing tasks' requests reach the report through the run's accumulator
    assert summary["requests"]["total"]["LIST"] >= 1 and summary["attempt"] == 1
    detail = pq.read_table(reports / "reconcile_orphans" / "r1" / "reconcile_orphans" / "detail.parquet").to_pylist()
    assert len(detail) == expected["orphan_objects"] + expected["hot_orphans"]
    with Workspace(config) as ws:
        pending = [e.record for e in DeletionLog(ws.metadata).pending()]
        assert sorted(comparable({"records": [r.__dict__ for r in pending]})["records"], key=repr) == \
            sorted(comparable(expected)["records"], key=repr)

    # (b) the drain deletes them; retained data still reads back
    rc, log = spark_submit("deletion_drain", "--config", str(cfg), "--as-of", str(as_of), "--run-id", "d1",
                           "--report-dir", str(reports), log=tmp_path / "drain.log")
    assert rc == 0, log
    s = summary_of(log)
    n = len(expected["records"])
    assert s["entries"] == n and s["deleted"] == n and s["acknowledged"] == n
    assert s["requests"]["total"]["DELETE"] >= 1  # the drain tasks' deletes
    assert s["deleted_hot"] == len(b_ledgers) and s["deleted_offloaded"] == 4 and s["dead_lettered"] == 0
    assert s["tasks"] == 2  # one store + the hot tier
    assert s["totals"]["ledgers"] == n and s["totals"]["counters"]["deleted_offloaded"] == 4
    rows = pq.read_table(reports / "deletion_drain" / "d1" / "deletion_drain" / "detail.parquet").to_pylist()
    assert {r["outcome"] for r in rows} == {"deleted"} and len(rows) == n
    orphan_keys = {d["key"] for d in detail if d["kind"] == "offloaded"}
    assert len(orphan_keys) == expected["orphan_objects"] == 8
    with Workspace(config) as ws:
        assert DeletionLog(ws.metadata).pending() == []
        left = {o.key for o in iter_objects(ws.store)}
        assert left == keys_before - orphan_keys and not orphan_keys & left
        assert not any(ws.hot.exists(lid) for lid in b_ledgers)
        r = ws.reader()
        try:
            assert sum(1 for _ in r.read(A)) == entries_a
        finally:
            r.close()
        after = reconcile(ws, as_of, GRACE, dry_run=True)
        assert after.orphan_groups == 0 and after.hot_orphans == 0
