"""The offload sweep in streaming mode (PIP-76) without Spark: plan_offload on the driver side, run_work
as a Spark task runs it, on workspaces built with `tiered init` / `tiered generate` whose topics' open
ledgers hold entries. Segment settings come from the namespace policy, the clock from the run's
logical time; results are one report row per segment."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from tests.support.workspaces import END_MS, INTERVAL_MS
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.blob import iter_objects
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import OPTION_STREAMING, OPTION_UPTO, plan_offload
from tieredcore.lifecycle.work import (
    DETAIL_SCHEMA,
    KIND_OFFLOAD,
    LedgerResult,
    LedgerRunReport,
    RunSummary,
    TopicWork,
    parse_covers,
)
from tieredcore.meta.leases import TopicLeases
from tieredcore.offload.context import covered_through, is_offloaded, segment_refs
from tieredcore.offload.streaming import WATERMARK_KEY, parse_watermark
from tieredcore.policy import HOT_FIRST
from tieredcore.reports import EXIT_FAILED, EXIT_OK, exit_code

T = "persistent://t/s/topic-0000"
MINUTE = 60_000
# entries of 100 bytes: 12-byte frames of 112 bytes, 8 to a 1 KiB block (128-byte header), which they fill
STREAMING = {"offload_mode": "streaming", "max_segment_size": 8 * 1024, "streaming_block_size": 1024,
             "max_segment_rollover_ms": 5 * MINUTE}


def streaming_ws(make_ws, namespaces=("t/s",), open_entries=30, **kw):
    kw.setdefault("ledgers", 2)
    ws = make_ws(namespaces, entries=50, entry_size="100", open_entries=open_entries, **kw)
    for ns in namespaces:
        ws.policies.set_namespace(ns, STREAMING)
    return ws


def run(ws, plan, config=None):
    return [LedgerResult(**r) for r in run_work(config or ws.config, [w.as_dict() for w in plan])]


def infos(ws, topic=T):
    info, _ = ws.ml.get_topic(topic)
    return info


def objects(ws, store=None):
    return sorted(o.key for o in iter_objects(store or ws.store)
                  if "tiered-owner." not in o.key and "tiered-topic-manifests/" not in o.key)


def read_all(ws, topic=T):
    r = ws.reader(HOT_FIRST)
    try:
        return [(str(p), d) for p, d in r.read(topic)]
    finally:
        r.close()


def test_a_streaming_namespace_is_swept_without_thresholds_and_ledger_mode_is_unchanged(make_ws):
    ws = streaming_ws(make_ws, namespaces=("t/s", "t/l", "t/off"))
    # ledger mode, every sealed ledger
    ws.policies.set_namespace("t/l", {"offload_mode": "ledger", "offload_threshold_bytes": 0})
    ws.policies.set_namespace("t/off", {"offload_mode": "ledger"})  # ledger mode, no threshold: off
    assert ws.policies.namespaces_with_offload() == ["t/l", "t/s"]
    plan = {w.topic: w for w in plan_offload(ws, None, END_MS)}
    assert sorted(plan) == ["persistent://t/l/topic-0000", T]
    lids = [li.ledgerId for li in infos(ws).ledgerInfo]
    assert plan[T].ledgers == lids and plan[T].options == {OPTION_STREAMING: True}  # the open one included
    assert plan["persistent://t/l/topic-0000"].options == {}
    res = run(ws, plan.values())
    by_unit = {(r.unit, r.outcome) for r in res}
    assert by_unit == {("ledger", "offloaded"), ("segment", "offloaded"), ("segment", "held")}
    ledger_rows = [r for r in res if r.unit == "ledger"]
    assert [r.topic for r in ledger_rows] == ["persistent://t/l/topic-0000"] * 2


def test_segments_follow_the_policy_and_the_runs_clock(make_ws, tmp_path):
    ws = streaming_ws(make_ws)
    other = tmp_path / "streamed"  # the namespace's own store: the policy decides where segments go
    ws.policies.set_namespace("t/s", {"store": {"driver": "filesystem", "root": str(other)}})
    before = read_all(ws)
    res = run(ws, plan_offload(ws, ["t/s"], END_MS))
    # 130 entries of 100 bytes in 1 KiB blocks of 8 entries (one ledger per block), cut at 8 KiB
    assert [(r.outcome, r.covers, r.bytes, r.blocks, r.entries) for r in res] == [
        ("offloaded", "0:0-49,1:0-7", 8192, 8, 58),
        ("offloaded", "1:8-49,2:0-15", 8192, 8, 58),
        ("held", "2:16-29", 2048, 0, 0),  # written at END: younger than the 5-minute rollover
    ]
    assert all(r.unit == "segment" and r.kind == KIND_OFFLOAD and r.namespace == "t/s" for r in res)
    assert [r.ledger for r in res] == [0, 1, 2]
    assert all(len(r.uuid) == 36 for r in res[:2]) and res[2].uuid == ""
    info = infos(ws)
    l0, l1, l2 = info.ledgerInfo
    assert is_offloaded(l0) and is_offloaded(l1) and not is_offloaded(l2)
    assert covered_through(l2) == 15
    for li in info.ledgerInfo:
        for ref in segment_refs(li):
            assert ref.complete and ref.assigned_ms == ref.offloaded_ms == END_MS
        for s in li.offloadContext.offloadSegment:
            assert {kv.key: kv.value for kv in s.driverMetadata.properties}["root"] == str(other)
    # the objects are in the policy's store, not the workspace's
    assert objects(ws) == []
    keys = objects(ws, FilesystemBlobStore(other))
    assert sorted(keys) == sorted(k for r in res[:2] for k in (r.uuid, f"{r.uuid}-index"))
    assert read_all(ws) == before

    # the tail's rollover: 5 minutes after the open ledger was created (END), on the logical clock
    assert [r.outcome for r in run(ws, plan_offload(ws, ["t/s"], END_MS + 5 * MINUTE - 1))] == ["held"]
    res = run(ws, plan_offload(ws, ["t/s"], END_MS + 5 * MINUTE))
    assert [(r.outcome, r.covers) for r in res] == [("offloaded", "2:16-29")]
    info = infos(ws)
    assert covered_through(info.ledgerInfo[2]) == 29
    assert parse_watermark(info)[1] == END_MS + 5 * MINUTE  # everything through 2:29 was offloaded then
    assert {kv.key for kv in info.properties} >= {WATERMARK_KEY}
    assert plan_offload(ws, ["t/s"], END_MS + 5 * MINUTE) == []
    assert read_all(ws) == before


def test_rerunning_a_sweep_for_the_same_logical_time_offloads_nothing_new(make_ws):
    ws = streaming_ws(make_ws, topics=2)
    at = END_MS + 10 * MINUTE  # past the tail's rollover: everything goes
    plan = plan_offload(ws, None, at)
    first = run(ws, plan)
    assert {r.outcome for r in first} == {"offloaded"} and len(first) == 6
    keys = objects(ws)
    records = {w.topic: ws.ml.get_topic(w.topic) for w in plan}
    assert plan_offload(ws, None, at) == []  # the next run of the same logical time plans nothing

    again = run(ws, plan)  # an Airflow retry of the same task (its plan made before the first run)
    assert again == []
    assert objects(ws) == keys
    assert {w.topic: ws.ml.get_topic(w.topic) for w in plan} == records  # not even a version bump

    # with the tail held, a rerun reports the same held tail and writes nothing either
    ws2 = streaming_ws(make_ws)
    plan = plan_offload(ws2, None, END_MS)
    first = run(ws2, plan)
    keys, record = objects(ws2), ws2.ml.get_topic(T)
    for _ in range(2):
        again = run(ws2, plan_offload(ws2, None, END_MS))
        assert [(r.outcome, r.covers, r.bytes) for r in again] == [(r.outcome, r.covers, r.bytes) for r in first
                                                                   if r.outcome == "held"]
    assert objects(ws2) == keys and ws2.ml.get_topic(T) == record


def test_dry_run_plans_segments_and_changes_nothing(make_ws):
    ws = streaming_ws(make_ws)
    before = ws.ml.get_topic(T)
    plan = plan_offload(ws, None, END_MS, dry_run=True)
    res = run(ws, plan)
    assert [(r.outcome, r.covers, r.bytes) for r in res] == [
        ("planned", "0:0-49,1:0-7", 8192), ("planned", "1:8-49,2:0-15", 8192), ("held", "2:16-29", 2048)]
    assert not any(r.failed for r in res)
    assert ws.ml.get_topic(T) == before and objects(ws) == []


def test_run_report_rows_and_totals_for_segments(make_ws):
    ws = streaming_ws(make_ws, topics=2)
    rows = list(run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)]))
    summary = RunSummary.of("offload_sweep", "r", END_MS, False, rows, 1.0)
    report = LedgerRunReport(summary, rows)
    t = report.totals()
    done = [r for r in rows if r["outcome"] == "offloaded"]
    assert (t["segments"], t["segments_held"], t["segment_bytes"]) == (4, 2, sum(r["bytes"] for r in done))
    assert t["ledgers"] == 0 and t["topics"] == 2 and t["failures"] == 0 and t["bytes"] == t["segment_bytes"]
    assert t["outcomes"] == {"offloaded": 4, "held": 2}
    assert t["namespaces"]["t/s"] == {"ledgers": 0, "bytes": t["segment_bytes"], "failures": 0,
                                      "outcomes": {"offloaded": 4, "held": 2}, "segments": 4,
                                      "segment_bytes": t["segment_bytes"], "segments_held": 2}
    assert exit_code(t) == EXIT_OK and report.messages() == []
    detail, schema = report.detail()
    assert schema == DETAIL_SCHEMA and all(len(d) == len(schema.split(",")) for d in detail)
    unit = [c.split()[0] for c in schema.split(",")].index("unit")
    assert {d[unit] for d in detail} == {"segment"}
    assert parse_covers(rows[0]["covers"]) == [(0, 0, 49), (1, 0, 7)]

    # a failed, a conflicting and an unknown segment fail the run; held and busy do not
    def seg(outcome: str) -> dict:
        return asdict(LedgerResult(T, "t/s", 2, KIND_OFFLOAD, outcome, error="why", uuid="u", unit="segment",
                                   covers="2:16-29"))

    for outcome, code in (("failed", EXIT_FAILED), ("conflict", EXIT_FAILED), ("unknown", EXIT_FAILED),
                          ("aborted", EXIT_FAILED), ("held", EXIT_OK), ("busy", EXIT_OK)):
        rep = LedgerRunReport(RunSummary.of("offload_sweep", "r", END_MS, False, rows + [seg(outcome)], 1.0),
                              rows + [seg(outcome)])
        assert exit_code(rep.totals()) == code, outcome
        if code == EXIT_FAILED:
            assert rep.messages()[0] == f"FAILED {T} segment u [2:16-29]: {outcome}: why"
    # a ledger-mode conflict stays what it was (the ledger was offloaded by someone else)
    led = asdict(LedgerResult(T, "t/s", 2, KIND_OFFLOAD, "conflict"))
    assert RunSummary.of("offload_sweep", "r", END_MS, False, [led], 1.0).failures == 0


def test_a_leased_topic_is_busy_and_not_failed(make_ws):
    ws = streaming_ws(make_ws, topics=2)
    other = TopicLeases(ws.metadata, holder="other-sweep:1")
    held = other.acquire(T, "offload")
    res = run(ws, plan_offload(ws, None, END_MS + 10 * MINUTE))
    busy = [r for r in res if r.topic == T]
    assert [(r.outcome, r.unit) for r in busy] == [("busy", "segment")] and "other-sweep:1" in busy[0].error
    assert {r.outcome for r in res if r.topic != T} == {"offloaded"}
    assert not any(li.HasField("offloadContext") for li in infos(ws).ledgerInfo)
    assert RunSummary.of("s", "r", END_MS, False, [asdict(r) for r in res], 0).failures == 0
    other.release(held)
    assert {r.outcome for r in run(ws, plan_offload(ws, None, END_MS + 10 * MINUTE))} == {"offloaded"}


def test_a_failing_store_fails_its_segments_and_the_other_topics_still_run(make_ws, tmp_path):
    ws = streaming_ws(make_ws, namespaces=("t/s", "t/bad"))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where t/bad's store root should be")
    ws.policies.set_namespace("t/bad", {"store": {"driver": "filesystem", "root": str(blocker / "cold")}})
    res = run(ws, plan_offload(ws, None, END_MS + 10 * MINUTE))
    bad = [r for r in res if r.namespace == "t/bad"]
    # its store cannot be opened: one failed row for the topic (no segment was planned or started)
    assert [(r.outcome, r.unit, r.covers) for r in bad] == [("failed", "segment", "")] and bad[0].failed
    assert "BlobStoreError" in bad[0].error and "cannot create store directories" in bad[0].error
    assert {r.outcome for r in res if r.namespace == "t/s"} == {"offloaded"}
    summary = RunSummary.of("offload_sweep", "r", END_MS, False, [asdict(r) for r in res], 0)
    assert summary.failures == 1 and exit_code(summary.totals()) == EXIT_FAILED
    info = infos(ws, "persistent://t/bad/topic-0000")
    assert not any(segment_refs(li) for li in info.ledgerInfo)
    blocker.unlink()
    res = run(ws, plan_offload(ws, ["t/bad"], END_MS + 10 * MINUTE))
    assert {r.outcome for r in res} == {"offloaded"}
    assert all(ref.complete for li in infos(ws, "persistent://t/bad/topic-0000").ledgerInfo
               for ref in segment_refs(li))


def test_a_backfill_offloads_nothing_past_the_ledger_open_at_its_time(make_ws):
    ws = streaming_ws(make_ws, ledgers=3, open_entries=20)
    lids = [li.ledgerId for li in infos(ws).ledgerInfo]
    # one interval before END, ledger 2 (sealed at END) was the open ledger; ledger 3 did not exist
    older = END_MS - INTERVAL_MS
    (w,) = plan_offload(ws, None, older)
    assert w.ledgers == lids[:3] and w.options[OPTION_UPTO] == [lids[2], 2**63 - 1]
    res = run(ws, [w])
    covered = [c for r in res for c in parse_covers(r.covers)]
    assert max(lid for lid, _, _ in covered) == lids[2]
    info = infos(ws)
    assert not segment_refs(info.ledgerInfo[3])
    assert parse_watermark(info) is None  # a bounded run claims nothing about later entries
    # the current date does the rest
    res = run(ws, plan_offload(ws, None, END_MS + 10 * MINUTE))
    assert {r.outcome for r in res} == {"offloaded"}
    assert covered_through(infos(ws).ledgerInfo[3]) == 19


def test_switching_back_to_ledger_mode_does_not_offload_streamed_ledgers_again(make_ws):
    ws = streaming_ws(make_ws, ledgers=3)
    run(ws, plan_offload(ws, None, END_MS + 10 * MINUTE))
    lids = [li.ledgerId for li in infos(ws).ledgerInfo]
    ws.policies.set_namespace("t/s", {"offload_mode": "ledger", "offload_threshold_bytes": 0})
    assert plan_offload(ws, None, END_MS + 10 * MINUTE) == []  # the sealed ones are all in segments
    # ... and a streaming unit planned before the switch still runs as planned (nothing left to do)
    w = TopicWork(T, KIND_OFFLOAD, lids, END_MS + 10 * MINUTE, options={OPTION_STREAMING: True})
    assert run(ws, [w]) == []


@pytest.mark.parametrize("limit", [2])
def test_store_failure_budget_stops_streaming_too(make_ws, aws_env, limit):
    from tests.lifecycle.test_run_faults import ResettingServer

    ws = streaming_ws(make_ws, topics=5)
    srv = ResettingServer()
    try:
        ws.policies.set_namespace("t/s", {
            "streaming_block_size": 5 * 1024 * 1024, "max_segment_size": 16 * 1024 * 1024,
            "store": {"driver": "aws-s3", "bucket": "bucket-x", "prefix": "p",
                      "endpoint": f"http://127.0.0.1:{srv.port}", "region": "us-east-1"}})
        from dataclasses import replace

        res = run(ws, plan_offload(ws, None, END_MS + 10 * MINUTE), replace(ws.config, store_failure_limit=limit))
    finally:
        srv.close()
    outcomes = [r.outcome for r in res]
    assert outcomes[:limit] == ["failed"] * limit and set(outcomes[limit:]) == {"aborted"} and len(res) == 5
    assert all("failed 2 times in a row" in r.error for r in res[limit:])
    assert all(r.unit == "segment" and r.covers for r in res)
    assert RunSummary.of("s", "r", END_MS, False, [asdict(r) for r in res], 0).failures == 5
