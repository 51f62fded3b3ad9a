"""Run reports: the totals every job's report gives, the exit-code rule (the layout: test_report_layout.py)."""

from __future__ import annotations

from tieredcore.lifecycle.drain import DrainReport, DrainRow
from tieredcore.lifecycle.reconcile.report import KIND_LEDGER, KIND_OFFLOADED, KIND_UPLOAD, ReconcileReport
from tieredcore.lifecycle.work import LedgerRunReport, RunSummary
from tieredcore.reports import (
    EXIT_DATA_LOSS,
    EXIT_FAILED,
    EXIT_OK,
    exit_code,
    summary_document,
    totals,
)


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
