"""Scrub and repair (tieredcore.lifecycle.scrub): damaged and lost offloaded copies are found, repaired
from the hot copy (a verified re-offload, the damaged attempt to the deletion log), and reported as data
loss when no hot copy is left — never deleted."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.support.workspaces import END_MS
from tieredcore.cli import main as cli
from tieredcore.formats.keys import data_key, index_key
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import deep_for, plan_scrub
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult, RunSummary
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.offload.context import context_uuid

T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"
AS_OF = END_MS + 3600 * 1000


@pytest.fixture
def ws(make_ws):
    """Two topics, 3 sealed ledgers each, all offloaded; hot copies still there."""
    w = make_ws(["t/a"], topics=2, ledgers=3, entries=30, entry_size="200-900")
    w.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
    rows = list(run_work(w.config, [u.as_dict() for u in plan_offload(w, None, END_MS)]))
    assert {r["outcome"] for r in rows} == {"offloaded"} and len(rows) == 6
    return w


def ledgers(ws, topic=T):
    info, _ = ws.ml.get_topic(topic)
    return [li for li in info.ledgerInfo if li.HasField("offloadContext")]


def scrub(ws, *, deep=False, repair=False, topics=None) -> dict[int, LedgerResult]:
    work = plan_scrub(ws, None, AS_OF, topics=topics, deep=deep, repair=repair)
    rows = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in work])]
    return {(r.topic, r.ledger): r for r in rows}


def keys(li) -> tuple[str, str]:
    u = context_uuid(li)
    return data_key("", u, li.ledgerId), index_key("", u, li.ledgerId)


def rewrite(ws, key, fn) -> None:
    md, data = ws.store.head(key).metadata, bytearray(ws.store.get(key))
    fn(data)
    ws.store.put(key, bytes(data), md)


def flip_payload(ws, li) -> None:
    def f(d):
        d[128 + 12 + 20] ^= 0x04

    rewrite(ws, keys(li)[0], f)


def read_all(ws, topic=T):
    r = ws.reader()
    try:
        return [(str(p), d) for p, d in r.read(topic)], r.fallbacks
    finally:
        r.close()


def test_healthy_copies_are_ok_and_deep_reads_every_byte(ws):
    shallow = scrub(ws)
    assert {r.outcome for r in shallow.values()} == {"ok"} and len(shallow) == 6
    deep = scrub(ws, deep=True)
    for (t, lid), r in deep.items():
        assert r.outcome == "ok" and r.blocks >= 1
        li = find_ledger(ws.ml.get_topic(t)[0], lid)
        assert r.bytes > shallow[(t, lid)].bytes and r.bytes >= ws.store.head(keys(li)[0]).size


@pytest.mark.parametrize("damage", ["index-lost", "both-lost", "index-byte", "data-truncated", "payload-byte"])
def test_damage_is_found_and_repaired_from_the_hot_copy(ws, damage):
    expected, _ = read_all(ws)
    victim = ledgers(ws)[1]
    dkey, ikey = keys(victim)
    damaged_uuid = context_uuid(victim)
    if damage == "index-lost":
        ws.store.delete([ikey])
    elif damage == "both-lost":  # a bucket restored without them
        ws.store.delete([ikey, dkey])
    elif damage == "index-byte":
        rewrite(ws, ikey, lambda d: d.__setitem__(40, d[40] ^ 1))
    elif damage == "data-truncated":
        rewrite(ws, dkey, lambda d: d.__delitem__(slice(-10, None)))
    else:
        flip_payload(ws, victim)
    key = (T, victim.ledgerId)
    deep = damage == "payload-byte"  # only reading every byte finds a flipped payload byte
    if deep:
        assert scrub(ws)[key].outcome == "ok"
    found = scrub(ws, deep=deep)
    assert found[key].outcome == "damaged" and "--repair" in found[key].error
    assert all(r.outcome == "ok" for k, r in found.items() if k != key)
    assert context_uuid(ledgers(ws)[1]) == damaged_uuid  # a scrub without repair changes nothing
    assert DeletionLog(ws.metadata).pending() == []

    fixed = scrub(ws, deep=deep, repair=True)
    assert fixed[key].outcome == "repaired" and not fixed[key].failed
    li = ledgers(ws)[1]
    assert context_uuid(li) != damaged_uuid and li.offloadContext.complete
    (rec,) = [e.record for e in DeletionLog(ws.metadata).pending()]
    assert (rec.uuid, rec.reason, rec.ledger_id) == (damaged_uuid, "scrub-repair", victim.ledgerId)
    assert scrub(ws, deep=True)[key].outcome == "ok"
    got, fallbacks = read_all(ws)
    assert got == expected and fallbacks == 0
    d = drain(ws, AS_OF)
    assert (d.deleted, d.already_deleted) == ((0, 1) if damage == "both-lost" else (1, 0))
    assert not any(o.key.startswith(damaged_uuid) for o in ws.store.list("").objects)


def test_without_a_hot_copy_damage_is_data_loss_reported_and_nothing_is_deleted(ws):
    victim = ledgers(ws)[0]
    dkey, ikey = keys(victim)
    flip_payload(ws, victim)
    ws.hot.delete_ledger(victim.ledgerId)  # the lag cleanup's drain removed it long ago

    def mark(info):
        find_ledger(info, victim.ledgerId).offloadContext.bookkeeperDeleted = True

    ws.ml.update_topic(T, mark)
    res = scrub(ws, deep=True, repair=True)
    r = res[(T, victim.ledgerId)]
    assert r.outcome == "unrecoverable" and r.failed and r.error.startswith("DATA LOSS")
    summary = RunSummary.of("scrub", "r", AS_OF, False, [x.__dict__ for x in res.values()], 0)
    assert summary.data_loss == [f"{T} ledger {victim.ledgerId}"] and summary.failures == 1
    assert summary.namespaces["t/a"]["outcomes"] == {"ok": 5, "unrecoverable": 1}
    # nothing deleted, nothing recorded: what is left of the copy stays for an operator
    assert ws.store.head(dkey).size > 0 and ws.store.head(ikey).size > 0
    assert DeletionLog(ws.metadata).pending() == []
    assert context_uuid(ledgers(ws)[0]) == context_uuid(victim)


def test_a_hot_copy_marked_deleted_but_not_drained_still_repairs(ws):
    victim = ledgers(ws)[2]

    def mark(info):
        find_ledger(info, victim.ledgerId).offloadContext.bookkeeperDeleted = True

    ws.ml.update_topic(T, mark)
    flip_payload(ws, victim)
    r = scrub(ws, deep=True, repair=True)[(T, victim.ledgerId)]
    assert r.outcome == "repaired"
    assert ledgers(ws)[2].offloadContext.bookkeeperDeleted  # still to be drained: the new copy stands alone


def test_pulsar_style_objects_are_checked_against_the_hot_copy(make_ws):
    """No checksums (Pulsar's objects): a deep scrub still finds a flipped payload byte through the hot
    tier's CRCs."""
    w = make_ws(["t/a"], ledgers=2, entries=20, config_overrides={"checksum_chunk": 0, "checkpoint_interval": 0})
    w.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
    list(run_work(w.config, [u.as_dict() for u in plan_offload(w, None, END_MS)]))
    victim = ledgers(w)[0]
    flip_payload(w, victim)
    assert scrub(w)[(T, victim.ledgerId)].outcome == "ok"  # the structure is sound
    assert scrub(w, deep=True)[(T, victim.ledgerId)].outcome == "damaged"


def test_deep_auto_is_weekly():
    sunday = int(dt.datetime(2026, 11, 22, 3, tzinfo=dt.UTC).timestamp() * 1000)
    assert [deep_for("auto", sunday + d * 86_400_000) for d in range(7)] == [True] + [False] * 6
    assert deep_for("always", sunday + 86_400_000) and not deep_for("never", sunday)


def test_cli_scrub_reports_and_repairs_only_when_asked(ws, capsys):
    victim = ledgers(ws)[1]
    ws.store.delete(list(keys(victim)))
    cfg = str(ws.config.hot_url.replace("file://", "")).rsplit("/hot", 1)[0] + "/tiered.toml"
    capsys.readouterr()
    assert cli.main(["--config", cfg, "scrub", "--namespace", "t/a"]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and f"ledger {victim.ledgerId}" in out and "rerun with --repair" in out
    assert context_uuid(ledgers(ws)[1]) == context_uuid(victim)  # the default changes nothing
    assert cli.main(["--config", cfg, "--json", "scrub", T, "--repair"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["outcomes"] == {"ok": 2, "repaired": 1} and res["problems"] == []
    assert res["namespaces"]["t/a"]["outcomes"] == {"ok": 2, "repaired": 1}
    assert cli.main(["--config", cfg, "scrub", "--deep"]) == 0
    # bad input: one line, exit 2
    assert cli.main(["--config", cfg, "scrub", "--namespace", "no/such"]) == 2
    assert cli.main(["--config", cfg, "scrub", "t/a/missing"]) == 2
