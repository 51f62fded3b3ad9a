"""The topic reader across hot, V1 objects and PIP-76 segments: a ledger held by completed segments reads
from them (tiered-storage-first) or from its hot copy first (bookkeeper-first), with the same fallback
to the other copy as a V1 copy; a ledger only partly streamed (the open ledger) reads hot first and
falls back to its segments for the entries they hold. Real workspaces, real streaming offloads."""

from __future__ import annotations

import pytest

from tests.support.workspaces import END_MS, sealed, stream
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.location import parse_store_url
from tieredcore.errors import CorruptEntryError, OffloadedLedgerNotFoundError
from tieredcore.formats.keys import segment_data_key, segment_index_key
from tieredcore.model import Position
from tieredcore.offload.context import covered_through, is_complete, is_offloaded, segment_pieces
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.policy import HOT_FIRST, TIERED_FIRST
from tieredcore.topic.writer import TopicWriter

T = "persistent://t/a/topic-0000"


@pytest.fixture
def ws(make_ws):
    """4 sealed ledgers of 50 entries of ~1 KiB (about 7 streaming blocks of 8 KiB each)."""
    return make_ws(["t/a"], entries=50, entry_size="1000-1100")


def ledgers(ws):
    info, _ = ws.ml.get_topic(T)
    return list(info.ledgerInfo)


def read(ws, priority=TIERED_FIRST):
    r = ws.reader(priority)
    r.batch_entries = 7  # several batches per ledger: a failure mid-ledger continues mid-ledger
    try:
        return [(str(p), d) for p, d in r.read(T)], r
    finally:
        r.close()


def flip(store, key: str, pos: int) -> None:
    md, data = store.head(key).metadata, bytearray(store.get(key))
    data[pos] ^= 0x20
    store.put(key, bytes(data), md)


def block_offset(ws, uuid: str, lid: int, block: int = -1) -> int:
    index, _, _ = SegmentOffloader(ws.offloader).open_index(uuid)
    return index.section(lid).index_entries[block].offset


@pytest.mark.parametrize("max_segment_size", [16 * 1024, 256 * 1024], ids=["ledger-over-segments",
                                                                           "ledgers-share-a-segment"])
def test_segment_held_ledgers_read_from_their_segments(ws, max_segment_size):
    expected, _ = read(ws, HOT_FIRST)
    assert len(expected) == 200
    res = stream(ws, T, max_segment_size=max_segment_size)
    lis = ledgers(ws)[:-1]
    assert all(is_offloaded(li) and not is_complete(li) for li in lis)
    if max_segment_size == 16 * 1024:
        assert all(len(segment_pieces(li)) > 1 for li in lis)
    else:
        assert len(res) == 1 and len(res[0].ledgers) == 4

    got, r = read(ws)  # tiered-storage-first: the sealed ledgers from their segments
    assert got == expected and r.tier_reads == {"hot": 1, "offloaded": 4} and r.fallbacks == 0
    got, r = read(ws, HOT_FIRST)
    assert got == expected and r.tier_reads == {"hot": 5, "offloaded": 0}

    # the segments really are read: with every sealed hot copy gone (no bookkeeperDeleted recorded)
    for lid in sealed(ws, T):
        ws.hot.delete_ledger(lid)
    got, r = read(ws)
    assert got == expected and r.fallbacks == 0
    got, r = read(ws, HOT_FIRST)  # bookkeeper-first falls back to the segments, ledger by ledger
    assert got == expected and r.fallbacks == 4 and r.tier_reads == {"hot": 1, "offloaded": 4}
    assert all("HotLedgerNotFoundError" in n and "reading the offloaded copy" in n for n in r.fallback_notes)


def test_a_damaged_segment_mid_ledger_continues_on_the_hot_copy_from_the_same_entry(ws):
    expected, _ = read(ws, HOT_FIRST)
    stream(ws, T, max_segment_size=64 * 1024)
    li = ledgers(ws)[1]
    (piece,) = segment_pieces(li)
    flip(ws.store, segment_data_key("", piece.uuid), block_offset(ws, piece.uuid, li.ledgerId) + 300)
    got, r = read(ws)
    assert got == expected  # no entry lost, none twice, every byte as written
    assert r.fallbacks == 1 and r.tier_reads == {"hot": 2, "offloaded": 4}
    assert "CorruptObjectError" in r.fallback_notes[0] and f"ledger {li.ledgerId}" in r.fallback_notes[0]


def test_a_lost_segment_reads_from_the_hot_copy_and_fails_only_without_one(ws):
    expected, _ = read(ws, HOT_FIRST)
    stream(ws, T, max_segment_size=16 * 1024)
    li = ledgers(ws)[2]
    u = segment_pieces(li)[1].uuid  # the ledger's second segment
    ws.store.delete([segment_index_key("", u), segment_data_key("", u)])
    got, r = read(ws)
    assert got == expected and r.fallbacks == 1 and "OffloadedLedgerNotFoundError" in r.fallback_notes[0]
    ws.hot.delete_ledger(li.ledgerId)
    with pytest.raises(OffloadedLedgerNotFoundError, match=f"segment {u} not found.*the hot copy"):
        read(ws)


def test_the_open_ledger_streamed_up_to_an_entry_reads_hot_first_and_falls_back_for_what_is_covered(make_ws):
    ws = make_ws(["t/a"], ledgers=3, entries=10)
    w = TopicWriter(ws.ml, ws.hot, T, clock_ms=lambda: END_MS + 1)
    try:
        first = w.append_many([b"early-%d-" % i * 20 for i in range(30)])
        lid = first[0].ledger_id
        stream(ws, T, max_segment_size=16 * 1024, as_of=END_MS + 2)  # the open ledger's tail is forced out
        w.append_many([b"late-%d-" % i * 20 for i in range(10)])  # not offloaded yet
        li = ledgers(ws)[-1]
        assert li.ledgerId == lid and not is_offloaded(li) and covered_through(li) == 29
        expected, _ = read(ws, HOT_FIRST)
        assert len(expected) == 30 + 40
        got, r = read(ws)
        assert got == expected and r.tier_reads == {"hot": 1, "offloaded": 3} and r.fallbacks == 0

        # a damaged hot copy: the covered entries come from the segments, from the same entry on
        log_path = ws.hot._path(lid, "log")
        with open(log_path, "r+b") as f:
            f.seek(12 + 40)  # inside entry 0's payload
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x20]))
        r = ws.reader(TIERED_FIRST)
        try:
            assert [(e.entry_id, e.data) for e in r.read_ledger(T, lid, 0, 29)] == [
                (Position.parse(p).entry_id, d) for p, d in expected[30:60]]
            assert r.fallbacks == 1 and "CorruptEntryError" in r.fallback_notes[0]
            # entries after the covered ones exist in no readable copy: an error naming both, never short
            with pytest.raises(CorruptEntryError, match="segments hold entries 0..29 only, not 0..39"):
                r.read_ledger(T, lid, 0, 39)
        finally:
            r.close()
    finally:
        w.close(seal=False)


def test_segments_of_one_ledger_in_two_stores_are_read_where_their_driver_metadata_says(make_ws, tmp_path):
    ws = make_ws(["t/a"], ledgers=2, entries=10)
    other_root = tmp_path / "other-cold"
    other = ws.offloader_at(parse_store_url(f"file://{other_root}?prefix=moved"))
    w = TopicWriter(ws.ml, ws.hot, T, clock_ms=lambda: END_MS + 1)
    try:
        w.append_many([b"a-%d-" % i * 30 for i in range(25)])
        stream(ws, T, as_of=END_MS + 2)  # the sealed ledgers and the open one's first 25 entries
        w.append_many([b"b-%d-" % i * 30 for i in range(15)])
        w.rollover()  # sealed with 40 entries
        stream(ws, T, as_of=END_MS + 3, offloader=other, force_tail=True)  # its last 15: another store
    finally:
        w.close(seal=False)
    lid = ledgers(ws)[-2].ledgerId
    li = ledgers(ws)[-2]
    pieces = segment_pieces(li)
    assert is_offloaded(li) and [(p.first, p.last) for p in pieces] == [(0, 24), (25, 39)]
    assert segment_data_key("moved/", pieces[1].uuid) in {o.key for o in iter_objects(other.store)}
    assert ws.store.head(segment_data_key("", pieces[0].uuid)).size > 0
    expected, _ = read(ws, HOT_FIRST)
    for x in sealed(ws, T):
        ws.hot.delete_ledger(x)
    got, r = read(ws)
    assert got == expected and r.fallbacks == 0 and len(got) == 20 + 40
    assert not ws.hot.exists(lid)


def test_segment_handles_are_cached_like_v1_handles(ws):
    stream(ws, T, max_segment_size=16 * 1024)
    r = ws.reader(TIERED_FIRST)
    try:
        first = list(r.read(T))
        handles = dict(r._offloaded)
        assert sorted(lid for lid, _ in handles) == sealed(ws, T)
        requests = sum(h.requests for h in handles.values())
        assert list(r.read(T)) == first
        assert all(r._offloaded[k] is h for k, h in handles.items()) and len(r._offloaded) == 4
        # the same handles: no index opened again, their buffered windows served the second read
        assert sum(h.requests for h in handles.values()) == requests
    finally:
        r.close()
    assert r._offloaded == {}
