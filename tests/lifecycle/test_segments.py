"""The lifecycle over ledgers held by PIP-76 streaming segments, on real workspaces and real streaming
offloads: offload selection and the deletion lag (with its proof read back from the segments),
retention and topic deletion (segment records, shared segments kept until their last ledger goes),
orphan reconciliation of segment objects, and the scrub."""

from __future__ import annotations

import os
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from tests.support.workspaces import END_MS, sealed, stream
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.location import parse_store_url
from tieredcore.formats.keys import segment_data_key, segment_index_key
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.planner import ManualOffload, deletion_lag_due
from tieredcore.lifecycle.reconcile.orphans import find_hot_orphans
from tieredcore.lifecycle.reconcile.run import reconcile, store_locations
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_offload
from tieredcore.lifecycle.work import KIND_OFFLOAD, LedgerResult, TopicWork
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.context import covered_through, is_complete, is_offloaded, segment_pieces
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentOffloader, SegmentSource
from tieredcore.policy import HOT_FIRST, TIERED_FIRST
from tieredcore.topic.writer import TopicWriter

HOUR = 3600 * 1000
T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"


# -- helpers --------------------------------------------------------------------------------------


def set_ns(ws, ns="t/a", **fields):
    return ws.policies.set_namespace(ns, fields)


def ledger_infos(ws, topic=T):
    info, _ = ws.ml.get_topic(topic)
    return list(info.ledgerInfo)


def run(ws, plan):
    return [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan])]


def pending(ws, typ=None):
    return sorted((e.record for e in DeletionLog(ws.metadata).pending() if typ is None or e.record.type == typ),
                  key=lambda r: (r.type, r.ledger_id, r.uuid))


def drain_ok(ws, as_of) -> dict:
    """Phase 2: every due record processed, none left, nothing failed or refused."""
    rep = drain(ws, as_of)
    assert rep.retrying == rep.dead_lettered == rep.refused_mismatch == rep.refused_foreign == rep.malformed == 0, \
        rep.rows
    assert DeletionLog(ws.metadata).pending() == []
    return rep.counts()


def read_all(ws, topic=T, priority=TIERED_FIRST):
    r = ws.reader(priority)
    try:
        return [(str(p), d) for p, d in r.read(topic)]
    finally:
        r.close()


def object_keys(store) -> set[str]:
    return {o.key for o in iter_objects(store) if "tiered-owner." not in o.key
            and "tiered-topic-manifests/" not in o.key}


def seg_keys(u: str, prefix: str = "") -> set[str]:
    return {segment_data_key(prefix, u), segment_index_key(prefix, u)}


def flip(store, key: str, pos: int) -> None:
    md, data = store.head(key).metadata, bytearray(store.get(key))
    data[pos] ^= 0x20
    store.put(key, bytes(data), md)


def first_block(ws, uuid: str, lid: int) -> int:
    index, _, _ = SegmentOffloader(ws.offloader).open_index(uuid)
    return index.section(lid).index_entries[0].offset


def streamed_open_ledger(ws, early: int, late: int, t1: int, t2: int) -> int:
    """Append `early` entries to a new open ledger, stream them at `t1`, append `late` more, seal it and
    stream the rest at `t2`: a sealed ledger whose segments completed at two times. Its id."""
    w = TopicWriter(ws.ml, ws.hot, T, clock_ms=lambda: t1)
    try:
        lid = w.append_many([b"early-%d-" % i * 20 for i in range(early)])[0].ledger_id
        stream(ws, T, as_of=t1)
        w.append_many([b"late-%d-" % i * 20 for i in range(late)])
        w.rollover()
    finally:
        w.close(seal=False)
    if t2:
        stream(ws, T, as_of=t2)
    return lid


@pytest.fixture
def ws(make_ws):
    """4 sealed ledgers of 50 entries of ~1 KiB: 64 KiB segments hold one ledger each, 16 KiB ones a
    quarter of a ledger, 256 KiB ones all four."""
    return make_ws(["t/a"], entries=50, entry_size="1000-1100")


# -- offload selection ----------------------------------------------------------------------------


def test_segment_held_ledgers_are_not_offloaded_again_in_ledger_mode(ws):
    set_ns(ws, offload_threshold_bytes=0)
    ids = sealed(ws, T)
    assert [w.ledgers for w in plan_offload(ws, None, END_MS)] == [ids]
    stream(ws, T, max_segment_size=16 * 1024)
    assert all(is_offloaded(li) and not is_complete(li) for li in ledger_infos(ws)[:-1])
    assert plan_offload(ws, None, END_MS) == []
    infos = ledger_infos(ws)
    assert ManualOffload(up_to=Position(infos[-1].ledgerId, 0)).select(infos) == []
    assert ManualOffload(keep_bytes=0).select(infos) == []
    # and asked anyway, the ledger-mode protocol skips them: no V1 object is written
    before = object_keys(ws.store)
    res = run(ws, [TopicWork(T, KIND_OFFLOAD, ids, END_MS)])
    assert [r.outcome for r in res] == ["skipped"] * 4
    assert object_keys(ws.store) == before and not any(is_complete(li) for li in ledger_infos(ws))


def test_a_sealed_ledger_only_partly_in_segments_is_still_offloaded(make_ws):
    ws = make_ws(["t/a"], ledgers=2, entries=10)
    set_ns(ws, offload_threshold_bytes=0)
    lid = streamed_open_ledger(ws, 30, 10, END_MS + 1, 0)
    li = ledger_infos(ws)[-2]
    assert li.ledgerId == lid and covered_through(li) == 29 and li.entries == 40 and not is_offloaded(li)
    assert [w.ledgers for w in plan_offload(ws, None, END_MS + 2)] == [[lid]]


# -- the deletion lag -----------------------------------------------------------------------------


def test_deletion_lag_counts_from_the_last_covering_segment(make_ws):
    ws = make_ws(["t/a"], ledgers=2, entries=10)
    set_ns(ws, deletion_lag_ms=HOUR)
    t1, t2 = END_MS + 1000, END_MS + 2 * HOUR
    lid = streamed_open_ledger(ws, 30, 10, t1, t2)
    li = ledger_infos(ws)[-2]
    assert is_offloaded(li) and len(segment_pieces(li)) == 2
    assert not deletion_lag_due(li, HOUR, t1 + HOUR + 1)  # only the first segment is that old
    assert not deletion_lag_due(li, HOUR, t2 + HOUR)  # exactly the lag: not yet
    assert deletion_lag_due(li, HOUR, t2 + HOUR + 1)
    assert lid not in [x for w in plan_lag_cleanup(ws, None, t2 + HOUR) for x in w.ledgers]
    assert lid in [x for w in plan_lag_cleanup(ws, None, t2 + HOUR + 1) for x in w.ledgers]
    # the generated ledgers were streamed at t1: due one lag after it
    assert [w.ledgers for w in plan_lag_cleanup(ws, None, t1 + HOUR + 1)] == [sealed(ws, T)[:2]]


@pytest.mark.parametrize("max_segment_size", [16 * 1024, 256 * 1024], ids=["ledger-over-segments",
                                                                           "ledgers-share-a-segment"])
def test_cleanup_proves_the_segments_then_marks_and_the_drain_deletes_the_hot_copies(ws, max_segment_size):
    set_ns(ws, deletion_lag_ms=HOUR)
    ids = sealed(ws, T)
    before = read_all(ws, priority=HOT_FIRST)
    stream(ws, T, max_segment_size=max_segment_size)
    as_of = END_MS + HOUR + 1
    plan = plan_lag_cleanup(ws, None, as_of)
    assert [w.ledgers for w in plan] == [ids]
    dry = run(ws, [TopicWork(w.topic, w.kind, w.ledgers, as_of, dry_run=True) for w in plan])
    assert [r.outcome for r in dry] == ["planned"] * 4 and pending(ws) == []

    res = run(ws, plan)
    assert [(r.ledger, r.outcome) for r in res] == [(i, "marked") for i in ids], res
    lis = ledger_infos(ws)
    assert [r.uuid for r in res] == [",".join(p.uuid for p in segment_pieces(li)) for li in lis[:-1]]
    assert all(r.entries == 50 and r.bytes == li.size for r, li in zip(res, lis, strict=False))
    assert [(r.ledger_id, r.reason) for r in pending(ws)] == [(i, "deletion-lag") for i in ids]
    assert [li.offloadContext.bookkeeperDeleted for li in lis] == [True] * 4 + [False]
    assert all(ws.hot.exists(i) for i in ids)
    for priority in (TIERED_FIRST, HOT_FIRST):  # readers already use the segments
        assert read_all(ws, priority=priority) == before

    counts = drain_ok(ws, as_of)
    assert counts["deleted"] == 4 and counts["still_in_use"] == 0
    assert not any(ws.hot.exists(i) for i in ids)
    for priority in (TIERED_FIRST, HOT_FIRST):
        assert read_all(ws, priority=priority) == before
    assert plan_lag_cleanup(ws, None, as_of) == []


@pytest.mark.parametrize("how", ["payload-byte", "payload-byte-no-checksums", "segment-lost", "foreign-ledger",
                                 "size-mismatch"])
def test_cleanup_never_deletes_a_hot_copy_whose_segments_fail_the_proof(make_ws, how):
    """The proof is every frame read back from the segments against the hot tier's CRCs (chunk
    checksums too, when the segment has them), never a count."""
    no_checksums = how in ("payload-byte-no-checksums", "foreign-ledger")  # only the walk itself can tell
    ws = make_ws(["t/a"], entries=50, entry_size="1000-1100",
                 config_overrides={"checksum_chunk": 0} if no_checksums else None)
    set_ns(ws, deletion_lag_ms=HOUR)
    ids = sealed(ws, T)
    stream(ws, T, max_segment_size=64 * 1024)  # one segment per ledger
    victim = ledger_infos(ws)[1]
    (piece,) = segment_pieces(victim)
    dkey = segment_data_key("", piece.uuid)
    if how.startswith("payload-byte"):
        flip(ws.store, dkey, first_block(ws, piece.uuid, victim.ledgerId) + 128 + 12 + 50)  # entry 0's payload
    elif how == "segment-lost":
        ws.store.delete([dkey])
    elif how == "size-mismatch":  # the topic's record and the segment disagree on the ledger's size

        def grow(info):
            find_ledger(info, victim.ledgerId).size += 1
            return True

        ws.ml.update_topic(T, grow)
    else:  # the block headers name another ledger (the bytes are otherwise intact)
        data, md = bytearray(ws.store.get(dkey)), ws.store.head(dkey).metadata
        index, _, _ = SegmentOffloader(ws.offloader).open_index(piece.uuid)
        for e in index.section(victim.ledgerId).index_entries:
            data[e.offset + 28: e.offset + 36] = (999).to_bytes(8, "big")
        ws.store.put(dkey, bytes(data), md)
    if how == "payload-byte-no-checksums":  # a reader cannot tell (no chunk checksums): the hot CRCs can
        assert read_all(ws) != read_all(ws, priority=HOT_FIRST)

    as_of = END_MS + HOUR + 1
    res = {r.ledger: r for r in run(ws, plan_lag_cleanup(ws, None, as_of))}
    bad = res[victim.ledgerId]
    assert bad.outcome == "verify-failed" and bad.failed and "hot copy kept" in bad.error, bad
    assert piece.uuid in bad.error
    expected_error = {"payload-byte": "CorruptObjectError", "payload-byte-no-checksums": "differs from the hot copy",
                      "segment-lost": "OffloadedLedgerNotFoundError", "foreign-ledger": "ledger 999",
                      "size-mismatch": "the topic's metadata says"}[how]
    assert expected_error in bad.error
    assert [res[i].outcome for i in ids if i != victim.ledgerId] == ["marked"] * 3
    assert not ledger_infos(ws)[1].offloadContext.bookkeeperDeleted
    assert [r.ledger_id for r in pending(ws, "ledger")] == [i for i in ids if i != victim.ledgerId]
    drain_ok(ws, as_of)
    assert [ws.hot.exists(i) for i in ids] == [False, True, False, False]
    assert len(read_all(ws, priority=HOT_FIRST)) == 200


# -- retention and topic deletion -----------------------------------------------------------------


def test_retention_sends_segments_to_the_log_and_a_shared_segment_goes_with_its_last_ledger(ws):
    """96 KiB segments: S1 = ledger 0 + the start of ledger 1, S2 = the rest of ledger 1 + (part of)
    ledger 2, ... Trimming ledger 0 keeps S1 (ledger 1 still reads from it); trimming ledger 1
    then deletes S1 and keeps S2."""
    ids = sealed(ws, T)
    stream(ws, T, max_segment_size=96 * 1024)
    lis = ledger_infos(ws)
    pieces = {li.ledgerId: [p.uuid for p in segment_pieces(li)] for li in lis[:-1]}
    s1, s2 = pieces[ids[1]]
    assert pieces[ids[0]] == [s1] and pieces[ids[2]][0] == s2
    expected = read_all(ws, priority=HOT_FIRST)
    set_ns(ws, retention_time_minutes=25)

    from tieredcore.lifecycle.retention import trim_topic

    rows = trim_topic(ws, T, END_MS)  # ledger 0 is 30 min old, ledger 1 20 min
    assert [(r.ledger, r.outcome) for r in rows] == [(ids[0], "trimmed")]
    assert [(r.type, r.ledger_id, r.uuid, r.reason) for r in pending(ws)] == [
        ("ledger", ids[0], "", "retention"), ("segment", ids[0], s1, "retention")]
    assert pending(ws, "segment")[0].driver["name"] == "tiered-local"
    counts = drain_ok(ws, END_MS)
    assert counts["deleted"] == 1 and counts["still_in_use"] == 1  # the hot copy; S1 is ledger 1's too
    assert not ws.hot.exists(ids[0]) and seg_keys(s1) <= object_keys(ws.store)
    for h in ids[1:]:
        ws.hot.delete_ledger(h)  # ledger 1 must now read from S1 and S2
    assert read_all(ws) == expected[50:]

    rows = trim_topic(ws, T, END_MS + 10 * 60_000)
    assert [(r.ledger, r.outcome) for r in rows] == [(ids[1], "trimmed")]
    assert {(r.type, r.uuid) for r in pending(ws, "segment")} == {("segment", s1), ("segment", s2)}
    counts = drain_ok(ws, END_MS + 10 * 60_000)
    assert counts["deleted"] == 1 and counts["still_in_use"] == 1  # S1 deleted; S2 still ledger 2's
    assert counts["already_deleted"] == 1  # ledger 1's hot copy
    keys = object_keys(ws.store)
    assert not seg_keys(s1) & keys and seg_keys(s2) <= keys
    assert read_all(ws) == expected[100:]


def test_topic_deletion_sends_every_segment_to_the_log_and_the_drain_deletes_them(make_ws):
    ws = make_ws(["t/a"], ledgers=3, entries=10)
    w = TopicWriter(ws.ml, ws.hot, T, clock_ms=lambda: END_MS + 1)
    try:
        w.append_many([b"open-%d" % i for i in range(5)])  # the open ledger, streamed up to entry 4
        stream(ws, T, max_segment_size=16 * 1024, as_of=END_MS + 2)
    finally:
        w.close(seal=False)
    uuids = {p.uuid for li in ledger_infos(ws) for p in segment_pieces(li)}
    assert len(uuids) == 2 and covered_through(ledger_infos(ws)[-1]) == 4
    from tieredcore.lifecycle.retention import delete_topic

    res = delete_topic(ws, T, END_MS + 3)
    assert res.deleted and res.records == {"ledger": 4, "offloaded": 0, "segment": 4}
    assert {r.uuid for r in pending(ws, "segment")} == uuids
    counts = drain_ok(ws, END_MS + 3)
    assert counts["deleted"] == 8
    assert object_keys(ws.store) == set() and ws.hot.list_ledgers() == []


# -- orphan reconciliation ------------------------------------------------------------------------


GRACE = HOUR


def age_keys(ws, keys, ms: int) -> None:
    """Last-modified time of objects of the filesystem store (and their metadata sidecars)."""
    root = Path(ws.store.root)
    for k in keys:
        for p in (root / k, root / ".tiered" / "meta" / k):
            if p.exists():
                os.utime(p, ns=(ms * 1_000_000, ms * 1_000_000))


def write_segment(ws, seg: SegmentOffloader, lid: int, u: str) -> None:
    h = ws.hot.open_ledger(lid)
    try:
        seg.write([SegmentSource(h, 0, h.last_add_confirmed)], u, {"managedledgername": ML})
    finally:
        h.close()


def test_reconcile_records_unreferenced_segments_and_never_referenced_ones(make_ws):
    ws = make_ws(["t/a"], ledgers=3, entries=10)
    stream(ws, T, max_segment_size=16 * 1024)
    referenced = {p.uuid for li in ledger_infos(ws) for p in segment_pieces(li)}
    assert len(referenced) == 2
    lid = sealed(ws, T)[0]
    seg = SegmentOffloader(ws.offloader, block_size=8192, min_part_size=0)
    assigned, orphan, young, foreign = (str(uuidlib.uuid4()) for _ in range(4))
    for u in (assigned, orphan, young):
        write_segment(ws, seg, lid, u)
    write_segment(ws, SegmentOffloader(LedgerOffloader(ws.store, cluster="east"), block_size=8192, min_part_size=0),
                  lid, foreign)  # another cluster sharing the store: never ours to delete
    msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(assigned))

    def assign(info):  # an upload in flight (or abandoned by a crash): assigned, not complete
        s = info.ledgerInfo[-1].offloadContext.offloadSegment.add(uidMsb=msb, uidLsb=lsb, complete=False)
        s.endEntryId = 0
        return True

    ws.ml.update_topic(T, assign)
    stale_upload = segment_data_key("", str(uuidlib.uuid4()))
    ws.store.initiate_multipart(stale_upload)  # a segment upload nobody completed

    as_of = max(int(time.time() * 1000), END_MS) + 3 * GRACE
    age_keys(ws, object_keys(ws.store), as_of - 2 * GRACE)
    age_keys(ws, seg_keys(young), as_of - GRACE // 2)
    rep = reconcile(ws, as_of, GRACE)
    assert rep.errors == []
    assert [(r.type, r.uuid, r.topic, r.ledger_id, r.reason) for r in pending(ws)] == [
        ("segment", orphan, ML, 0, "orphan")]
    pending(ws)[0].validate()
    assert (rep.orphan_groups, rep.orphan_segments, rep.orphan_objects) == (1, 1, 2)
    assert rep.orphan_bytes == sum(ws.store.head(k).size for k in seg_keys(orphan))
    assert rep.by_namespace["t/a"]["segment"]["count"] == 1
    assert rep.young_unreferenced == 2 and rep.foreign_cluster_groups == 1
    assert rep.segment_keys == 2 * (len(referenced) + 4) and rep.foreign_keys == 0
    assert (rep.stale_uploads, rep.uploads_aborted, rep.foreign_uploads) == (1, 1, 0)
    assert ws.store.list_multipart_uploads() == []

    counts = drain_ok(ws, as_of)
    assert counts["deleted"] == 1
    keys = object_keys(ws.store)
    assert not seg_keys(orphan) & keys
    assert all(seg_keys(u) <= keys for u in (*referenced, assigned, young, foreign))
    assert reconcile(ws, as_of, GRACE).orphan_groups == 0


def test_reconcile_lists_the_stores_only_segments_name(make_ws, tmp_path):
    ws = make_ws(["t/a"], ledgers=2, entries=10)
    other = ws.offloader_at(parse_store_url(f"file://{tmp_path / 'elsewhere'}?prefix=seg"))
    stream(ws, T, offloader=other)  # no policy names that store: only the segments' driver metadata
    assert other.location.label in {loc.where.label for loc in store_locations(ws)}
    u = str(uuidlib.uuid4())
    write_segment(ws, SegmentOffloader(other, block_size=8192, min_part_size=0), sealed(ws, T)[0], u)
    as_of = max(int(time.time() * 1000), END_MS) + 3 * GRACE
    rep = reconcile(ws, as_of, GRACE)
    assert rep.errors == [] and other.location.label in rep.locations
    (rec,) = pending(ws)
    assert (rec.type, rec.uuid, rec.driver["properties"]["prefix"]) == ("segment", u, "seg/")
    drain_ok(ws, as_of)
    assert not seg_keys(u, "seg/") & object_keys(other.store)


def test_a_marked_segment_held_ledger_whose_hot_copy_was_left_behind_is_a_hot_orphan(ws):
    stream(ws, T)
    lid = sealed(ws, T)[0]

    def mark(info):  # bookkeeperDeleted recorded, the hot copy's record lost (an older version's crash)
        find_ledger(info, lid).offloadContext.bookkeeperDeleted = True
        return True

    ws.ml.update_topic(T, mark)
    h = find_hot_orphans(ws, END_MS + 100 * HOUR, GRACE)
    assert [(o.ledger_id, o.reason) for o in h.orphans] == [(lid, "bookkeeper-deleted")]


# -- scrub ----------------------------------------------------------------------------------------


def scrub(ws, *, deep=False, repair=False) -> dict[int, LedgerResult]:
    work = plan_scrub(ws, None, END_MS + HOUR, deep=deep, repair=repair)
    return {r.ledger: r for r in run(ws, work)}


def test_scrub_checks_segment_held_ledgers_and_a_streamed_prefix(make_ws):
    ws = make_ws(["t/a"], ledgers=3, entries=50, entry_size="1000-1100")
    w = TopicWriter(ws.ml, ws.hot, T, clock_ms=lambda: END_MS + 1)
    try:
        w.append_many([b"open-%d-" % i * 100 for i in range(20)])
        stream(ws, T, max_segment_size=16 * 1024, as_of=END_MS + 2)  # the open ledger up to entry 19
        lis = ledger_infos(ws)
        assert covered_through(lis[-1]) == 19 and not is_offloaded(lis[-1])
        shallow = scrub(ws)
        assert sorted(shallow) == [li.ledgerId for li in lis]
        assert {r.outcome for r in shallow.values()} == {"ok"}, shallow
        for li in lis:
            r = shallow[li.ledgerId]
            assert r.uuid == ",".join(p.uuid for p in segment_pieces(li)) and r.bytes > 0
        assert [shallow[li.ledgerId].entries for li in lis] == [50, 50, 50, 20]
        deep = scrub(ws, deep=True)
        assert {r.outcome for r in deep.values()} == {"ok"}
        assert all(deep[x].bytes > shallow[x].bytes and deep[x].blocks >= 1 for x in deep)
    finally:
        w.close(seal=False)


def test_scrub_reports_damaged_segments_repairs_them_from_the_hot_copies_and_reports_data_loss(make_ws):
    """Without repair: damage reported, nothing changed. With repair: each damaged segment rewritten from
    the hot copies (the damaged objects to the deletion log); a segment whose ledger has no hot copy left
    is data loss, reported and never deleted."""
    ws = make_ws(["t/a"], entries=50, entry_size="1000-1100", config_overrides={"checksum_chunk": 0})
    stream(ws, T, max_segment_size=64 * 1024)  # one segment per ledger
    lis = ledger_infos(ws)
    lost, flipped, gone_hot = lis[0], lis[1], lis[2]
    (p_lost,), (p_flipped,), (p_gone,) = (segment_pieces(li) for li in (lost, flipped, gone_hot))
    expected = read_all(ws, priority=HOT_FIRST)
    ws.store.delete([segment_index_key("", p_lost.uuid)])
    flip(ws.store, segment_data_key("", p_flipped.uuid), first_block(ws, p_flipped.uuid, flipped.ledgerId) + 200)
    ws.hot.delete_ledger(gone_hot.ledgerId)
    before = object_keys(ws.store)

    shallow = scrub(ws)  # a lost index shows; flipped payload bytes (no chunk checksums) do not
    assert shallow[lost.ledgerId].outcome == "damaged" and "OffloadedLedgerNotFoundError" in shallow[lost.ledgerId].error
    assert [shallow[li.ledgerId].outcome for li in (flipped, gone_hot, lis[3])] == ["ok"] * 3
    deep = scrub(ws, deep=True)
    assert deep[lost.ledgerId].outcome == "damaged" and "repair it: --repair" in deep[lost.ledgerId].error
    assert deep[flipped.ledgerId].outcome == "damaged" and "differs from the hot copy" in deep[flipped.ledgerId].error
    r = deep[gone_hot.ledgerId]  # read back whole (no hot copy to compare with)
    assert r.outcome == "ok" and r.blocks >= 1 and r.bytes > shallow[gone_hot.ledgerId].bytes
    assert deep[lis[3].ledgerId].outcome == "ok"
    assert object_keys(ws.store) == before and DeletionLog(ws.metadata).pending() == []

    repaired = scrub(ws, deep=True, repair=True)
    for li in (lost, flipped):
        assert repaired[li.ledgerId].outcome == "repaired", repaired[li.ledgerId]
        assert "rewritten from the hot copies of ledger(s)" in repaired[li.ledgerId].error
    assert {r.uuid for r in pending(ws)} == {p_lost.uuid, p_flipped.uuid}
    assert {r.reason for r in pending(ws)} == {"scrub-repair"}
    assert {r.outcome for r in scrub(ws, deep=True).values()} == {"ok"}
    assert read_all(ws, priority=TIERED_FIRST)[:100] == expected[:100]  # the two repaired ledgers' entries

    ws.store.delete([segment_data_key("", p_gone.uuid)])
    r = scrub(ws, repair=True)[gone_hot.ledgerId]
    assert r.outcome == "unrecoverable" and r.failed and r.error.startswith("DATA LOSS")
    assert p_gone.uuid not in {x.uuid for x in pending(ws)}  # reported, never deleted
    assert segment_index_key("", p_gone.uuid) in object_keys(ws.store)


# -- segment repair -------------------------------------------------------------------------------


def test_a_damaged_segment_is_rewritten_from_the_hot_copies_of_every_ledger_it_holds(make_ws):
    """Segments spanning ledgers (small segments: a ledger spans several, a segment holds the end of one
    and the start of the next): one damaged segment is rewritten, with every ledger it shares objects
    with, into new segment(s) from the hot copies; the damaged objects (and the replaced ones) go to the
    deletion log; every entry reads back from the object store alone; the drain then removes them."""
    from tieredcore.lifecycle.compaction import repair_segments

    ws = make_ws(["t/a"], ledgers=3, entries=30, entry_size="1000-1100", config_overrides={"checksum_chunk": 0})
    stream(ws, T, max_segment_size=20 * 1024)
    lis = ledger_infos(ws)
    sealed_lis = [li for li in lis if li.HasField("entries") and li.entries > 0][:3]
    victim = segment_pieces(sealed_lis[1])[0]
    flip(ws.store, segment_data_key("", victim.uuid), first_block(ws, victim.uuid, sealed_lis[1].ledgerId) + 300)
    expected = read_all(ws, priority=HOT_FIRST)
    pol = ws.policies.for_topic(T)
    res = repair_segments(ws, pol, TopicName.parse(T), {victim.uuid}, clock_ms=lambda: END_MS + HOUR)
    assert not isinstance(res, str) and res.outcome == "compacted", res
    # the damaged segment holds the end of ledger 0 and the start of ledger 1: both, with all their segments
    assert victim.uuid in {p.uuid for p in segment_pieces(sealed_lis[0])}
    assert res.ledgers == [sealed_lis[0].ledgerId, sealed_lis[1].ledgerId] and res.units >= 3
    after = ledger_infos(ws)
    refs = {p.uuid for li in after for p in segment_pieces(li)}
    assert victim.uuid not in refs and set(res.segments) <= refs
    for li in after:
        if li.ledgerId in res.ledgers:
            assert li.offloadContext.bookkeeperDeleted is False
    assert read_all(ws, priority=TIERED_FIRST) == expected
    recorded = {r.uuid for r in pending(ws)}
    assert victim.uuid in recorded and all(r.reason == "scrub-repair" for r in pending(ws))
    deep = scrub(ws, deep=True)
    assert {r.outcome for r in deep.values()} == {"ok"}, deep
    drain_ok(ws, END_MS + 30 * 24 * HOUR)
    assert not any(victim.uuid in k for k in object_keys(ws.store))
    assert read_all(ws, priority=TIERED_FIRST) == expected


def test_a_segment_repair_needs_every_hot_copy_and_sealed_ledgers(make_ws):
    """Without a hot copy of a ledger the damaged segment holds, or with the open ledger in it, nothing is
    written: the reason names the ledgers."""
    from tieredcore.lifecycle.compaction import repair_segments

    ws = make_ws(["t/a"], ledgers=2, entries=30, entry_size="1000-1100")
    w = TopicWriter(ws.ml, ws.hot, T, clock_ms=lambda: END_MS + 1)
    try:
        w.append_many([b"open-%d-" % i * 100 for i in range(20)])
        stream(ws, T, max_segment_size=512 * 1024, as_of=END_MS + 2)
    finally:
        w.close(seal=False)
    lis = ledger_infos(ws)
    before, keys = [segment_pieces(li) for li in lis], object_keys(ws.store)
    pol = ws.policies.for_topic(T)
    open_seg = segment_pieces(lis[-1])[0].uuid
    why = repair_segments(ws, pol, TopicName.parse(T), {open_seg}, clock_ms=lambda: END_MS + HOUR)
    assert isinstance(why, str) and "not sealed" in why and str(lis[-1].ledgerId) in why
    first = segment_pieces(lis[0])[0].uuid
    if first != open_seg:
        ws.hot.delete_ledger(lis[0].ledgerId)
        why = repair_segments(ws, pol, TopicName.parse(T), {first}, clock_ms=lambda: END_MS + HOUR)
        assert isinstance(why, str) and f"no hot copy of ledger(s) {lis[0].ledgerId}" in why, why
    assert [segment_pieces(li) for li in ledger_infos(ws)] == before and object_keys(ws.store) == keys
    assert pending(ws) == []
