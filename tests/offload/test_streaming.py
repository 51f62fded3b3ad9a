"""The streaming (PIP-76) segment protocol over a real workspace: planning (size cut, rollover-held tail,
watermark), the assign / complete compare-and-set steps, stale-segment cleanup, conflicts and unknown
outcomes, and reads at every boundary."""

from __future__ import annotations

import os

from tests.support.workspaces import END_MS
from tieredcore.errors import MetadataStoreError
from tieredcore.formats.index import SegmentIndex, parse_index
from tieredcore.meta.deletion_log import TYPE_SEGMENT
from tieredcore.model import Position
from tieredcore.offload.context import covered_through, incomplete_segment_uuids, segment_pieces, segment_refs
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.offload.streaming import WATERMARK_KEY, StreamingOffloader, parse_watermark
from tieredcore.outcomes import Outcome
from tieredcore.topic.writer import TopicWriter

TOPIC = "persistent://t/a/topic-0000"
ROLL = 600_000
BLOCK = 4096
SEG = 6 * BLOCK


def _setup(ws, block=BLOCK):
    seg = SegmentOffloader(ws.offloader, block_size=block, min_part_size=0)
    return seg, StreamingOffloader(ws.ml, ws.hot, seg, deletion_log=ws.deletion_log, leases=ws.leases)


def _payloads(n: int, size: int, seed: int = 0) -> list[bytes]:
    rnd = os.urandom  # content is compared against the hot copy, not regenerated
    return [rnd(size) if size else b"" for _ in range(n)]


def _writer(ws, at_ms: int) -> TopicWriter:
    return TopicWriter(ws.ml, ws.hot, TOPIC, clock_ms=lambda: at_ms)


def _read_all_from_segments(ws, seg) -> dict[int, list[bytes]]:
    info, _ = ws.ml.get_topic(TOPIC)
    out = {}
    for li in info.ledgerInfo:
        pieces = segment_pieces(li)
        if not pieces:
            continue
        h = seg.open_ledger(li.ledgerId, pieces, closed=li.timestamp > 0)
        try:
            out[li.ledgerId] = [e.data for e in h.read(0, h.last_add_confirmed)]
        finally:
            h.close()
    return out


def _hot(ws, lid: int, last: int) -> list[bytes]:
    h = ws.hot.open_ledger(lid)
    try:
        return [e.data for e in h.read(0, last)]
    finally:
        h.close()


def _pending(ws):
    return [e.record for e in ws.deletion_log.pending() if e.record is not None]


def _segment_keys(ws) -> set[str]:
    return {o.key for o in ws.store.list("").objects}


def test_slow_topic_tail_waits_for_rollover_then_is_readable_without_sealing(make_ws):
    ws = make_ws(ledgers=1, entries=1)
    seg, so = _setup(ws)
    # the generated history goes first (closed now), then a slow writer starts
    assert [r.outcome for r in so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS,
                                                force_tail=True)] == ["offloaded"]
    t0 = END_MS + 1000
    w = _writer(ws, t0)
    w.append_many(_payloads(5, 100))
    lid = w.current_ledger_id
    before = _segment_keys(ws)

    # the open ledger's 5 entries: one small tail, younger than the rollover
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=t0 + ROLL - 1)
    assert [r.outcome for r in res] == [Outcome.HELD]
    assert _segment_keys(ws) == before

    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=t0 + ROLL)
    assert [r.outcome for r in res] == ["offloaded"]
    info, _ = ws.ml.get_topic(TOPIC)
    open_li = info.ledgerInfo[-1]
    assert open_li.ledgerId == lid and open_li.timestamp == 0  # still open
    assert covered_through(open_li) == 4
    assert _read_all_from_segments(ws, seg)[lid] == _hot(ws, lid, 4)

    # the same logical time again: nothing new
    keys = _segment_keys(ws)
    assert so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=t0 + ROLL) == []
    assert _segment_keys(ws) == keys
    # the watermark says everything up to 4 was offloaded at that time
    wm = parse_watermark(ws.ml.get_topic(TOPIC)[0])
    assert wm == (Position(lid, 4), t0 + ROLL)

    # entries written later wait for the rollover counted from the watermark, not from the ledger's creation
    w.append_many(_payloads(3, 100))
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=t0 + 2 * ROLL - 1)
    assert [r.outcome for r in res] == [Outcome.HELD]
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=t0 + 2 * ROLL)
    assert [r.outcome for r in res] == ["offloaded"] and res[0].ledgers == [(lid, 5, 7)]
    assert _read_all_from_segments(ws, seg)[lid] == _hot(ws, lid, 7)
    w.close()


def test_fast_topic_segments_respect_the_size_cap_and_read_at_every_boundary(make_ws):
    ws = make_ws(ledgers=3, entries=37, entry_size="700")  # sealed ledgers span several segments
    seg, so = _setup(ws)
    w = _writer(ws, END_MS)
    w.append_many(_payloads(23, 333))
    w.append_many([b""] * 2)  # 0-byte entries
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
    assert res and all(r.outcome == "offloaded" for r in res)
    assert len(res) > 3
    multi = [r for r in res if len(r.ledgers) > 1]
    assert multi, "some segment holds several ledgers"
    for r in res:
        d, i = seg.keys(r.uuid)
        assert ws.store.head(d).size <= SEG
        idx = parse_index(ws.store.get(i))
        assert isinstance(idx, SegmentIndex)
        assert [(lid, idx.sections[lid].first_entry_id, idx.sections[lid].last_entry_id) for lid in idx.sections] \
            == [tuple(x) for x in r.ledgers]
    info, _ = ws.ml.get_topic(TOPIC)
    spanning = [li for li in info.ledgerInfo if len(segment_pieces(li)) > 1]
    assert spanning, "some ledger spans several segments"
    for li in info.ledgerInfo:
        pieces = segment_pieces(li)
        if not pieces:
            continue
        h = seg.open_ledger(li.ledgerId, pieces, closed=li.timestamp > 0)
        hot = _hot(ws, li.ledgerId, h.last_add_confirmed)
        # every boundary: first/last entry of the ledger and of each segment piece, one by one and in pairs
        for p in pieces:
            for e in {p.first, p.last, max(0, p.first - 1), min(h.last_add_confirmed, p.last + 1)}:
                assert [x.data for x in h.read(e, e)] == [hot[e]]
            if p.last + 1 <= h.last_add_confirmed:
                assert [x.data for x in h.read(p.last, p.last + 1)] == hot[p.last: p.last + 2]
        assert [x.data for x in h.read(0, h.last_add_confirmed)] == hot
        h.close()
    w.close()


def test_a_crashed_attempt_is_cleaned_up_before_the_next_segment(make_ws):
    ws = make_ws(ledgers=2, entries=20, entry_size="300")
    seg, so = _setup(ws)
    _assign_and_write_only(so, ws)
    info, _ = ws.ml.get_topic(TOPIC)
    stale = {u for li in info.ledgerInfo for u in incomplete_segment_uuids(li)}
    assert len(stale) == 1
    (stale_uuid,) = stale

    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
    assert res and all(r.outcome == "offloaded" for r in res)
    info, _ = ws.ml.get_topic(TOPIC)
    assert not any(incomplete_segment_uuids(li) for li in info.ledgerInfo)
    recs = [r for r in _pending(ws) if r.uuid == stale_uuid]
    assert [r.type for r in recs] == [TYPE_SEGMENT] and recs[0].reason == "offload-cleanup"
    assert all(stale_uuid != p.uuid for li in info.ledgerInfo for p in segment_pieces(li))


def _assign_and_write_only(so, ws) -> None:
    """Step 1 and 2 of the protocol, then a crash (the complete CAS never runs)."""
    plan = so.plan(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
    ranges = plan.segments[0].ranges

    class Stop(BaseException):
        pass

    real_update = ws.ml.update_topic
    calls = {"n": 0}

    def update(t, mutate, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:  # the completion CAS: the process is gone before it
            raise Stop()
        return real_update(t, mutate, *a, **kw)

    ws.ml.update_topic = update
    try:
        so.offload_segment(TOPIC, ranges)
    except Stop:
        pass
    finally:
        ws.ml.update_topic = real_update


def test_losing_the_completion_race_sends_only_our_segment_to_the_deletion_log(make_ws):
    ws = make_ws(ledgers=2, entries=20, entry_size="300")
    seg, so = _setup(ws)
    real_write = seg.write

    def write_then_trim(sources, uuid, *a, **kw):
        out = real_write(sources, uuid, *a, **kw)

        def drop_assignment(info):  # another runner's cleanup took our assignment away meanwhile
            for li in info.ledgerInfo:
                keep = [s for s in li.offloadContext.offloadSegment if s.complete]
                del li.offloadContext.offloadSegment[:]
                li.offloadContext.offloadSegment.extend(keep)
            return True

        ws.ml.update_topic(TOPIC, drop_assignment)
        return out

    seg.write = write_then_trim  # type: ignore[method-assign]
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
    assert res[0].outcome == "conflict" and len(res) == 1  # the next segments wait for the next run
    recs = [r for r in _pending(ws) if r.uuid == res[0].uuid]
    assert [(r.type, r.reason) for r in recs] == [(TYPE_SEGMENT, "offload-conflict")]
    d, i = seg.keys(res[0].uuid)
    assert ws.store.head(i).size > 0  # nothing deleted directly: the drain does it


def test_unknown_completion_outcome_deletes_and_records_nothing(make_ws):
    ws = make_ws(ledgers=2, entries=20, entry_size="300")
    seg, so = _setup(ws)
    real_update = ws.ml.update_topic
    calls = {"n": 0}

    def flaky(t, mutate, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            real_update(t, mutate, *a, **kw)  # it landed, but the answer was lost
            raise MetadataStoreError("connection lost")
        return real_update(t, mutate, *a, **kw)

    ws.ml.update_topic = flaky
    try:
        res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
    finally:
        ws.ml.update_topic = real_update
    assert res[0].outcome == "unknown"
    assert not [r for r in _pending(ws) if r.uuid == res[0].uuid]
    info, _ = ws.ml.get_topic(TOPIC)
    assert any(p.uuid == res[0].uuid for li in info.ledgerInfo for p in segment_pieces(li))
    # the next run carries on after it
    res2 = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
    assert all(r.outcome == "offloaded" for r in res2)
    assert {r.uuid for r in res2}.isdisjoint({res[0].uuid})


def test_offloadsegment_bookkeeping_and_ledger_mode_copies_are_skipped(make_ws):
    from tests.support.workspaces import offload_one

    ws = make_ws(ledgers=3, entries=10, entry_size="200")
    seg, so = _setup(ws)
    info, _ = ws.ml.get_topic(TOPIC)
    first = info.ledgerInfo[0].ledgerId
    offload_one(ws, TOPIC, first)  # ledger mode (V1) copy of the first ledger
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS + 1, force_tail=True)
    assert res and all(r.outcome == "offloaded" for r in res)
    assert all(lid != first for r in res for lid, _, _ in r.ledgers)
    info, _ = ws.ml.get_topic(TOPIC)
    for li in info.ledgerInfo[1:-1]:
        refs = segment_refs(li)
        assert refs and all(r.complete and r.assigned_ms > 0 and r.offloaded_ms >= r.assigned_ms for r in refs)
        assert refs[-1].end_entry == li.entries - 1
        dm = li.offloadContext.offloadSegment[0].driverMetadata
        assert dm.name == ws.offloader.location.driver_metadata().name


def test_upto_limits_a_manual_streaming_offload(make_ws):
    ws = make_ws(ledgers=3, entries=10, entry_size="200")
    seg, so = _setup(ws)
    info, _ = ws.ml.get_topic(TOPIC)
    second = info.ledgerInfo[1].ledgerId
    res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS,
                           force_tail=True, upto=Position(second, 4))
    assert res and res[-1].ledgers[-1] == (second, 0, 4)
    info, _ = ws.ml.get_topic(TOPIC)
    assert covered_through(info.ledgerInfo[1]) == 4
    assert all(kv.key != WATERMARK_KEY for kv in info.properties)  # a partial manual run sets no watermark


def test_a_backlog_is_worked_off_over_several_runs_without_small_segments(make_ws, monkeypatch):
    import tieredcore.offload.streaming as streaming

    monkeypatch.setattr(streaming, "MAX_SEGMENTS_PER_RUN", 1)
    ws = make_ws(ledgers=4, entries=40, entry_size="500")
    seg, so = _setup(ws)
    runs = []
    covered = []
    for _ in range(20):
        res = so.offload_topic(TOPIC, max_segment_size=SEG, rollover_ms=ROLL, as_of_ms=END_MS, force_tail=True)
        if not res:
            break
        runs.append(res)
        info, _ = ws.ml.get_topic(TOPIC)
        covered.append(sum(covered_through(li) + 1 for li in info.ledgerInfo))
    assert len(runs) >= 2 and covered[0] < covered[-1] == 4 * 40
    *middle, last = [r for res in runs for r in res]
    assert all(r.outcome == "offloaded" for r in middle + [last])
    # only the very last segment (the forced tail) may be smaller than the cap allows
    assert all(r.bytes + BLOCK > SEG for r in middle)
    info, _ = ws.ml.get_topic(TOPIC)
    assert all(covered_through(li) == li.entries - 1 for li in info.ledgerInfo[:-1])
