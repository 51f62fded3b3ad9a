"""Compaction (tieredcore/lifecycle/compaction.py): planning on topic records, then end to end on real
workspaces — topics of small V1 objects, of small streaming segments (spanning ledgers, ledgers spanning
them) and of a mix, on the filesystem store and on S3 (moto). After compaction every entry of every
ledger reads back byte-identical (through the copy itself and through the topic reader, at every old and
new object boundary), the new segments pass the independent V2 layout checker, the old objects wait in
the deletion log for the delete delay and only then go, reconciliation finds nothing, a second run does
nothing, and the deletion lag and retention keep working on the compacted ledgers. A reader that opened
an old object before the switch keeps reading it until the delay ends."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.compaction import (
    AS_OF,
    DELAY,
    LATER,
    ML,
    KiB,
    check_new_segments,
    compactor,
    copies,
    cut_points,
    mixed_topic,
    no_incomplete,
    pending,
    read_everything,
    segment_topic,
    units_of,
    v1_topic,
)
from tests.support.segments import (
    NS,
    TOPIC,
    Snapshot,
    assert_segments_clean,
    completed_segments,
    drain_and_reconcile,
    hot_snapshot,
    segment_keys_of,
    store_keys,
)
from tests.support.v2_checker import check_v2_segment
from tests.support.workspaces import END_MS, INTERVAL_MS, build_workspace, offload, sealed
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.errors import NotFoundError
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH
from tieredcore.formats.keys import data_key, index_key, segment_data_key, segment_index_key
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.segment import BlockFormer
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.lifecycle.compaction import plan_topic
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.retention import trim_topic
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.meta.deletion_log import TYPE_SEGMENT
from tieredcore.offload.batches import BLOCK_SIZE, Batch, compacted_bytes, v1_bytes
from tieredcore.offload.compaction import Compactor
from tieredcore.offload.context import covering_offloaded_ms, is_complete
from tieredcore.offload.copies import open_offloaded
from tieredcore.offload.managed import ABANDONED_PREFIX, REPLACEMENT_PREFIX
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.workspace import Workspace

MIN = 60_000


# ================================================================================================
# planning, on topic records
# ================================================================================================


class Record:
    """A topic record built by hand: ledgers 1, 2, ... of ``entries`` entries and ``size`` bytes each,
    offloaded as V1 objects or into segments; :meth:`plan` plans it."""

    def __init__(self) -> None:
        self.info = pb.ManagedLedgerInfo()
        self.uuids: dict[int, set[str]] = {}

    def ledger(self, *, entries: int = 10, size: int = 10_000, sealed: bool = True) -> int:
        li = self.info.ledgerInfo.add()
        li.ledgerId = len(self.info.ledgerInfo)
        li.entries, li.size = entries, size
        li.timestamp = 1_000 + li.ledgerId if sealed else 0
        self.uuids[li.ledgerId] = set()
        return li.ledgerId

    def li(self, lid: int):
        return self.info.ledgerInfo[lid - 1]

    def v1(self, **kw) -> int:
        lid = self.ledger(**kw)
        u = uuidlib.uuid4()
        ctx = self.li(lid).offloadContext
        ctx.uidMsb, ctx.uidLsb = uuid_to_msb_lsb(u)
        ctx.complete = True
        ctx.timestamp = 5_000
        ctx.driverMetadata.name = "filesystem"
        self.uuids[lid].add(str(u))
        return lid

    def segment(self, *pieces: tuple[int, int, int], complete: bool = True) -> str:
        """One segment holding (ledger, first, last) of each piece."""
        u = uuidlib.uuid4()
        for lid, _first, last in pieces:
            s = self.li(lid).offloadContext.offloadSegment.add()
            s.uidMsb, s.uidLsb = uuid_to_msb_lsb(u)
            s.complete = complete
            s.endEntryId = last
            s.assignedTimestamp = s.offloadedTimestamp = 5_000
            s.driverMetadata.name = "filesystem"
            self.uuids[lid].add(str(u))
        return str(u)

    def plan(self, min_object_size: int, target_size: int) -> list[Batch]:
        return plan_topic(self.info, min_object_size=min_object_size, target_size=target_size)


def after(n_ledgers: int, entries: int = 10, size: int = 10_000) -> int:
    return n_ledgers * compacted_bytes(entries, size, BLOCK_SIZE)


def test_plan_a_run_of_small_v1_objects_is_one_batch():
    r = Record()
    ids = [r.v1() for _ in range(6)]
    r.ledger(entries=3, sealed=False)  # the open ledger
    (b,) = r.plan(min_object_size=v1_bytes(r.li(1)) + 1, target_size=1 << 20)
    assert b.ledgers == tuple(ids)
    assert [u.kind for u in b.units] == ["ledger"] * 6 and [u.ledgers for u in b.units] == [(i,) for i in ids]
    assert {u.uuid for u in b.units} == set().union(*(r.uuids[i] for i in ids))
    assert (b.objects_before, b.objects_after, b.entries, b.payload_bytes) == (12, 1, 60, 60_000)
    assert b.bytes_before == 6 * v1_bytes(r.li(1)) and b.bytes_after == after(6)
    assert all(u.driver == {"name": "filesystem", "properties": {}} for u in b.units)
    # the same objects at the min size: not small
    assert r.plan(min_object_size=v1_bytes(r.li(1)), target_size=1 << 20) == []


def test_plan_cuts_batches_near_the_target_size():
    r = Record()
    ids = [r.v1() for _ in range(11)]
    target = after(3) + after(1) // 2  # three ledgers fit, four do not
    batches = r.plan(MIN, target)
    assert [b.ledgers for b in batches] == [tuple(ids[0:3]), tuple(ids[3:6]), tuple(ids[6:9]), tuple(ids[9:11])]
    for b in batches:
        assert b.bytes_after <= target and b.objects_after == 1
    # the one left over when a run does not divide evenly is not rewritten alone
    batches = r.plan(MIN, after(5) + 1)
    assert [b.ledgers for b in batches] == [tuple(ids[0:5]), tuple(ids[5:10])]


def test_plan_joins_ledgers_sharing_a_segment_into_one_group():
    """Segments S1 = ledger 1's first half, S2 = its second half + ledger 2's first, S3 = the rest of
    ledger 2 + ledger 3: one group, never cut. With room for two ledgers a batch (ledgers 1-3) larger than
    the target is planned as two new segments; ledgers 4 and 5 (V1) form the next batch."""
    r = Record()
    l1, l2, l3 = r.ledger(), r.ledger(), r.ledger()
    s1 = r.segment((l1, 0, 4))
    s2 = r.segment((l1, 5, 9), (l2, 0, 4))
    s3 = r.segment((l2, 5, 9), (l3, 0, 9))
    l4, l5 = r.v1(), r.v1()
    batches = r.plan(MIN, after(2) + 100)
    assert [b.ledgers for b in batches] == [(l1, l2, l3), (l4, l5)]
    g = batches[0]
    assert [(u.kind, u.uuid, u.ledgers) for u in g.units] == [
        ("segment", s1, (l1,)), ("segment", s2, (l1, l2)), ("segment", s3, (l2, l3))]
    assert (g.objects_before, g.objects_after) == (6, 2)
    # with room for everything: one batch of five ledgers and five object pairs
    (b,) = r.plan(MIN, after(5))
    assert b.ledgers == (l1, l2, l3, l4, l5) and len(b.units) == 5


def test_plan_a_large_object_breaks_a_run():
    r = Record()
    a = [r.v1(), r.v1()]
    r.v1(size=100_000)  # large
    b = [r.v1(), r.v1(), r.v1()]
    big = r.ledger(size=100_000)
    small = r.ledger(size=1_000)
    r.segment((big, 0, 9), (small, 0, 9))  # one object, large: both ledgers are left alone
    c = [r.v1()]
    r.ledger(sealed=False)
    batches = r.plan(MIN, 1 << 20)
    assert [x.ledgers for x in batches] == [tuple(a), tuple(b)]
    assert c[0] not in {lid for x in batches for lid in x.ledgers}  # a run of one


def test_plan_leaves_a_single_object_alone():
    r = Record()
    ids = [r.ledger(size=2_000) for _ in range(3)]
    r.segment(*[(i, 0, 9) for i in ids])  # three small ledgers in one small segment: nothing to gain
    assert r.plan(MIN, 1 << 20) == []
    r2 = Record()
    r2.v1()
    assert r2.plan(MIN, 1 << 20) == []


def test_plan_runs_are_consecutive_in_topic_order():
    """A ledger that cannot be repacked (here: not offloaded) ends a run; an empty ledger that nothing
    references does not."""
    r = Record()
    a = [r.v1(), r.v1()]
    r.ledger()  # sealed, not offloaded
    b = [r.v1()]
    r.ledger(entries=0, size=0)  # empty
    b += [r.v1()]
    r.ledger(sealed=False)
    assert [x.ledgers for x in r.plan(MIN, 1 << 20)] == [tuple(a), tuple(b)]


UNCLEAN = ["incomplete-segment", "replacement", "abandoned", "not-offloaded", "prefix-in-segments",
           "no-entries", "shares-a-segment-with-the-open-ledger"]


@pytest.mark.parametrize("kind", UNCLEAN)
def test_plan_never_touches_an_unclean_ledger(kind):
    """Small V1 ledgers around one ledger with something in flight or not fully offloaded: neither it
    nor any ledger sharing an object with it is in a batch, and none of its objects is a unit."""
    r = Record()
    ids = [r.v1(), r.v1()]
    bad: list[int] = []
    if kind == "incomplete-segment":  # a streaming (or compaction) attempt in flight on a V1 ledger
        lid = r.v1()
        r.segment((lid, 0, 9), complete=False)
        bad = [lid]
    elif kind in ("replacement", "abandoned"):  # a repair in flight, an abandoned attempt remembered
        lid = r.v1()
        prefix = REPLACEMENT_PREFIX if kind == "replacement" else ABANDONED_PREFIX
        r.li(lid).properties.add(key=prefix + str(uuidlib.uuid4()), value="1")
        bad = [lid]
    elif kind == "not-offloaded":
        bad = [r.ledger()]
    elif kind == "prefix-in-segments":  # sealed, its first half streamed only
        lid = r.ledger()
        r.segment((lid, 0, 4))
        bad = [lid]
    elif kind == "no-entries":
        bad = [r.ledger(entries=0, size=0)]
    ids += [r.v1(), r.v1()]
    if kind == "shares-a-segment-with-the-open-ledger":
        last = r.ledger(size=3_000)
        open_lid = r.ledger(entries=4, size=1_000, sealed=False)
        r.segment((last, 0, 9), (open_lid, 0, 3))
        bad = [last, open_lid]
    else:
        r.ledger(sealed=False)
    batches = r.plan(MIN, 1 << 20)
    planned = {lid for b in batches for lid in b.ledgers}
    assert planned == set(ids), [b.ledgers for b in batches]
    units = {u.uuid for b in batches for u in b.units}
    assert not units & set().union(*(r.uuids[lid] for lid in bad))


# ================================================================================================
# the layout of a compacted segment (BlockFormer without padding a ledger's last block, SegmentSink)
# ================================================================================================


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledgers=st.lists(st.lists(st.integers(0, 700), min_size=1, max_size=25), min_size=1, max_size=5),
       block=st.sampled_from([140, 300, 1024, 4096]), min_part=st.sampled_from([0, 1, 2000, 9000]))
def test_a_compacted_segment_passes_the_v2_checker_and_reads_back(tmp_path_factory, ledgers, block, min_part):
    """Empty entries, entries larger than a block, ledgers of one entry: every block but a ledger's last
    is padded to the block size (or holds one larger entry), a ledger's last block is its header and
    frames only; the independent checker accepts the segment, and every entry reads back, alone at each
    block boundary and in ranges across it."""
    off = LedgerOffloader(FilesystemBlobStore(tmp_path_factory.mktemp("seg")), "p", checksum_chunk=1000,
                          checkpoint_interval=512)
    segs = SegmentOffloader(off, block_size=block, min_part_size=min_part)
    payloads = {100 + i: [bytes([(i + j) % 251]) * n for j, n in enumerate(sizes)] for i, sizes in enumerate(ledgers)}
    u = str(uuidlib.uuid4())
    former, sink = BlockFormer(block, pad_last=False), segs.sink(u, {"managedledgername": ML})
    blocks: list[tuple[int, int, int, int, bool]] = []  # (ledger, first, last, length, last of its ledger)
    for lid, ps in payloads.items():
        formed = [former.add(lid, j, p) for j, p in enumerate(ps)] + [former.flush()]
        formed = [b for b in formed if b is not None]
        for k, b in enumerate(formed):
            sink.add(b)
            frames = BLOCK_HEADER_LENGTH + len(b.frames)
            assert b.block_size == (frames if k == len(formed) - 1 else max(block, frames))
            blocks.append((lid, b.first_entry, b.last_entry, b.block_size, k == len(formed) - 1))
    seg = sink.finish(sizes={lid: sum(map(len, ps)) for lid, ps in payloads.items()},
                      timestamps=dict.fromkeys(payloads, 7))
    store = off.store
    data, index = store.get(seg.data_key), store.get(seg.index_key)
    assert seg.data_length == len(data) == sum(b[3] for b in blocks)
    found = check_v2_segment(data, index, store.head(seg.data_key).metadata, store.head(seg.index_key).metadata)
    assert found == {lid: list(enumerate(ps)) for lid, ps in payloads.items()}
    for lid, ps in payloads.items():
        h = segs.open_piece(u, lid, 0, len(ps) - 1, ML)
        try:
            assert [bytes(e.data) for e in h.read(0, len(ps) - 1)] == ps
            for _l, first, last, _n, _end in (b for b in blocks if b[0] == lid):
                assert [bytes(e.data) for e in h.read(first, first)] == ps[first: first + 1]
                assert [bytes(e.data) for e in h.read(last, last)] == ps[last: last + 1]
                hi = min(last + 1, len(ps) - 1)
                assert [bytes(e.data) for e in h.read(max(0, first - 1), hi)] == ps[max(0, first - 1): hi + 1]
        finally:
            h.close()


# ================================================================================================
# end to end
# ================================================================================================


@pytest.fixture
def env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


def s3_url(moto_endpoint: str) -> str:
    bucket = f"cpt-{uuidlib.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/p?endpoint={moto_endpoint}&region=us-east-1"


def open_ws(cfg: Path) -> Workspace:
    return Workspace(Config.load(cfg, env={}))


def object_keys(ws: Workspace, units: dict[str, str], cps) -> set[str]:
    """The store keys of the object pairs ``units`` (uuid -> type) of the layout ``cps``."""
    prefix = ws.offloader.prefix
    out: set[str] = set()
    for u, typ in units.items():
        if typ == TYPE_SEGMENT:
            out |= {segment_data_key(prefix, u), segment_index_key(prefix, u)}
        else:
            (lid,) = [lid for lid, pieces in cps.items() if any(p[1] == u for p in pieces)]
            out |= {data_key(prefix, u, lid), index_key(prefix, u, lid)}
    return out


def offloaded_ms(li) -> int:
    return li.offloadContext.timestamp if is_complete(li) else covering_offloaded_ms(li)


def compact_and_check(ws: Workspace, before: Snapshot, c: Compactor, batches: int) -> list[str]:
    """Compact the topic (``batches`` planned, all landing) and check everything up to the drain and
    reconciliation that follow; the new segments' uuids."""
    old_layout = copies(ws)
    keys_before = set(store_keys(ws))
    offloaded = {li.ledgerId: (offloaded_ms(li), li.offloadContext.bookkeeperDeleted)
                 for li in ws.ml.get_topic(TOPIC)[0].ledgerInfo}
    planned = c.plan(TOPIC)
    assert len(planned) == batches, [b.ledgers for b in planned]
    covered = [lid for b in planned for lid in b.ledgers]
    old = units_of(old_layout, covered)
    assert {u.uuid for b in planned for u in b.units} == set(old)

    rows = c.compact_topic(TOPIC)

    assert [(r.outcome, tuple(r.ledgers)) for r in rows] == [("compacted", b.ledgers) for b in planned], rows
    new = [u for r in rows for u in r.segments]
    assert len(new) == len(set(new)) >= batches
    layout = copies(ws)
    for lid, pieces in old_layout.items():
        if lid in covered:
            assert {(typ, u) for typ, u, _f, _l in layout[lid]} <= {(TYPE_SEGMENT, u) for u in new}, lid
        else:
            assert layout[lid] == pieces, lid
    no_incomplete(ws)
    # each ledger keeps when it was offloaded (the deletion lag counts from it) and its hot-copy mark
    assert {li.ledgerId: (offloaded_ms(li), li.offloadContext.bookkeeperDeleted)
            for li in ws.ml.get_topic(TOPIC)[0].ledgerInfo} == offloaded
    check_new_segments(ws, new, before)
    cuts = cut_points(old_layout, layout)
    read_everything(ws, before, cuts)
    assert sum(r.objects_before for r in rows) == 2 * len(old) and sum(r.objects_after for r in rows) == 2 * len(new)

    # the old objects wait in the deletion log for the delete delay; nothing else is recorded
    assert pending(ws) == sorted((typ, "compaction", u, AS_OF + DELAY) for u, typ in old.items())
    old_keys = object_keys(ws, old, old_layout)
    new_keys = object_keys(ws, dict.fromkeys(new, TYPE_SEGMENT), layout)
    assert old_keys <= keys_before and set(store_keys(ws)) == keys_before | new_keys
    rep = drain(ws, AS_OF + DELAY - 1)  # before the delay: nothing is due
    assert rep.entries == 0 and set(store_keys(ws)) == keys_before | new_keys
    rep = drain(ws, AS_OF + DELAY)  # then exactly the old objects go
    assert (rep.entries, rep.deleted, rep.still_in_use, rep.retrying) == (len(old), len(old), 0, 0), rep.rows
    assert set(store_keys(ws)) == (keys_before - old_keys) | new_keys
    drain_and_reconcile(ws, LATER)
    assert set(store_keys(ws)) == (keys_before - old_keys) | new_keys
    read_everything(ws, before, cuts)

    # a second run has nothing to do
    assert c.compact_topic(TOPIC) == []
    assert copies(ws) == layout and set(store_keys(ws)) == (keys_before - old_keys) | new_keys and pending(ws) == []
    return new


def test_a_topic_of_small_v1_objects(tmp_path, env_clean):
    """Twelve ~32 KiB V1 objects: three batches (5 + 5 + 2 ledgers) of up to 160 KiB."""
    with open_ws(v1_topic(tmp_path / "ws")) as ws:
        before = hot_snapshot(ws)
        new = compact_and_check(ws, before, compactor(ws, min_object_size=80 * KiB, target_size=160 * KiB), 3)
        assert len(new) == 3
        open_lid = list(before)[-1]
        assert_segments_clean(ws, before, hot_only={open_lid})


@pytest.mark.parametrize("blocks", ["policy", "small-blocks"])
def test_a_topic_of_small_segments(tmp_path, env_clean, blocks):
    """Segments of up to 32 KiB that span ledgers; ledgers spanning segments. The groups joined by a
    spanning segment (ledgers 0-1, ledgers 2-4-5) become the batches; the open ledger's segment is left
    alone. With 8 KiB blocks and a 96 KiB target each batch is larger than the target: it is written as
    two new segments and a ledger spans the new boundary."""
    with open_ws(segment_topic(tmp_path / "ws")) as ws:
        before = hot_snapshot(ws)
        lids = list(before)
        if blocks == "policy":
            c = compactor(ws, min_object_size=64 * KiB, target_size=160 * KiB)
        else:
            c = compactor(ws, min_object_size=64 * KiB, target_size=96 * KiB, block_size=8 * KiB, min_part_size=0)
        open_segment = copies(ws)[lids[-1]]
        new = compact_and_check(ws, before, c, 2)
        layout = copies(ws)
        assert layout[lids[-1]] == open_segment
        if blocks == "small-blocks":
            assert len(new) >= 4
            assert any(len(pieces) > 1 for lid, pieces in layout.items() if lid != lids[-1])
        else:
            assert len(new) == 2
        assert_segments_clean(ws, before)


@pytest.mark.parametrize("store", ["fs", "s3"])
def test_a_topic_of_v1_objects_and_segments(tmp_path, env_clean, store, request):
    """Two V1 objects whose ledgers' hot copies are gone (compaction can only read the old objects),
    then segments; the open ledger in the hot tier only. On S3 too."""
    url = s3_url(request.getfixturevalue("moto_endpoint")) if store == "s3" else None
    cfg, before = mixed_topic(tmp_path / "ws", url)
    with open_ws(cfg) as ws:
        lids = list(before)
        c = compactor(ws, min_object_size=80 * KiB, target_size=160 * KiB)
        assert [b.ledgers for b in c.plan(TOPIC)] == [tuple(lids[:2]), tuple(lids[2:-1])]
        assert {u.kind for u in c.plan(TOPIC)[0].units} == {"ledger"}
        compact_and_check(ws, before, c, 2)
        assert_segments_clean(ws, before, hot_only={lids[-1]})


@pytest.mark.parametrize("blocks", ["policy", "small-blocks"])
def test_a_batch_larger_than_planned_is_not_rewritten_by_every_run(tmp_path, env_clean, blocks):
    """Planning estimates a segment from the topic record (entry counts and bytes), without the padding
    of blocks and, for segments, their headers; with the min object size equal to the target size a
    batch planned just under the target can take more. Cut at the target into segments planning still
    finds small, it would be rewritten by every later run; a segment is not cut before planning would
    find it large enough, so the next run has nothing to do.

    policy: two ledgers of four 1.5 MB entries in 4 MiB blocks (two entries a block: ~1.2 MiB of padding
    in each ledger's first block), 12 MiB thresholds: planned 11.4 MiB, written 14.4 MiB.
    small-blocks: the twelve V1 ledgers into 8 KiB blocks, 100 KiB thresholds: ~100 KiB planned, ~112
    KiB written per batch of three ledgers."""
    if blocks == "policy":
        cfg = build_workspace(tmp_path / "ws", [NS], ledgers=2, entries=4, entry_size="1500000")
        with open_ws(cfg) as ws:
            offload(ws, TOPIC, sealed(ws, TOPIC), END_MS)
        size, batches, extra = 12 << 20, 1, {}
    else:
        cfg = v1_topic(tmp_path / "ws")
        size, batches, extra = 100 * KiB, 4, {"block_size": 8 * KiB, "min_part_size": 0}
    with open_ws(cfg) as ws:
        before = hot_snapshot(ws)
        c = compactor(ws, min_object_size=size, target_size=size, **extra)
        planned = c.plan(TOPIC)
        assert len(planned) == batches and all(b.objects_after == 1 for b in planned)
        new = compact_and_check(ws, before, c, batches)  # ends with a second run that does nothing
        assert len(new) == batches


@pytest.mark.parametrize("blocks", ["policy", "small-blocks"])
def test_compacted_segments_compacted_again_with_a_larger_target(tmp_path, env_clean, blocks):
    """The new segments (unpadded last blocks) as the old objects of a later run with larger thresholds."""
    small = {} if blocks == "policy" else {"block_size": 8 * KiB, "min_part_size": 0}
    with open_ws(v1_topic(tmp_path / "ws")) as ws:
        before = hot_snapshot(ws)
        first = compact_and_check(ws, before, compactor(ws, min_object_size=80 * KiB, target_size=160 * KiB,
                                                        **small), 3)
        again = compactor(ws, min_object_size=256 * KiB, target_size=512 * KiB, clock_ms=AS_OF, **small)
        (b,) = again.plan(TOPIC)
        assert {u.uuid for u in b.units} == set(first) and {u.kind for u in b.units} == {"segment"}
        (new,) = compact_and_check(ws, before, again, 1)
        assert set(completed_segments(ws)) == {new}
        assert_segments_clean(ws, before, hot_only={list(before)[-1]})


def test_a_segment_retention_left_half_referenced_is_compacted_away(tmp_path, env_clean):
    """Retention trimmed ledger 0, whose last entry shares a segment with ledger 1's first ones: that
    segment stays (ledger 1 reads from it) holding a section of a ledger gone. Compaction rewrites
    ledger 1 from it and, after the delay, the drain deletes it."""
    with open_ws(segment_topic(tmp_path / "ws")) as ws:
        before = hot_snapshot(ws)
        lids = list(before)
        shared = copies(ws)[lids[0]][-1][1]
        assert copies(ws)[lids[1]][0][1] == shared
        ws.policies.set_namespace(NS, {"retention_time_minutes": 15})  # ledger 0 closed 20 min before END
        assert [r.ledger for r in trim_topic(ws, TOPIC, END_MS)] == [lids[0]]
        ws.policies.set_namespace(NS, {"retention_time_minutes": -1})
        rep = drain(ws, END_MS)
        assert rep.still_in_use == 1 and set(segment_keys_of(ws, shared)) and pending(ws) == []
        rest = {lid: v for lid, v in before.items() if lid != lids[0]}
        compact_and_check(ws, rest, compactor(ws, min_object_size=64 * KiB, target_size=160 * KiB), 2)
        assert segment_keys_of(ws, shared) == []
        assert_segments_clean(ws, rest)


def test_deletion_lag_and_retention_keep_working_on_compacted_ledgers(tmp_path, env_clean):
    """After compaction (three new segments: ledgers 0-4, 5-9, 10-11) the deletion lag proves the hot
    copies against the new segments and deletes them; retention trims the oldest ledger and keeps its
    segment (ledgers 1-4 still read from it), then trims the rest of its ledgers and the segment goes."""
    with open_ws(v1_topic(tmp_path / "ws")) as ws:
        before = hot_snapshot(ws)
        lids = list(before)
        compact_and_check(ws, before, compactor(ws, min_object_size=80 * KiB, target_size=160 * KiB), 3)
        layout = copies(ws)
        seg_a = layout[lids[0]][0][1]
        assert {layout[lid][0][1] for lid in lids[:5]} == {seg_a}
        prefix = ws.offloader.prefix
        a_keys = {segment_data_key(prefix, seg_a), segment_index_key(prefix, seg_a)}

        ps = ws.policies
        ps.set_namespace(NS, {"deletion_lag_ms": 0})
        rows = list(run_work(ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, LATER)]))
        assert sorted((r["ledger"], r["outcome"]) for r in rows) == [(lid, "marked") for lid in lids[:-1]], rows
        ps.set_namespace(NS, {"deletion_lag_ms": -1})
        rep = drain(ws, LATER)
        assert rep.deleted == len(lids) - 1 and not set(lids[:-1]) & set(ws.hot.list_ledgers())
        read_everything(ws, before, cut_points(layout))  # the new segments are the only copies now

        # ledger i closed at END - (11 - i) * 10 min: 105 minutes of retention at END trims ledger 0 only
        ps.set_namespace(NS, {"retention_time_minutes": 105})
        assert [(r.ledger, r.outcome) for r in trim_topic(ws, TOPIC, END_MS)] == [(lids[0], "trimmed")]
        assert [(t, r, u) for t, r, u, _n in pending(ws)] == [(TYPE_SEGMENT, "retention", seg_a)]
        rep = drain(ws, END_MS)
        assert (rep.still_in_use, rep.deleted) == (1, 0), rep.rows
        assert a_keys <= set(store_keys(ws))
        rest = {lid: v for lid, v in before.items() if lid != lids[0]}
        read_everything(ws, rest, cut_points(copies(ws)))

        # 40 minutes later ledgers 1-4 go too: the last ones seg_a holds
        later = END_MS + 4 * INTERVAL_MS
        assert [r.ledger for r in trim_topic(ws, TOPIC, later)] == lids[1:5]
        rep = drain(ws, later)
        # seg_a, recorded by each of its ledgers (one drain batch deletes it once for all four records)
        assert (rep.entries, rep.deleted + rep.already_deleted, rep.still_in_use) == (4, 4, 0), rep.rows
        assert not a_keys & set(store_keys(ws))
        rest = {lid: v for lid, v in before.items() if lid not in lids[:5]}
        read_everything(ws, rest, cut_points(copies(ws)))
        drain_and_reconcile(ws, LATER)
        assert_segments_clean(ws, rest, hot_only={lids[-1]})


# ================================================================================================
# a reader across the switch
# ================================================================================================


@pytest.fixture(params=["v1", "segments"])
def topic(request, tmp_path, env_clean) -> Iterator[tuple[Workspace, Snapshot, Compactor]]:
    cfg = (v1_topic if request.param == "v1" else segment_topic)(tmp_path / "ws")
    with open_ws(cfg) as ws:
        yield ws, hot_snapshot(ws), compactor(ws, min_object_size=80 * KiB, target_size=160 * KiB)


def test_a_reader_that_opened_an_old_object_keeps_reading_it_until_the_delay_ends(topic):
    ws, before, c = topic
    lids = list(before)
    lid = lids[1]
    want = before[lid]
    old_li = next(li for li in ws.ml.get_topic(TOPIC)[0].ledgerInfo if li.ledgerId == lid)
    h = open_offloaded(old_li, ws.offloader, ML, ws.offloader_for_driver)
    # a topic reader in the middle of the topic, too
    r = ws.reader()
    it = r.read(TOPIC)
    first = [bytes(next(it)[1]) for _ in range(len(before[lids[0]]) + 3)]
    try:
        assert [bytes(e.data) for e in h.read(0, 4)] == want[:5]
        old_keys = set(store_keys(ws))

        rows = c.compact_topic(TOPIC)
        assert {row.outcome for row in rows} == {"compacted"}
        assert {p[1] for p in copies(ws)[lid]} <= {u for row in rows for u in row.segments}
        assert [bytes(e.data) for e in h.read(5, len(want) - 1)] == want[5:]

        assert drain(ws, AS_OF + DELAY - 1).entries == 0
        assert old_keys <= set(store_keys(ws))
        assert [bytes(e.data) for e in h.read(0, len(want) - 1)] == want
        rest = [bytes(d) for _p, d in it]
        assert first + rest == [e for v in before.values() for e in v]
    finally:
        h.close()
        r.close()

    rep = drain(ws, AS_OF + DELAY)
    assert rep.deleted == rep.entries > 0
    # the old objects are gone: a fresh open of the old record fails, a fresh reader reads the new segment
    with pytest.raises(NotFoundError):
        open_offloaded(old_li, ws.offloader, ML, ws.offloader_for_driver).read(0, 0)
    read_everything(ws, before, cut_points(copies(ws)))


def test_new_segments_go_to_the_store_the_policy_names_now(tmp_path, env_clean):
    """The namespace's policy moved to another store after the V1 offloads: the new segments are written
    there (their driver metadata says so, readers follow it), the old objects are deleted from the store
    they were written to, and reconciliation finds nothing in either."""
    with open_ws(v1_topic(tmp_path / "ws")) as ws:
        before = hot_snapshot(ws)
        elsewhere = tmp_path / "elsewhere"
        ws.policies.set_namespace(NS, {"store": {"driver": "filesystem", "root": str(elsewhere),
                                                      "prefix": "cpt"}})
        old_layout = copies(ws)
        old_keys = set(store_keys(ws))
        c = compactor(ws, min_object_size=80 * KiB, target_size=160 * KiB)
        other = c.segments.off
        assert other.store.driver_properties()["root"] == str(elsewhere) and other.prefix == "cpt/"
        rows = c.compact_topic(TOPIC)
        assert [r.outcome for r in rows] == ["compacted"] * 3
        new = [u for r in rows for u in r.segments]
        new_keys = {k for u in new for k in SegmentOffloader(other).keys(u)}
        assert {o.key for o in other.store.list("cpt/").objects if "tiered-owner" not in o.key} == new_keys
        info, _ = ws.ml.get_topic(TOPIC)
        for li in info.ledgerInfo[:-1]:
            (s,) = li.offloadContext.offloadSegment
            assert dict((p.key, p.value) for p in s.driverMetadata.properties)["root"] == str(elsewhere)
        read_everything(ws, before, cut_points(old_layout, copies(ws)))
        rep = drain(ws, AS_OF + DELAY)
        assert rep.deleted == 12 and set(store_keys(ws)) == set()  # from the workspace's store
        assert old_keys and not old_keys & set(store_keys(ws))
        drain_and_reconcile(ws, LATER)
        assert {o.key for o in other.store.list("cpt/").objects if "tiered-owner" not in o.key} == new_keys
        read_everything(ws, before, cut_points(copies(ws)))
        assert c.compact_topic(TOPIC) == []
