"""Run reports: report names, the totals every job's report gives, the exit-code rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
