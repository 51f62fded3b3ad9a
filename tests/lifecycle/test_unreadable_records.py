"""A topic record that cannot be read fails THAT topic, with its path and the reason, while every other
topic keeps working (issue 22, item 4): `tiered status`, the sweeps' planning and runs (offload, deletion-lag
cleanup, retention, scrub), orphan reconciliation (which must never take the objects such a record might
reference for orphans), the deletion drain (an unreadable record = in use: nothing deleted) and the
operator's overview. Records are injected into real SQLite and ZooKeeper metadata stores."""

from __future__ import annotations

import json
import pickle
import time
import uuid as uuidlib
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.support.workspaces import END_MS, offload, sealed
from tieredcore.cli import main as cli
from tieredcore.errors import FormatError, UnreadableRecordError
from tieredcore.formats.mlinfo import encode_managed_ledger_info
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.overview import Prices, build_overview, tier_snapshot
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.retention import plan_retention
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.status import topic_status
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_offload
from tieredcore.lifecycle.work import OPTION_UNREADABLE, RECORD_ROW, LedgerResult, RunSummary
from tieredcore.meta.deletion_log import TYPE_LEDGER, TYPE_OFFLOADED, DeletionLog, DeletionRecord
from tieredcore.meta.managed_ledgers import topic_path
from tieredcore.names import TopicName
from tieredcore.offload.copies import copy_uuids
from tieredcore.outcomes import Outcome

BAD = "persistent://t/a/topic-0000"
GOOD_A = "persistent://t/a/topic-0001"
GOOD_B = "persistent://t/b/topic-0000"
TOPICS = (BAD, GOOD_A, GOOD_B, "persistent://t/b/topic-0001")
BAD_PATH = "/managed-ledgers/t/a/persistent/topic-0000"
BAD_ML, GOOD_A_ML = "t/a/persistent/topic-0000", "t/a/persistent/topic-0001"  # as deletion records name them
GRACE = 3600 * 1000


def damage(ws, topic: str) -> bytes:
    """The topic's record rewritten as a broker with ZLIB compression writes it (MetaStoreImpl's 0x4778
    framing) but with the compressed stream cut in half: a record that cannot be decoded."""
    info, _ = ws.ml.get_topic(topic)
    whole = encode_managed_ledger_info(info, "ZLIB")
    bad = whole[: len(whole) - (len(whole) - 12) // 2]
    ws.metadata.set(topic_path(topic), bad)
    return bad


@pytest.fixture(params=["sqlite", "zk"])
def ws(request, make_ws):
    """t/a and t/b, two topics each (4 sealed ledgers + the open one); the first two sealed ledgers of every
    topic offloaded; then BAD's record damaged."""
    overrides = {"metadata_url": request.getfixturevalue("zk_url")} if request.param == "zk" else None
    w = make_ws(["t/a", "t/b"], topics=2, ledgers=4, entries=8, config_overrides=overrides)
    for t in TOPICS:
        offload(w, t, sealed(w, t)[:2])
    w.bad_uuids = {u for li in w.ml.get_topic(BAD)[0].ledgerInfo for u in copy_uuids(li)}
    w.bad_ledgers = [li.ledgerId for li in w.ml.get_topic(BAD)[0].ledgerInfo]
    w.good_bytes = bytes(w.metadata.get(BAD_PATH).value)
    w.bad_bytes = damage(w, BAD)
    return w


def run(ws, plan) -> list[LedgerResult]:
    return [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan])]


def failed_for_bad(rows: list[LedgerResult]) -> LedgerResult:
    [row] = [r for r in rows if r.topic == BAD]
    assert (row.outcome, row.ledger, row.what) == (Outcome.FAILED, RECORD_ROW, "topic record")
    assert BAD_PATH in row.error and "ZLIB payload is truncated" in row.error, row.error
    return row


def test_the_store_names_topic_path_and_reason(ws):
    with pytest.raises(UnreadableRecordError) as ei:
        ws.ml.get_topic(BAD)
    e = ei.value
    assert isinstance(e, FormatError)
    assert (e.topic, e.path) == (BAD, BAD_PATH)
    assert "ZLIB payload is truncated" in e.reason and BAD_PATH in str(e) and BAD in str(e)
    back = pickle.loads(pickle.dumps(e))  # a Spark task's error reaches the driver whole
    assert (type(back), back.topic, back.path, back.reason, str(back)) == (type(e), e.topic, e.path, e.reason, str(e))
    assert bytes(ws.metadata.get(BAD_PATH).value) == ws.bad_bytes  # reading it changed nothing


def test_status_shows_every_other_topic(ws, capsys):
    topics = [TopicName.parse(t) for t in TOPICS]
    rep = topic_status(ws, topics, ledgers=True, by_namespace=True)
    rows = {r.topic: r for r in rep.topics}
    assert BAD_PATH in rows[BAD].error and "truncated" in rows[BAD].error and rows[BAD].version is None
    assert [r.topic for r in rep.unreadable] == [BAD]
    for t in TOPICS[1:]:
        info, version = ws.ml.get_topic(t)
        assert (rows[t].error, rows[t].version, rows[t].ledgers) == ("", version, len(info.ledgerInfo))
        assert rows[t].both == 2 and "error" not in rows[t].as_dict()
    assert rep.namespaces["t/a"].topics == 2 and rep.namespaces["t/a"].unreadable == 1
    assert rep.namespaces["t/a"].ledgers == rows[GOOD_A].ledgers  # only what can be read is added up
    assert rep.namespaces["t/b"].unreadable == 0

    # the command: every topic listed, the bad one with its path and reason, exit 1
    root = Path(ws.config.reports_dir).parent
    capsys.readouterr()
    assert cli.main(["--workspace", str(root), "--json", "status"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [r["topic"] for r in doc["topics"]] == sorted(TOPICS)
    [bad] = [r for r in doc["topics"] if r.get("error")]
    assert bad["topic"] == BAD and BAD_PATH in bad["error"]
    assert cli.main(["--workspace", str(root), "status", "--by-namespace"]) == 1
    out = capsys.readouterr().out
    assert f"ERROR {BAD}: its record cannot be read: {BAD_PATH}" in out and "(1 unreadable)" in out


def test_offload_and_lag_sweeps_fail_only_the_bad_topic(ws):
    for ns in ("t/a", "t/b"):
        ws.policies.set_namespace(ns, {"offload_threshold_bytes": 0, "deletion_lag_ms": 0})
    as_of = END_MS + GRACE
    plan = plan_offload(ws, None, as_of)
    by_topic = {w.topic: w for w in plan}
    assert set(by_topic) == set(TOPICS)
    assert by_topic[BAD].ledgers == [] and BAD_PATH in by_topic[BAD].options[OPTION_UNREADABLE]
    rows = run(ws, plan)
    failed_for_bad(rows)
    assert {(r.topic, r.outcome) for r in rows if r.topic != BAD} == {(t, "offloaded") for t in TOPICS[1:]}
    s = RunSummary.of("offload_sweep", "r1", as_of, False, [asdict(r) for r in rows], 0.0)
    assert s.failures == 1 and s.namespaces["t/a"]["failures"] == 1 and s.namespaces["t/b"]["failures"] == 0
    assert s.ledgers == 1 + 3 * 2

    lag = plan_lag_cleanup(ws, None, max(int(time.time() * 1000), END_MS) + GRACE)  # offloaded at wall time
    assert {w.topic for w in lag} == set(TOPICS)
    rows = run(ws, lag)
    failed_for_bad(rows)
    assert {r.outcome for r in rows if r.topic != BAD} == {Outcome.MARKED}


def test_scrub_and_retention_fail_only_the_bad_topic(ws):
    as_of = END_MS + GRACE
    scrub = plan_scrub(ws, None, as_of)
    assert {w.topic for w in scrub} == set(TOPICS)
    rows = run(ws, scrub)
    failed_for_bad(rows)
    assert {r.outcome for r in rows if r.topic != BAD} == {Outcome.OK}

    for ns in ("t/a", "t/b"):
        ws.policies.set_namespace(ns, {"retention_time_minutes": 15})  # the oldest ledgers are past it
    plan = plan_retention(ws, None, as_of)
    assert {w.topic for w in plan} == set(TOPICS)
    # the retention sweep job plans a topic's two kinds of unit together: still one unit for the bad topic
    from spark_jobs.retention_sweep import plan_units

    ws.policies.set_namespace("t/a", {"retention_time_minutes": 15, "deletion_lag_ms": 0})
    assert [w.topic for w in plan_units(ws, None, as_of)].count(BAD) == 1
    rows = run(ws, plan)
    failed_for_bad(rows)
    assert {r.outcome for r in rows if r.topic != BAD} == {Outcome.TRIMMED}


def _abandoned(ws, topic: str) -> str:
    """An offload attempt of the topic's first sealed ledger that no record names (leaked)."""
    u = str(uuidlib.uuid4())
    lid = sealed(ws, topic)[0]
    ws.offloader.offload(ws.hot.open_ledger(lid), u, {"managedledgername": TopicName.parse(topic).managed_ledger_name})
    return u


def test_reconcile_never_records_what_the_bad_record_may_reference(ws):
    leaked_a, leaked_b = _abandoned(ws, GOOD_A), _abandoned(ws, GOOD_B)
    nameless = str(uuidlib.uuid4())  # ours (this cluster's), naming no topic: whose it is is unknown
    ws.offloader.offload(ws.hot.open_ledger(sealed(ws, GOOD_B)[0]), nameless, {})
    assert "managedledgername" not in ws.store.head(f"{nameless}-ledger-{sealed(ws, GOOD_B)[0]}").metadata
    as_of = max(int(time.time() * 1000), END_MS) + 10 * GRACE  # every object and hot ledger is old
    for dry_run in (True, False):
        rep = reconcile(ws, as_of, GRACE, dry_run=dry_run)
        recorded = {r["uuid"] for r in rep.records if r["type"] != TYPE_LEDGER}
        # t/b's leak is recorded; nothing of t/a is: the bad record may name it (its own objects, above all)
        assert recorded == {leaked_b}, rep.records
        assert not ws.bad_uuids & recorded and leaked_a not in recorded and nameless not in recorded
        assert rep.withheld_groups == len(ws.bad_uuids) + 2
        assert rep.withheld_hot_ledgers == len(ws.bad_ledgers)  # its hot ledgers may be listed by it
        assert not [r for r in rep.records if r["type"] == TYPE_LEDGER and r["topic"] == BAD]
        assert rep.unreadable_topics == [BAD]
        [err] = rep.errors
        assert BAD_PATH in err and "namespace t/a" in err
        tot = rep.totals()
        assert tot["failures"] == 1 and tot["namespaces"]["t/a"]["failures"] == 1
    pending = {e.record.uuid for e in DeletionLog(ws.metadata).pending()}
    assert leaked_b in pending and not (ws.bad_uuids | {leaked_a, nameless}) & pending
    drain(ws, as_of)
    r = ws.reader()
    try:  # every readable topic still reads back whole
        for t in TOPICS[1:]:
            info, _ = ws.ml.get_topic(t)
            assert sum(1 for _ in r.read(t)) == sum(li.entries for li in info.ledgerInfo)
    finally:
        r.close()
    assert all(ws.hot.exists(lid) for lid in ws.bad_ledgers)
    # once the record reads again, what it does not reference is found and recorded; what it does is not
    ws.metadata.set(BAD_PATH, ws.good_bytes)
    rep = reconcile(ws, as_of, GRACE)
    assert rep.errors == [] and rep.withheld_groups == 0
    assert {r["uuid"] for r in rep.records if r["type"] != TYPE_LEDGER} == {leaked_a, nameless}


def test_drain_takes_an_unreadable_record_as_in_use(ws, capsys):
    dl = DeletionLog(ws.metadata)
    driver = ws.offloader.location.driver_dict()
    bad_uuid = sorted(ws.bad_uuids)[0]
    leaked = _abandoned(ws, GOOD_A)
    lid_good, lid_bad = sealed(ws, GOOD_A)[0], ws.bad_ledgers[0]
    dl.append([
        DeletionRecord(topic=BAD_ML, ledger_id=lid_bad, type=TYPE_OFFLOADED, reason="offload-cleanup",
                       created_ms=END_MS, uuid=bad_uuid, driver=driver),
        DeletionRecord(topic=BAD_ML, ledger_id=lid_bad, type=TYPE_LEDGER, reason="retention", created_ms=END_MS),
        DeletionRecord(topic=GOOD_A_ML, ledger_id=lid_good, type=TYPE_OFFLOADED, reason="offload-cleanup",
                       created_ms=END_MS, uuid=leaked, driver=driver),
    ])
    before = {e.id: (e.version, e.raw) for e in dl.pending()}
    objects_before = {o for o in _keys(ws) if bad_uuid in o}
    assert objects_before
    for dry_run in (True, False):
        rep = drain(ws, END_MS + GRACE, dry_run=dry_run)
        outcomes = sorted((r.topic, r.type, r.outcome) for r in rep.rows)
        assert outcomes == sorted([(BAD_ML, TYPE_OFFLOADED, Outcome.UNREADABLE_TOPIC),
                                   (BAD_ML, TYPE_LEDGER, Outcome.UNREADABLE_TOPIC),
                                   (GOOD_A_ML, TYPE_OFFLOADED,
                                    Outcome.WOULD_DELETE if dry_run else Outcome.DELETED)])
        assert all(BAD_PATH in r.error for r in rep.rows if r.topic == BAD_ML)
        assert rep.unreadable_topic == 2 and rep.totals()["failures"] == 2
        assert rep.totals()["namespaces"]["t/a"]["failures"] == 2
        assert any(m.startswith("KEPT ") and BAD_PATH in m for m in rep.messages())
    left = {e.id: (e.version, e.raw) for e in dl.pending()}
    assert len(left) == 2 and all(before[i] == v for i, v in left.items())  # kept exactly as they were
    # the commands: a drain and a reconciliation that meet it exit 1, naming the record
    root = str(Path(ws.config.reports_dir).parent)
    capsys.readouterr()
    assert cli.main(["--workspace", root, "--json", "deletions", "drain", "--as-of", str(END_MS + GRACE)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["unreadable_topic"] == 2 and left == {e.id: (e.version, e.raw) for e in dl.pending()}
    assert cli.main(["--workspace", root, "--json", "reconcile", "--as-of", str(END_MS + GRACE), "--dry-run"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["unreadable_topics"] == [BAD] and BAD_PATH in doc["errors"][0]
    assert {o for o in _keys(ws) if bad_uuid in o} == objects_before
    assert ws.hot.exists(lid_bad)
    assert not [o for o in _keys(ws) if leaked in o]


def _keys(ws) -> set[str]:
    from tieredcore.cold.blob import iter_objects

    return {o.key for o in iter_objects(ws.store)}


def test_overview_reports_the_bad_topic(ws):
    now = END_MS + GRACE
    ov = build_overview(ws, ws.config.reports_dir, now, Prices.of(ws.config))
    by_ns = {n.namespace: n for n in ov.namespaces}
    [bad] = by_ns["t/a"].unreadable_topics
    assert bad.startswith(f"{BAD}: {BAD_PATH}: ") and "truncated" in bad
    assert by_ns["t/b"].unreadable_topics == [] and ov.totals["unreadable_topics"] == 1
    good_a = ws.ml.get_topic(GOOD_A)[0]
    assert sum(by_ns["t/a"].tiers[t]["ledgers"] for t in ("hot", "both", "cold")) == len(good_a.ledgerInfo)
    assert by_ns["t/a"].tiers["both"]["ledgers"] == 2 and by_ns["t/b"].tiers["both"]["ledgers"] == 4
    snap = tier_snapshot(ws)
    assert snap["t/a"]["unreadable"] == 1 and "unreadable" not in snap["t/b"]
    assert snap["t/a"]["both"]["ledgers"] == 2
