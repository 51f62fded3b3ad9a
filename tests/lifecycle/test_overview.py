"""The operator's overview (tieredcore.lifecycle.overview), computed at a given clock from a workspace and
run reports: tiers (as `tiered status` counts them), lags, deletion-log records, orphans of the last
reconciliation, requests per run and per month at each job's pace, the cost estimate, last runs and the
tier history."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tests.support.workspaces import END_MS, INTERVAL_MS, build_workspace, offload, sealed
from tieredcore.cli import main as cli
from tieredcore.config import Config
from tieredcore.lifecycle.overview import GIB, MONTH_MS, Prices, build_overview, runs_per_month, tier_snapshot
from tieredcore.meta.deletion_log import DeletionRecord
from tieredcore.workspace import Workspace

HOUR = 3600 * 1000
NOW = END_MS + 3 * HOUR
LAG_TOPIC = "persistent://a/lag/topic-0000"


def write_summary(reports: Path, job: str, run_id: str, **doc) -> None:
    d = reports / job / run_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"job": job, "run_id": run_id, "attempt": 1, **doc}))


def requests(**kinds: int) -> dict[str, int]:
    return {"GET": 0, "PUT": 0, "LIST": 0, "DELETE": 0, **kinds}


@pytest.fixture
def ws_config(tmp_path: Path) -> Config:
    """a/lag: 3 sealed ledgers of 1,000 bytes (closing END-20m, END-10m, END) + an open one, all due
    (threshold 0 s), the oldest offloaded at END (deletion lag 1 h); a/quiet: offload off."""
    cfg = Config.load(build_workspace(tmp_path / "ws", ["a/lag", "a/quiet"]), env={})
    with Workspace(cfg) as ws:
        ps = ws.policies
        ps.set_namespace("a/lag", {"offload_threshold_seconds": 0, "deletion_lag_ms": HOUR})
        ps.set_namespace("a/quiet", {"offload_threshold_bytes": -1, "deletion_lag_ms": HOUR})
        offload(ws, LAG_TOPIC, sealed(ws, LAG_TOPIC)[:1], as_of=END_MS)
        rec = [DeletionRecord(topic="a/lag/persistent/topic-0000", ledger_id=900 + i, type="ledger",
                              reason="retention", created_ms=END_MS) for i in range(3)]
        ws.deletion_log.append(rec)
        ws.deletion_log.dead_letter(ws.deletion_log.pending()[0], "gave up")
    return cfg


def test_overview_at_a_clock(ws_config: Config) -> None:
    reports = Path(ws_config.reports_dir)
    tiers = {"a/lag": {"hot": {"ledgers": 3, "bytes": 2000}, "both": {"ledgers": 1, "bytes": 1000},
                       "cold": {"ledgers": 0, "bytes": 0}}}
    # two sweeps an hour apart (720 runs a month); the lag cleanup once; a reconciliation with orphans
    write_summary(reports, "offload_sweep", "r1", as_of_ms=END_MS - HOUR, written_ms=1, tiers=tiers,
                  requests={"total": requests(PUT=9, LIST=1), "namespaces": {"a/lag": requests(PUT=8)}},
                  totals={"failures": 1, "namespaces": {"a/lag": {}}})
    write_summary(reports, "offload_sweep", "r2", as_of_ms=END_MS, written_ms=2, attempt=2, tiers=tiers,
                  requests={"total": requests(PUT=5, LIST=1, GET=2), "namespaces": {"a/lag": requests(PUT=4, GET=2)}},
                  totals={"failures": 0, "namespaces": {"a/lag": {}}})
    write_summary(reports, "deletion_lag_cleanup", "c1", as_of_ms=END_MS, written_ms=3,
                  requests={"total": requests(GET=10), "namespaces": {"a/lag": requests(GET=10)}}, totals={})
    write_summary(reports, "reconcile_orphans", "o1", as_of_ms=END_MS - 2 * HOUR, written_ms=0, orphan_bytes=500,
                  by_namespace={"a/lag": {"offloaded": {"count": 1, "objects": 2, "bytes": 500},
                                          "ledger": {"count": 1, "objects": 0, "bytes": 999}}},
                  requests={"total": requests(LIST=3), "namespaces": {}}, totals={"failures": 0})
    (reports / "scrub" / "broken").mkdir(parents=True)
    (reports / "scrub" / "broken" / "summary.json").write_text("{not json")  # skipped, not fatal

    prices = Prices.of(ws_config)
    with Workspace(ws_config) as ws:
        ov = build_overview(ws, str(reports), NOW, prices)
    assert [n.namespace for n in ov.namespaces] == ["a/lag", "a/quiet"]
    lag, quiet = ov.namespaces
    assert lag.tiers == tiers["a/lag"] and lag.objects == 2
    # the oldest due ledger not offloaded closed at END - 10 min; the offloaded one is 2 h past its 1 h lag
    assert lag.offload_lag_ms == NOW - (END_MS - INTERVAL_MS)
    assert lag.deletion_lag_ms == NOW - END_MS - HOUR
    assert (lag.deletion_in_flight, lag.deletion_dead_letter) == (2, 1)
    assert lag.orphan_bytes == 500 and quiet.orphan_bytes == 0  # object-store orphans, not the hot one
    # sweeps: mean (8+4)/2 PUT, 1 GET per run, at 720 runs a month; lag cleanup: 10 GET once a month
    assert lag.requests_per_run == {"GET": 11.0, "PUT": 6.0, "LIST": 0.0, "DELETE": 0.0}
    assert lag.requests_per_month == 720 * 7 + 10
    assert lag.request_cost_month == pytest.approx(720 * (6 * 0.005 + 1 * 0.0004) / 1000 + 10 * 0.0004 / 1000)
    assert lag.storage_cost_month == pytest.approx((1000 + 500) / GIB * 0.023)
    assert quiet.offload_lag_ms is None and quiet.deletion_lag_ms is None and quiet.requests_per_month == 0
    assert quiet.tiers["hot"] == {"ledgers": 4, "bytes": 3000}

    assert ov.totals["deletion_in_flight"] == 2 and ov.totals["deletion_dead_letter"] == 1
    assert ov.totals["orphan_bytes"] == 500 and ov.totals["objects"] == 2
    assert ov.totals["requests_per_run"] == {"GET": 11.0, "PUT": 7.0, "LIST": 4.0, "DELETE": 0.0}
    assert ov.totals["tiers"]["hot"] == {"ledgers": 7, "bytes": 5000}
    assert [(r.job, r.run_id, r.attempt) for r in ov.last_runs] == [
        ("deletion_lag_cleanup", "c1", 1), ("offload_sweep", "r2", 2), ("reconcile_orphans", "o1", 1)]
    assert [(h["run_id"], h["hot"], h["both"], h["cold"]) for h in ov.history] == [
        ("r1", 2000, 1000, 0), ("r2", 2000, 1000, 0)]
    json.dumps(ov.as_dict())  # what overview.json serves

    # the same tiers as `tiered status` counts them, and the snapshot a report records
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["--config", str(Path(ws_config.reports_dir).parent / "tiered.toml"), "status",
                         "--by-namespace", "--json"]) == 0
    status = json.loads(out.getvalue())["namespaces"]
    for n in ov.namespaces:
        s = status[n.namespace]
        assert (n.tiers["hot"]["ledgers"], n.tiers["both"]["ledgers"], n.tiers["cold"]["ledgers"]) == (
            s["hot_only"], s["both"], s["offloaded_only"])
        assert n.tiers["hot"]["bytes"] + n.tiers["both"]["bytes"] == s["hot_bytes"]
        assert n.objects == s["objects"]
    with Workspace(ws_config) as ws:
        snap = tier_snapshot(ws)
    assert snap["a/lag"] == {**tiers["a/lag"], "objects": 2}


def test_runs_per_month_from_the_spacing_of_logical_times() -> None:
    from tieredcore.lifecycle.overview import RunInfo

    def run(t: int) -> RunInfo:
        return RunInfo("j", str(t), 1, t, 0, 0, [], {}, {})

    assert runs_per_month([]) == runs_per_month([run(5)]) == 1.0  # one run: counted once a month
    assert runs_per_month([run(0 + 1), run(HOUR + 1), run(2 * HOUR + 1), run(2 * HOUR + 1)]) == MONTH_MS / HOUR
    assert runs_per_month([run(1), run(1 + 10 * 60_000), run(1 + 11 * 60_000)]) == MONTH_MS / (5.5 * 60_000)


def test_no_reports_and_empty_workspace(tmp_path: Path) -> None:
    cfg = Config.load(build_workspace(tmp_path / "ws", ["x/y"], ledgers=1), env={})
    with Workspace(cfg) as ws:
        ov = build_overview(ws, str(tmp_path / "none"), NOW, Prices.of(cfg))
    (ns,) = ov.namespaces
    assert ns.orphan_bytes is None and ov.totals["orphan_bytes"] is None  # no reconciliation ran
    assert ov.last_runs == [] and ov.history == [] and ns.cost_month == 0.0


def test_cold_after_the_lag_cleanup_and_its_deletion_in_flight(tmp_path: Path) -> None:
    """A hot copy marked deleted by the lag cleanup is cold; its pending deletion is in flight."""
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.sweep import plan_lag_cleanup

    cfg = Config.load(build_workspace(tmp_path / "ws", ["a/cold"]), env={})
    topic = "persistent://a/cold/topic-0000"
    with Workspace(cfg) as ws:
        ws.policies.set_namespace("a/cold", {"offload_threshold_seconds": 0, "deletion_lag_ms": HOUR})
        first, second = sealed(ws, topic)[:2]
        offload(ws, topic, [first], as_of=END_MS - 2 * HOUR)
        offload(ws, topic, [second], as_of=NOW - HOUR // 2)  # not past its lag yet
        work = plan_lag_cleanup(ws, ["a/cold"], NOW)
    rows = list(run_work(cfg, [w.as_dict() for w in work]))
    assert [r["outcome"] for r in rows] == ["marked"]
    with Workspace(cfg) as ws:
        (ns,) = build_overview(ws, cfg.reports_dir, NOW, Prices.of(cfg)).namespaces
    assert ns.tiers["cold"] == {"ledgers": 1, "bytes": 1000} and ns.tiers["both"] == {"ledgers": 1, "bytes": 1000}
    assert ns.deletion_lag_ms is None  # the one past its lag is handled; the other is within it
    assert ns.deletion_in_flight == 1 and ns.deletion_dead_letter == 0
    assert ns.offload_lag_ms == NOW - END_MS  # the newest sealed ledger (closed at END) is due, not offloaded


def test_run_info_reads_orphans_and_damage_of_either_report_shape() -> None:
    """Per-namespace orphan objects and bytes and damaged positions, from today's report fields
    (by_namespace kinds; the run's damaged_messages) and from the per-namespace ones when a report has
    them (orphans_by_namespace; a namespace's damage entries, structural damage included); fields of
    another shape are skipped."""
    from tieredcore.lifecycle.overview import run_info

    old = run_info("reconcile_orphans", "o1", {
        "orphan_bytes": 30, "orphan_objects": 3,
        "by_namespace": {"a/b": {"offloaded": {"count": 1, "objects": 2, "bytes": 20},
                                 "upload": {"count": 1, "objects": 1, "bytes": 10},
                                 "ledger": {"count": 1, "objects": 0, "bytes": 999}, "note": 5}, "c/d": 7}})
    assert old.orphan_bytes == {"a/b": 30, "": 30} and old.orphan_objects == {"a/b": 3, "": 3}
    new = run_info("reconcile_orphans", "o2", {
        "orphan_bytes": 30, "orphan_objects": 3, "by_namespace": {"a/b": {"offloaded": {"objects": 9, "bytes": 9}}},
        "orphans_by_namespace": {"a/b": {"groups": 2, "objects": 3, "bytes": 30}}})
    assert new.orphan_bytes == {"a/b": 30, "": 30} and new.orphan_objects == {"a/b": 3, "": 3}

    listed = run_info("scrub", "s1", {"damaged_messages": ["persistent://a/b/t 5:4", "persistent://c/d/u 7:1"],
                                      "totals": {"namespaces": {"a/b": {}, "c/d": {}}}})
    assert listed.damaged == {"a/b": ["persistent://a/b/t 5:4"], "c/d": ["persistent://c/d/u 7:1"]}
    entries = run_info("scrub", "s2", {"damaged_messages": ["persistent://a/b/t 5:4"], "totals": {"namespaces": {
        "a/b": {"damage": [{"topic": "persistent://a/b/t", "ledger": 5, "damaged_messages": [
                    {"position": "5:4", "reason": "CRC32C"}, {"position": "5:6", "reason": "CRC32C"}]},
                {"topic": "persistent://a/b/t", "ledger": 6, "damaged_messages": [], "problem": "index truncated"},
                "junk"]}}}})
    assert entries.damaged == {"a/b": ["persistent://a/b/t 5:4", "persistent://a/b/t 5:6",
                                       "persistent://a/b/t ledger 6: index truncated"]}
