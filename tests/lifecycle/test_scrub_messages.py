"""Integrity at the message level: the deep scrub and the deletion-lag proof check every Pulsar message's
CRC32C in objects without chunk checksums (tieredcore.offload.message_audit, in verify.py's one read),
name damaged messages by position, count them per namespace in the run's summary, and never report
opaque entries as damage.

Objects "as Pulsar writes them" are the workspace's own with ``checksum_chunk = 0`` and
``checkpoint_interval = 0``: byte for byte the layout of Pulsar's BlobStoreManagedLedgerOffloader
(tests/offload/test_sidecar.py checks it against tests/support/pulsar_objects.py); the entries are Pulsar
messages written by `tiered generate` (framed as Pulsar's Commands.serializeMetadataAndPayload)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.support import pulsar_objects
from tests.support.workspaces import END_MS
from tieredcore.cli import main as cli
from tieredcore.formats.keys import data_key
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_offload
from tieredcore.lifecycle.work import LedgerResult, RunSummary
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.offload.context import context_uuid
from tieredcore.topic.writer import TopicWriter

T = "persistent://t/a/topic-0000"
AS_OF = END_MS + 3600 * 1000
HOUR = 3600 * 1000
PULSAR_LAYOUT = {"checksum_chunk": 0, "checkpoint_interval": 0}
ENTRIES = 30


def offloaded(make_ws, *, messages: bool = True, layout: dict | None = PULSAR_LAYOUT, ledgers: int = 3):
    """t/a: one topic, ``ledgers`` sealed ledgers of 30 entries, all offloaded at END; hot copies kept."""
    w = make_ws(["t/a"], ledgers=ledgers, entries=ENTRIES, entry_size="200-600", messages=messages,
                config_overrides=layout)
    w.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "deletion_lag_ms": HOUR})
    rows = list(run_work(w.config, [u.as_dict() for u in plan_offload(w, None, END_MS)]))
    assert {r["outcome"] for r in rows} == {"offloaded"}
    return w


def ledgers(ws, topic=T):
    info, _ = ws.ml.get_topic(topic)
    return [li for li in info.ledgerInfo if li.HasField("offloadContext")]


def scrub(ws, *, deep=True, repair=False, messages="auto") -> tuple[dict[int, LedgerResult], RunSummary]:
    work = plan_scrub(ws, None, AS_OF, deep=deep, repair=repair, messages=messages)
    raw = list(run_work(ws.config, [w.as_dict() for w in work]))
    return ({r["ledger"]: LedgerResult(**r) for r in raw},
            RunSummary.of("scrub", "r", AS_OF, not repair, raw, 0.0))


def damage(ws, li, entry: int) -> str:
    """Flip a byte inside the payload of entry ``entry``'s message in the ledger's data object."""
    key = data_key("", context_uuid(li), li.ledgerId)
    md, data = ws.store.head(key).metadata, bytearray(ws.store.get(key))
    pulsar_objects.flip_payload_byte(data, entry)
    ws.store.put(key, bytes(data), md)
    return key


def drop_hot(ws, li, topic=T) -> None:
    """The hot copy is gone (the drain deleted it after the deletion lag)."""
    ws.hot.delete_ledger(li.ledgerId)

    def mark(info):
        find_ledger(info, li.ledgerId).offloadContext.bookkeeperDeleted = True

    ws.ml.update_topic(topic, mark)


def config_path(ws) -> str:
    return str(Path(ws.config.hot_url.replace("file://", "")).parent / "tiered.toml")


def test_a_damaged_message_without_a_hot_copy_is_data_loss_named_at_its_position(make_ws, capsys):
    ws = offloaded(make_ws)
    victim = ledgers(ws)[1]
    lid = victim.ledgerId
    key = damage(ws, victim, 4)
    drop_hot(ws, victim)
    shallow, _ = scrub(ws, deep=False)
    assert shallow[lid].outcome == "ok"  # the structure is sound: only the message's CRC32C knows
    rows, summary = scrub(ws, repair=True)
    r = rows[lid]
    assert r.outcome == "unrecoverable" and r.error.startswith("DATA LOSS")
    assert f"1 damaged message(s) of {ENTRIES} entries: {lid}:4 (CRC32C mismatch (stored 0x" in r.error
    assert (r.messages_checked, r.messages_unchecked, r.messages_damaged, r.not_messages) == (ENTRIES - 1, 0, 1, 0)
    assert r.damaged_at == f"{lid}:4" and summary.damaged_messages == [f"{T} {lid}:4"]
    assert r.repair == "impossible: no intact copy left" and r.damage_reasons.startswith("CRC32C mismatch (stored 0x")
    assert r.bytes >= ws.store.head(key).size and r.blocks >= 1
    others = [x for k, x in rows.items() if k != lid]
    assert all(x.outcome == "ok" and x.messages_checked == ENTRIES and not x.messages_damaged for x in others)
    # per namespace in the run's summary (and its totals' counters)
    want = {"messages_checked": 3 * ENTRIES - 1, "messages_unchecked": 0, "messages_damaged": 1, "not_messages": 0}
    assert summary.namespaces["t/a"]["counters"] == want and summary.messages == want
    assert summary.totals()["counters"] == want and summary.data_loss == [f"{T} ledger {lid}"]
    # nothing deleted, nothing recorded, nothing replaced
    assert ws.store.head(key).size > 0 and DeletionLog(ws.metadata).pending() == []
    assert context_uuid(ledgers(ws)[1]) == context_uuid(victim)

    # the command line: the position and the counts
    capsys.readouterr()
    assert cli.main(["--config", config_path(ws), "scrub", "--deep", "--namespace", "t/a"]) == 1
    out = capsys.readouterr().out
    assert f"UNRECOVERABLE {T} ledger {lid}: DATA LOSS" in out and f"{lid}:4 (CRC32C mismatch" in out
    line = next(x for x in out.splitlines() if x.startswith("t/a "))
    assert line.split()[-4:] == [str(3 * ENTRIES - 1), "0", "1", "0"]
    assert cli.main(["--config", config_path(ws), "--json", "scrub", "--deep"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["messages"] == want and res["namespaces"]["t/a"]["counters"] == want
    assert [p["ledger"] for p in res["problems"]] == [lid] and f"{lid}:4" in res["problems"][0]["error"]


def test_with_a_hot_copy_the_damaged_copy_is_repaired_from_it(make_ws):
    ws = offloaded(make_ws)
    victim = ledgers(ws)[0]
    lid = victim.ledgerId
    damage(ws, victim, 11)
    found, _ = scrub(ws)
    assert found[lid].outcome == "damaged" and "entry 11 at bytes" in found[lid].error
    assert "differs from the hot copy" in found[lid].error and "--repair" in found[lid].error
    fixed, _ = scrub(ws, repair=True)
    assert fixed[lid].outcome == "repaired"
    again, summary = scrub(ws)
    assert again[lid].outcome == "ok" and again[lid].messages_checked == ENTRIES
    assert summary.namespaces["t/a"]["counters"]["messages_damaged"] == 0


def _write_topic(ws, topic: str, entries: list[bytes]) -> int:
    """A topic of exactly ``entries`` in one sealed ledger (and an empty open one), offloaded; its id."""
    w = TopicWriter(ws.ml, ws.hot, topic, max_entries=len(entries) + 1, clock_ms=lambda: END_MS - HOUR)
    w.append_many(entries)
    w.rollover()
    w.close(seal=False)  # the newest ledger stays open (never offloaded), as on a live broker
    lid = ledgers_all(ws, topic)[0].ledgerId
    res = ws.topic_offloader(clock_ms=lambda: END_MS).offload_ledgers(topic, [lid])
    assert [r.outcome for r in res] == ["offloaded"]
    return lid


def ledgers_all(ws, topic):
    info, _ = ws.ml.get_topic(topic)
    return list(info.ledgerInfo)


def test_damage_the_hot_copy_holds_too_is_beyond_repair(make_ws):
    """A message damaged before the offload (the broker stored it so): both copies hold the same bytes,
    so the scrub reports data loss and tries no repair."""
    ws = offloaded(make_ws, ledgers=1)
    entries = pulsar_objects.message_entries(20)
    entries[6] = entries[6][:-1] + bytes([entries[6][-1] ^ 0x10])
    topic = "persistent://t/a/damaged-at-the-broker"
    lid = _write_topic(ws, topic, entries)
    before = context_uuid(ledgers(ws, topic)[0])
    rows, summary = scrub(ws, repair=True)
    r = rows[lid]
    assert r.outcome == "unrecoverable" and ws.hot.exists(lid)
    assert f"{lid}:6 (CRC32C mismatch" in r.error and "the hot copy holds the same bytes" in r.error
    assert "no copy can repair them" in r.error
    assert context_uuid(ledgers(ws, topic)[0]) == before and DeletionLog(ws.metadata).pending() == []
    assert summary.namespaces["t/a"]["counters"]["messages_damaged"] == 1


def test_opaque_entries_are_counted_as_not_messages_never_as_damage(make_ws):
    """Entries that are not Pulsar messages (`generate --raw`; and opaque bytes that begin with the
    checksum magic, whose CRC fails like a damaged message's would) fail nothing, with or without a hot
    copy: the ledger decides they are not messages."""
    ws = offloaded(make_ws, messages=False, ledgers=2)
    rng = random.Random(3)
    magic = [b"\x0e\x01" + rng.randbytes(rng.randrange(10, 400)) for _ in range(25)]
    topic = "persistent://t/a/opaque-with-magic"
    lid = _write_topic(ws, topic, magic)
    for li in (ledgers(ws, topic)[0], ledgers(ws)[0]):
        ws.hot.delete_ledger(li.ledgerId)  # no hot CRCs: the copies stand alone
    rows, summary = scrub(ws, repair=True)
    assert {r.outcome for r in rows.values()} == {"ok"} and len(rows) == 3
    assert rows[lid].not_messages == 25 and rows[lid].messages_damaged == 0
    c = summary.namespaces["t/a"]["counters"]
    assert c["messages_damaged"] == 0 and c["messages_checked"] == 0 and c["not_messages"] == 2 * ENTRIES + 25
    # and the lag proof of an opaque copy without a hot copy holds too
    res = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, AS_OF + 1)])]
    assert [r.outcome for r in res] == ["marked"] * 3


def test_objects_with_chunk_checksums_are_checked_by_them_and_by_their_messages_on_request(make_ws):
    """The project's own objects: the deep scrub leaves their messages to the chunk checksums and hot
    CRCs (cost: bench/scrub_messages.py) unless asked (messages = all); a damaged message is caught by
    the checksums as before."""
    ws = offloaded(make_ws, layout=None, ledgers=2)
    rows, summary = scrub(ws)
    assert {r.outcome for r in rows.values()} == {"ok"} and "counters" not in summary.namespaces["t/a"]
    assert all(r.messages_checked == 0 for r in rows.values())
    rows, summary = scrub(ws, messages="all")
    assert all(r.outcome == "ok" and r.messages_checked == ENTRIES for r in rows.values())
    assert summary.namespaces["t/a"]["counters"]["messages_checked"] == 2 * ENTRIES
    victim = ledgers(ws)[0]
    damage(ws, victim, 2)
    drop_hot(ws, victim)
    rows, _ = scrub(ws, messages="all")
    r = rows[victim.ledgerId]
    assert r.outcome == "unrecoverable" and "checksum" in r.error and "damaged message" not in r.error


def test_the_lag_proof_without_a_hot_copy_rests_on_the_messages(make_ws):
    """The deletion-lag cleanup of a ledger whose hot copy is already gone: a copy without chunk
    checksums is proven by its messages' CRCs; a damaged message fails the proof, named."""
    ws = offloaded(make_ws)
    a, b, c = ledgers(ws)
    for li in (a, b):
        ws.hot.delete_ledger(li.ledgerId)  # gone from the hot tier, the record not marked yet
    damage(ws, b, 17)
    res = {r.ledger: r for r in (LedgerResult(**x) for x in run_work(
        ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, END_MS + HOUR + 1)]))}
    assert res[a.ledgerId].outcome == "marked" and res[c.ledgerId].outcome == "marked"
    bad = res[b.ledgerId]
    assert bad.outcome == "verify-failed" and bad.failed
    assert f"{b.ledgerId}:17 (CRC32C mismatch" in bad.error and "no hot copy either" in bad.error
    assert not find_ledger(ws.ml.get_topic(T)[0], b.ledgerId).offloadContext.bookkeeperDeleted


def test_the_lag_proof_compares_a_copy_without_checksums_with_the_hot_copy(make_ws):
    """A ledger-mode (V1) copy as Pulsar writes it (no chunk checksums; opaque entries, so no message CRC
    either) that differs from the hot copy in one byte: only the comparison with the hot copy's CRCs can
    see it. The cleanup must fail the proof and keep the hot copy (a planted bug that skipped that
    comparison for V1 copies survived 131 tests: the project's own copies are caught by their chunk
    checksums first)."""
    ws = offloaded(make_ws, messages=False, ledgers=2)
    a, b = ledgers(ws)
    damage(ws, b, 11)  # a flipped bit inside entry 11's bytes: frames, blocks and index still hold
    res = {r.ledger: r for r in (LedgerResult(**x) for x in run_work(
        ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, END_MS + HOUR + 1)]))}
    assert res[a.ledgerId].outcome == "marked"
    bad = res[b.ledgerId]
    assert bad.outcome == "verify-failed" and "hot copy kept" in bad.error, bad
    li = find_ledger(ws.ml.get_topic(T)[0], b.ledgerId)
    assert not li.offloadContext.bookkeeperDeleted
    assert ws.hot.open_ledger(b.ledgerId).read(11, 11)  # the hot copy is still there
