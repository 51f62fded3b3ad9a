"""Run reports: report names, the totals every job's report gives, the exit-code rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tieredcore.errors import FormatError, NotFoundError, ValidationError
from tieredcore.lifecycle.drain import DrainReport, DrainRow
from tieredcore.lifecycle.reconcile.report import KIND_LEDGER, KIND_OFFLOADED, KIND_UPLOAD, ReconcileReport
from tieredcore.lifecycle.work import LedgerRunReport, RunSummary
from tieredcore.reports import (
    EXIT_DATA_LOSS,
    EXIT_FAILED,
    EXIT_OK,
    exit_code,
    report_name,
    summary_document,
    totals,
)


@pytest.mark.parametrize(
    "run_id,namespace,expected",
    [
        ("scheduled__2026-01-01T00:00:00+00:00", None, "scheduled__2026-01-01T00_00_00+00_00"),
        ("manual run/1", None, "manual_run_1"),
        ("../../etc/passwd", None, ".._.._etc_passwd"),
        ("..", None, "__"),
        (".", None, "_"),
        ("", None, "_"),
        ("r", "acme/orders", "r.acme+orders"),
    ],
)
def test_report_name(run_id, namespace, expected):
    assert report_name(run_id, namespace) == expected


@given(st.text(max_size=40), st.one_of(st.none(), st.from_regex(r"[a-z]{1,5}/[a-z]{1,5}", fullmatch=True)))
def test_report_name_is_one_safe_path_component_and_idempotent(run_id, namespace):
    name = report_name(run_id, namespace)
    assert name not in ("", ".", "..") and "/" not in name and "\0" not in name
    assert report_name(name) == name


def test_exit_code_rule():
    assert exit_code(totals()) == EXIT_OK
    assert exit_code(totals(failures=2)) == EXIT_FAILED
    assert exit_code(totals(failures=1, data_loss=["t ledger 1"])) == EXIT_DATA_LOSS


def _drain(dry_run: bool) -> DrainReport:
    return DrainReport(7, dry_run, entries=4, deleted=1, retrying=1, dead_lettered=1, malformed=1, deleted_hot=1,
                       acknowledged=1, rows=[
                           DrainRow("1", "persistent://a/b/t", 1, "ledger", "retention", "deleted"),
                           DrainRow("2", "persistent://a/b/t", 2, "ledger", "retention", "retrying", "503"),
                           DrainRow("3", "persistent://c/d/u", 3, "ledger", "retention", "dead_lettered", "x"),
                           DrainRow("4", "", -1, "", "", "malformed", "not JSON"),
                       ])


def test_drain_totals_fail_on_records_an_operator_must_see_not_on_retries():
    t = _drain(dry_run=False).totals()
    assert (t["topics"], t["ledgers"], t["failures"]) == (2, 4, 2)  # dead-lettered + malformed
    assert t["outcomes"] == {"deleted": 1, "retrying": 1, "dead_lettered": 1, "malformed": 1}
    assert t["counters"]["deleted_hot"] == 1 and t["counters"]["acknowledged"] == 1
    assert t["namespaces"]["a/b"]["failures"] == 0 and t["namespaces"]["a/b"]["ledgers"] == 2
    assert t["namespaces"]["c/d"]["failures"] == 1 and t["namespaces"]["(unknown)"]["failures"] == 1
    assert exit_code(t) == EXIT_FAILED
    # a dry run changes nothing, so it dead-letters nothing; a unit that did not run is a failure
    assert _drain(dry_run=True).totals()["failures"] == 0
    rep = DrainReport(7, True, task_errors=["hot: 5 record(s) not processed: OSError"])
    assert rep.totals()["failures"] == 1 and rep.messages() == ["FAILED task hot: 5 record(s) not processed: OSError"]


def test_drain_merge_concatenates_task_errors_and_rows():
    a, b = _drain(False), DrainReport(7, False, task_errors=["x"])
    m = a.merge(b)
    assert m.task_errors == ["x"] and len(m.rows) == 4 and m.entries == 4


def test_reconcile_totals():
    rep = ReconcileReport(0, 0, False, orphan_groups=2, orphan_objects=4, orphan_bytes=1000, hot_orphans=1,
                          hot_orphan_bytes=50, records_appended=3, foreign_keys=5, errors=["s3://b/: listing"])
    rep.add("a/b", KIND_OFFLOADED, 2, 4, 1000)
    rep.add("c/d", KIND_LEDGER, 1, 1, 50)
    rep.add("(unknown)", KIND_UPLOAD, 1, 0, 0)
    rep.detail_rows.append(("hot", KIND_LEDGER, "hot:1", 50, 0, None, 1, "persistent://c/d/t", "c/d"))
    t = rep.totals()
    assert (t["ledgers"], t["bytes"], t["failures"]) == (3, 1050, 1)
    assert t["outcomes"]["records_appended"] == 3 and t["outcomes"]["foreign_keys"] == 5
    assert "young_unreferenced" not in t["outcomes"]  # zero counters are left out
    assert t["namespaces"]["a/b"] == {"ledgers": 2, "bytes": 1000, "failures": 0, "outcomes": {"offloaded": 2}}
    assert t["namespaces"]["(unknown)"]["ledgers"] == 0  # uploads are not orphan records
    assert "detail_rows" not in rep.summary() and rep.detail()[0] == rep.detail_rows
    assert rep.messages() == ["ERROR s3://b/: listing"]


def test_ledger_run_report_and_summary_document():
    rows = [{"topic": "persistent://a/b/t", "namespace": "a/b", "ledger": 1, "kind": "scrub",
             "outcome": "unrecoverable", "bytes": 9, "blocks": 0, "entries": 0, "seconds": 0.0, "uuid": "u",
             "error": "checksum mismatch"}]
    rep = LedgerRunReport(RunSummary.of("scrub", "r", 0, False, rows, 0.5), rows)
    doc = summary_document(rep, "scrub", "r", 0.5)
    assert doc["totals"] == rep.totals() and doc["job"] == "scrub" and doc["run_id"] == "r"
    assert doc["totals"]["data_loss"] == ["persistent://a/b/t ledger 1"]
    assert exit_code(doc["totals"]) == EXIT_DATA_LOSS
    assert any(m.startswith("DATA LOSS: persistent://a/b/t ledger 1") for m in rep.messages())


def test_message_levels_and_the_outcome_line():
    from tieredcore.reports import message_level, outcome_line, totals

    assert [message_level(m) for m in ("FAILED t ledger 3: failed: OSError", "DATA LOSS: t ledger 3: ...",
                                       "DEAD-LETTERED r1 (...)", "STOPPED early: 2 ledger(s)", "ERROR listing",
                                       "BUSY t ledger 4: leased", "CONFLICT t ledgers 1..4: x",
                                       "a/b: 2 topic(s), 3 batch(es) compacted")] == \
        ["ERROR"] * 5 + ["WARNING"] * 2 + ["INFO"]
    t = totals(topics=2, ledgers=8, bytes=12345, outcomes={"offloaded": 7, "failed": 1}, failures=1)
    assert outcome_line(t, EXIT_FAILED) == ("outcome FAILED: 2 topic(s), 8 unit(s), 12,345 bytes; 1 failure(s); "
                                            "failed=1, offloaded=7; exit 1")
    assert outcome_line(totals(), 0).startswith("outcome ok: 0 topic(s)") and "nothing to do" in outcome_line(totals(), 0)


# -- RunReports: the one owner of the reports' layout ---------------------------------------------


def _publish(reports, job: str, run_id: str, attempt: int, doc: dict) -> None:
    """What a job does (spark_jobs/_jobkit.write_report): the attempt's detail, then publish."""
    import json

    (reports.detail_path(job, run_id, attempt)).mkdir(parents=True)
    (reports.detail_path(job, run_id, attempt) / "part-0").write_text(f"rows of attempt {attempt}")
    reports.publish(job, run_id, attempt, json.dumps({**doc, "attempt": attempt}))


def _report(job: str, rid: str, **t) -> dict:
    return {"job": job, "run_id": rid, "totals": totals(**t)}


def test_run_reports_layout_and_attempts(tmp_path):
    from tieredcore.reports import RunReports

    reports = RunReports(tmp_path)
    assert reports.summary_path("scrub", "r.a+b") == tmp_path / "scrub" / "r.a+b" / "summary.json"
    assert reports.summary_path("scrub", "r", 3) == tmp_path / "scrub" / "r" / "attempt-3" / "summary.json"
    assert reports.detail_path("scrub", "r", 3) == tmp_path / "scrub" / "r" / "attempt-3" / "detail.parquet"
    assert reports.jobs() == [] and reports.attempt_number("scrub", "r", {}) == 1
    _publish(reports, "scrub", "r", 1, _report("scrub", "r", failures=1))
    _publish(reports, "scrub", "r", 2, _report("scrub", "r"))
    # every attempt keeps its own report; the run's own is its latest attempt's, detail included
    assert reports.attempts("scrub", "r") == [1, 2]
    assert reports.read_summary("scrub", "r")["attempt"] == 2
    assert reports.read_summary("scrub", "r", 1)["totals"]["failures"] == 1
    assert (reports.detail_path("scrub", "r") / "part-0").read_text() == "rows of attempt 2"
    assert not list(reports.run_dir("scrub", "r").glob(".*"))  # no temporary copy left behind
    # the next attempt: one after the last outside Airflow, the task's try number in it
    assert reports.attempt_number("scrub", "r", {}) == 3
    assert reports.attempt_number("scrub", "r", {"TIERED_ATTEMPT": "7"}) == 7
    with pytest.raises(ValidationError, match="TIERED_ATTEMPT"):
        reports.attempt_number("scrub", "r", {"TIERED_ATTEMPT": "0"})
    assert reports.jobs() == ["scrub"] and reports.runs("scrub") == ["r"] and reports.has_run("scrub", "r")


def test_run_reports_refuse_what_is_not_a_report(tmp_path):
    from tieredcore.reports import RunReports

    reports = RunReports(tmp_path)
    for job, rid in (("..", "r"), ("scrub", ".."), ("scrub", "a/b"), ("", "r"), ("scrub", "")):
        with pytest.raises(ValidationError):
            reports.summary_path(job, rid)
    with pytest.raises(NotFoundError):
        reports.runs("no_such_job")
    with pytest.raises(NotFoundError):
        reports.read_summary("scrub", "never")
    (tmp_path / "scrub" / "bad").mkdir(parents=True)
    (tmp_path / "scrub" / "bad" / "summary.json").write_text("{not json")
    (tmp_path / "scrub" / "list").mkdir()
    (tmp_path / "scrub" / "list" / "summary.json").write_text("[1, 2]")
    for rid in ("bad", "list"):
        with pytest.raises(FormatError, match="unreadable report"):
            reports.read_summary("scrub", rid)
    # no reports location configured: nothing to list, nowhere to write
    none = RunReports("")
    assert none.jobs() == []
    with pytest.raises(ValidationError, match="no reports location"):
        none.run_dir("scrub", "r")


def test_newest_runs_by_when_their_summary_was_written(tmp_path):
    import os

    from tieredcore.reports import RunReports

    reports = RunReports(tmp_path)
    for i, rid in enumerate(("b", "a", "c")):
        _publish(reports, "scrub", rid, 1, _report("scrub", rid))
        os.utime(reports.summary_path("scrub", rid), (1000 + i, 1000 + i))
    reports.run_dir("scrub", "no-summary").mkdir()
    assert reports.newest_runs("scrub") == ["c", "a", "b"]
    assert reports.written("scrub", "no-summary") is None and reports.written("scrub", "c") == 1002


def test_totals_over_runs_and_namespaces_count_a_run_without_a_report_as_failed(tmp_path):
    import json

    from tieredcore.reports import RunReports

    reports = RunReports(tmp_path)
    ns_x = {"ledgers": 2, "bytes": 20, "failures": 1, "outcomes": {"offloaded": 1, "failed": 1}}
    ns_s = {"ledgers": 0, "bytes": 5, "failures": 0, "outcomes": {"offloaded": 2}, "segments": 2,
            "segment_bytes": 5, "segments_held": 1}
    _publish(reports, "offload_sweep", "r.a+x", 1, _report(
        "offload_sweep", "r.a+x", topics=1, ledgers=2, bytes=20, failures=1, outcomes={"offloaded": 1, "failed": 1},
        namespaces={"a/x": ns_x}, data_loss=["t ledger 9"]))
    _publish(reports, "offload_sweep", "r.a+s", 1, _report(
        "offload_sweep", "r.a+s", topics=2, bytes=5, outcomes={"offloaded": 2}, namespaces={"a/s": ns_s},
        segments=2, segment_bytes=5, segments_held=1))
    _publish(reports, "offload_sweep", "r.a+x2", 1, _report(
        "offload_sweep", "r.a+x2", topics=1, ledgers=1, bytes=7, outcomes={"offloaded": 1},
        namespaces={"a/x": {"ledgers": 1, "bytes": 7, "failures": 0, "outcomes": {"offloaded": 1}}}))
    reports.run_dir("offload_sweep", "old").mkdir()
    reports.summary_path("offload_sweep", "old").write_text(json.dumps({"entries": 3}))  # no totals
    t = reports.totals("offload_sweep", ["r.a+x", "r.a+s", "r.a+x2", "missing", "old"])
    assert (t.jobs, t.topics, t.ledgers, t.bytes, t.failures) == (5, 4, 3, 32, 1)
    assert t.failed_jobs == ["missing", "old"] and t.data_loss == ["t ledger 9"]
    assert t.outcomes == {"offloaded": 4, "failed": 1}
    assert (t.segments, t.segment_bytes, t.segments_held) == (2, 5, 1)
    assert t.reports == [str(reports.summary_path("offload_sweep", r)) for r in ("r.a+x", "r.a+s", "r.a+x2")]
    d = t.as_dict()
    assert json.loads(json.dumps(d)) == d  # an XCom value
    assert d["namespaces"]["a/x"] == {"ledgers": 3, "bytes": 27, "failures": 1,
                                      "outcomes": {"offloaded": 2, "failed": 1}}
    # a streaming namespace keeps its segment counts, a ledger-mode one its shape
    assert d["namespaces"]["a/s"] == ns_s
    assert "counters" not in d  # no report had counters
    lines = t.summary_lines()
    assert lines[0].startswith("offload_sweep summary: 5 job(s), 4 topic(s), 3 ledger(s)/record(s), 32 bytes, "
                               "1 failure(s), failed jobs: ['missing', 'old']")
    assert lines[0].endswith("; 2 segment(s) (5 bytes), 1 tail(s) held for their rollover")
    assert [line.split(":")[0] for line in lines[1:]] == ["  a/s", "  a/x", "DATA LOSS"]


def test_combined_totals_of_several_jobs_name_each_jobs_outcomes(tmp_path):
    import json

    from tieredcore.reports import NOT_PLANNED, RunReports, RunTotals, combine_totals

    reports = RunReports(tmp_path)
    _publish(reports, "retention_sweep", "r", 1, _report(
        "retention_sweep", "r", topics=1, ledgers=2, bytes=20, outcomes={"marked": 2},
        namespaces={"a/b": {"ledgers": 2, "bytes": 20, "failures": 0, "outcomes": {"marked": 2}}}))
    _publish(reports, "deletion_drain", "r", 1, _report(
        "deletion_drain", "r", ledgers=3, failures=1, outcomes={"deleted": 2, "dead_lettered": 1},
        counters={"deleted_hot": 2}, namespaces={"c/d": {"ledgers": 3, "bytes": 0, "failures": 1,
                                                         "outcomes": {"dead_lettered": 1}, "counters": {"x": 1}}}))
    sweep = reports.totals("retention_sweep", ["r"])
    drain = reports.totals("deletion_drain", ["r", "nope"])
    assert combine_totals([sweep]) is sweep  # one job: its own totals
    both = combine_totals([sweep, drain]).as_dict()
    assert json.loads(json.dumps(both)) == both
    assert both["job"] == "retention_sweep+deletion_drain" and both["jobs"] == 3
    assert (both["ledgers"], both["bytes"], both["failures"]) == (5, 20, 1)
    assert both["failed_jobs"] == ["deletion_drain/nope"]
    assert both["outcomes"] == {"retention_sweep.marked": 2, "deletion_drain.deleted": 2,
                                "deletion_drain.dead_lettered": 1}
    assert both["by_job"]["deletion_drain"]["counters"] == {"deleted_hot": 2}
    assert both["by_job"]["deletion_drain"]["namespaces"]["c/d"]["counters"] == {"x": 1}
    assert both["namespaces"] == {} and len(both["reports"]) == 2
    # a job never planned (its plan failed) is a failed job of the run
    missing = combine_totals([sweep, RunTotals.not_run("deletion_drain")]).as_dict()
    assert missing["failed_jobs"] == [f"deletion_drain/{NOT_PLANNED}"] and missing["jobs"] == 1


def _unrepairable_row(topic: str = "persistent://acme/orders/audit", lid: int = 2001, **kw) -> dict:
    from dataclasses import asdict

    from tieredcore.lifecycle.work import REPAIR_WITHOUT_BOOKKEEPER, LedgerResult

    fields = {"bytes": 100, "uuid": "u-1", "error": "the offloaded copy u-1 is damaged (...)",
              "repair": REPAIR_WITHOUT_BOOKKEEPER, **kw}
    row = LedgerResult(topic, "acme/orders", lid, "scrub", "unrepairable", **fields)
    return asdict(row)


def test_unrepairable_copies_exit_4_only_when_nothing_else_failed():
    from tieredcore.reports import EXIT_UNREPAIRABLE

    only = RunSummary.of("scrub", "r", 0, False, [_unrepairable_row()], 0.0).totals()
    assert only["failures"] == 1 and exit_code(only) == EXIT_UNREPAIRABLE
    mixed = RunSummary.of("scrub", "r", 0, False, [_unrepairable_row(), _unrepairable_row(lid=2002) | {
        "outcome": "failed", "repair": "", "error": "BlobStoreError: timeout"}], 0.0).totals()
    assert exit_code(mixed) == EXIT_FAILED  # a store failure may go away on a retry
    lost = totals(failures=2, data_loss=["t ledger 1"], outcomes={"unrepairable": 1, "unrecoverable": 1})
    assert exit_code(lost) == EXIT_DATA_LOSS


def test_damage_per_namespace_in_the_summary_the_dag_totals_and_the_log_lines():
    from tieredcore.reports import RunTotals, message_level

    rows = [_unrepairable_row(damaged_at="2001:4,2001:9", damage_reasons="CRC32C mismatch (a)\nCRC32C mismatch (b)",
                              messages_checked=10, messages_damaged=2),
            _unrepairable_row(lid=2003, error="CorruptObjectError: k: bytes 5-9 of block 0 are not padding")]
    rep = LedgerRunReport(RunSummary.of("scrub", "r", 0, False, rows, 0.0), rows)
    damage = rep.summary()["namespaces"]["acme/orders"]["damage"]
    assert damage[0] == {"topic": "persistent://acme/orders/audit", "ledger": 2001, "uuid": "u-1",
                         "outcome": "unrepairable", "repair": "impossible without BookKeeper",
                         "damaged_messages": [{"position": "2001:4", "reason": "CRC32C mismatch (a)"},
                                              {"position": "2001:9", "reason": "CRC32C mismatch (b)"}],
                         "problem": "the offloaded copy u-1 is damaged (...)"}
    assert damage[1]["damaged_messages"] == [] and damage[1]["ledger"] == 2003
    lines = [ln for ln in rep.messages() if ln.startswith("DAMAGED")]
    assert lines == [
        "DAMAGED acme/orders persistent://acme/orders/audit 2001:4 CRC32C mismatch (a): repair impossible without BookKeeper",
        "DAMAGED acme/orders persistent://acme/orders/audit 2001:9 CRC32C mismatch (b): repair impossible without BookKeeper",
        "DAMAGED acme/orders persistent://acme/orders/audit ledger 2003: CorruptObjectError: k: bytes 5-9 of block 0 "
        "are not padding"]
    assert {message_level(ln) for ln in lines} == {"ERROR"}
    run = RunTotals("scrub")
    run.add(rep.totals(), "r")
    run.add(rep.totals(), "r2")  # two reports: their damage added up
    assert run.as_dict()["namespaces"]["acme/orders"]["damage"] == damage + damage
    assert [ln for ln in run.summary_lines() if ln.startswith("DAMAGED")] == lines + lines
