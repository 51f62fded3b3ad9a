"""The tiered_compaction DAG: its params, the summary's before → after counters, and one dag.test() run
with a real spark-submit of spark_jobs/compact_segments.py that repacks a namespace of small objects."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from .conftest import (
    SWEEP_AT,
    get_dag,
    make_workspace,
    run_dag,
    set_policy,
    tiered,
    topic_ledgers,
    verify,
    xcom,
)


def test_threshold_params_take_sizes_and_durations() -> None:
    """The trigger form accepts what the job's parsers accept (`plan` parses the values again)."""
    from airflow.sdk.exceptions import ParamValidationError

    params = get_dag("tiered_compaction").params
    for name, good, bad in (
        ("min_object_size", (None, "", "8M", "512k", " 1G ", "1048576"), ("8 MB", "8MiB", "-1", "1.5M", 8)),
        ("target_size", (None, "256M", "4096"), ("big", "256T", True)),
        ("delete_delay", (None, "", "1h", "90m", "3600s", "500ms", "60000"), ("1 h", "-1", "1y", 3600)),
    ):
        param = params.get_param(name)
        assert param.schema["title"] and "policy" in param.description
        for v in good:
            assert param.resolve(v) == v, (name, v)
        for v in bad:
            with pytest.raises(ParamValidationError):
                param.resolve(v)


def test_bad_thresholds_fail_the_plan_naming_the_param(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the trigger form lets through but the thresholds' parser (the CLI's and the job's) refuses
    fails `plan`, naming the param; no Spark job starts."""
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=1, entries=5)
    alerts = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("TIERED_ON_FAILURE_CALLBACK", "tests.support.alerts:record")
    monkeypatch.setenv("TIERED_TEST_ALERTS", str(alerts))
    cases = (({"min_object_size": "64M", "target_size": "8M"}, "min_object_size param 64M exceeds target_size param 8M"),
             ({"target_size": "0"}, "target_size param '0': must be a positive size"))
    for params, _ in cases:
        dr, states = run_dag("tiered_compaction", SWEEP_AT, {"config": str(cfg), **params})
        assert dr.state == DagRunState.FAILED
        assert states["plan"] == TaskInstanceState.FAILED
        assert states["compact"] == TaskInstanceState.UPSTREAM_FAILED
    failed = [json.loads(line) for line in alerts.read_text().splitlines()]
    plan_failures = [f["exception"] for f in failed if f["task_id"] == "plan"]
    for _, fragment in cases:
        assert any(fragment in e for e in plan_failures), plan_failures
    assert not any((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))  # no part wrote a report


def test_summary_shows_counters_per_namespace_as_before_and_after(tmp_path: Path) -> None:
    """The summary (tieredcore.reports.run_record) adds up each namespace's counters (a compaction report's
    objects and bytes before → after); counters_text shows *_before / *_after pairs as before → after."""
    from tieredcore.reports import RunReports, counters_text, planned_parts, report_name, run_record

    for i, ns, c in ((0, "a/x", (24, 4, 30_000, 26_000)), (1, "a/y", (10, 2, 5_000, 4_000))):
        counters = dict(zip(("objects_before", "objects_after", "bytes_before", "bytes_after"), c, strict=True))
        d = tmp_path / "tiered_compaction" / report_name("r") / f"compact.{i}"
        d.mkdir(parents=True)
        totals = {"topics": 1, "ledgers": c[0] // 2, "bytes": c[3], "failures": 0, "outcomes": {"compacted": 1},
                  "counters": counters, "namespaces": {ns: {"ledgers": c[0] // 2, "bytes": c[3], "failures": 0,
                                                            "outcomes": {"compacted": 1}, "counters": counters}}}
        (d / "summary.json").write_text(json.dumps({"totals": totals}))
    planned = planned_parts("compact", "compact_segments", [["--namespace", "a/x"], ["--namespace", "a/y"]])
    t = run_record(RunReports(tmp_path), "tiered_compaction", "r", {"compact_segments": planned})["totals"]
    assert t["counters"] == {"objects_before": 34, "objects_after": 6, "bytes_before": 35_000, "bytes_after": 30_000}
    assert t["namespaces"]["a/y"]["counters"] == {"objects_before": 10, "objects_after": 2, "bytes_before": 5_000,
                                                  "bytes_after": 4_000}
    assert counters_text(t["namespaces"]["a/x"]["counters"]) == "; objects 24 → 4, bytes 30,000 → 26,000"
    assert counters_text({"deleted_hot": 2, "acknowledged": 2}) == "; deleted_hot=2, acknowledged=2"
    assert counters_text({}) == counters_text(None) == ""


@pytest.mark.slow
def test_compaction_dag_repacks_a_namespace_and_its_summary_shows_before_and_after(
        tmp_path: Path, spark_env, capfd) -> None:
    """acme/small (compaction on) and acme/other (off), both with every sealed ledger offloaded as its own
    object pair: the plan maps one job to acme/small, which repacks each topic's objects into one
    segment; acme/other is untouched; every copy verifies; the summary XCom and log show the objects and
    bytes before → after."""
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    from tieredcore.config import Config
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.sweep import plan_offload
    from tieredcore.offload.context import is_complete, segment_pieces
    from tieredcore.workspace import Workspace

    cfg = make_workspace(tmp_path / "ws", ["acme/small", "acme/other"], topics=2, ledgers=6, entries=20)
    for ns in ("acme/small", "acme/other"):
        set_policy(cfg, ns, offload_threshold_bytes=0)
    config = Config.load(cfg, env={})
    with Workspace(config) as ws:
        rows = list(run_work(config, [w.as_dict() for w in plan_offload(ws, None, int(SWEEP_AT.timestamp() * 1000))]))
    assert {r["outcome"] for r in rows} == {"offloaded"} and len(rows) == 2 * 2 * 6
    set_policy(cfg, "acme/small", compaction_enabled=True)
    before = topic_ledgers(cfg)

    dr, states = run_dag("tiered_compaction", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states == {"preflight": TaskInstanceState.SUCCESS, "plan": TaskInstanceState.SUCCESS,
                      "compact[0]": TaskInstanceState.SUCCESS, "summary": TaskInstanceState.SUCCESS,
                      "verdict": TaskInstanceState.SUCCESS}
    (planned,) = xcom(dr, "plan")
    assert planned[:2] == ["--namespace", "acme/small"] and "--dry-run" not in planned

    totals = xcom(dr, "summary")
    assert totals["failures"] == 0 and not totals["failed_jobs"] and totals["outcomes"] == {"compacted": 2}
    small = totals["namespaces"]["acme/small"]
    assert set(totals["namespaces"]) == {"acme/small"} and small["ledgers"] == 12
    c = small["counters"]
    assert (c["objects_before"], c["objects_after"]) == (24, 4)  # 12 object pairs -> 1 segment per topic
    assert 0 < c["bytes_after"] < c["bytes_before"] and totals["counters"] == c
    out, err = capfd.readouterr()
    (line,) = [x for x in (out + err).splitlines() if x.startswith("  acme/small: ")]  # the summary's
    assert f"12 ledger(s), {small['bytes']:,} bytes, 0 failure(s); {{'compacted': 2}}; " in line
    assert "objects 24 → 4" in line and f"bytes {c['bytes_before']:,} → {c['bytes_after']:,}" in line
    report = tmp_path / "ws" / "reports" / "tiered_compaction" / tiered_run_id(dr.run_id) / "compact.0" / "summary.json"
    assert json.loads(report.read_text())["namespaces"]["acme/small"]["objects_after"] == 4

    after = topic_ledgers(cfg)
    for topic, ledgers in after.items():
        for li in ledgers[:-1]:
            if "/acme/small/" in topic:  # one segment holds them all
                assert not is_complete(li) and len(segment_pieces(li)) == 1, (topic, li.ledgerId)
                assert segment_pieces(li)[0].uuid == segment_pieces(ledgers[0])[0].uuid
            else:
                assert li == next(b for b in before[topic] if b.ledgerId == li.ledgerId)
    # every entry of every topic reads right (tiered first), and every object-store copy alone holds them
    res = verify(cfg)
    assert (res["verified"], res["failed"], res["fallbacks"]) == (4, 0, 0)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert tiered("--config", str(cfg), "verify", "--offloaded-only", "--json") == 0
    res = json.loads(buf.getvalue())
    assert res["verified"] == 4 and sum(r["offloaded_ledgers"] for r in res["topics"]) == 24
