"""The block-by-block segment writer (SegmentSink fed by BlockFormer, what compaction uses because it
learns entry sizes only by reading the entries) writes exactly the objects SegmentOffloader.write
writes from a plan made with every size known: same data object, same V2 index, byte for byte."""

from __future__ import annotations

import uuid as uuidlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.errors import ValidationError
from tieredcore.formats.index import parse_index
from tieredcore.formats.segment import BlockFormer, LedgerRun, plan_segment
from tieredcore.model import Entry
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentOffloader, SegmentSource


class ListHandle:
    """A closed ledger held in a list (a plain ReadHandle: no FrameSource fast path)."""

    def __init__(self, ledger_id: int, payloads: list[bytes]) -> None:
        self.ledger_id = ledger_id
        self.payloads = payloads
        self.last_add_confirmed = len(payloads) - 1
        self.is_closed = True

    def read(self, first: int, last: int) -> list[Entry]:
        return [Entry(i, self.payloads[i]) for i in range(first, last + 1)]

    def close(self) -> None:
        pass


def _payloads(lid: int, sizes: list[int]) -> list[bytes]:
    return [bytes([(lid + i) % 251]) * n for i, n in enumerate(sizes)]


ledgers = st.lists(st.lists(st.integers(0, 700), min_size=1, max_size=30), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledgers=ledgers, block=st.sampled_from([140, 300, 1024, 4096]), min_part=st.sampled_from([0, 1, 2000, 9000]))
def test_sink_writes_what_write_writes(tmp_path_factory, ledgers, block, min_part):
    root = tmp_path_factory.mktemp("sink")
    off = LedgerOffloader(FilesystemBlobStore(root), "p", checksum_chunk=1000, checkpoint_interval=512)
    segs = SegmentOffloader(off, block_size=block, min_part_size=min_part)
    handles = [ListHandle(100 + i, _payloads(100 + i, sizes)) for i, sizes in enumerate(ledgers)]
    a, b = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    written = segs.write([SegmentSource(h, 0, h.last_add_confirmed) for h in handles], a)

    former, sink = BlockFormer(block), segs.sink(b)
    for h in handles:
        for e in h.read(0, h.last_add_confirmed):
            closed = former.add(h.ledger_id, e.entry_id, e.data)
            if closed is not None:
                sink.add(closed)
    sink.add(former.flush())
    streamed = sink.finish()

    assert (streamed.data_length, streamed.blocks, streamed.parts, streamed.entries, streamed.ledgers) == (
        written.data_length, written.blocks, written.parts, written.entries, written.ledgers)
    store = off.store
    assert store.get(streamed.data_key) == store.get(written.data_key)
    assert store.get(streamed.index_key) == store.get(written.index_key)
    plan = plan_segment([LedgerRun(h.ledger_id, 0, [len(p) for p in h.payloads]) for h in handles], block, min_part)
    assert parse_index(store.get(streamed.index_key)).data_object_length == plan.length


def test_former_and_sink_refuse_bad_sequences(tmp_path):
    former = BlockFormer(1024)
    former.add(1, 0, b"x")
    with pytest.raises(ValidationError, match="entry 2 after entry 0"):
        former.add(1, 2, b"x")
    off = LedgerOffloader(FilesystemBlobStore(tmp_path), "p")
    sink = SegmentOffloader(off, block_size=1024, min_part_size=0).sink(uuidlib.uuid4())
    sink.add(former.flush())
    former.add(2, 0, b"y")
    sink.add(former.flush())
    former.add(1, 1, b"z")
    with pytest.raises(ValidationError, match="appears twice"):
        sink.add(former.flush())
    sink.abort()
    assert not list(off.store.list_multipart_uploads(""))
    with pytest.raises(ValidationError, match="140-byte minimum"):
        BlockFormer(139)


def _batch(ledger_id: int, first: int, payloads: list[bytes]):
    """An EntryBatch of payloads as a reader returns one (frames back to back, after some leading bytes)."""
    import array

    from tieredcore.formats.block import encode_consecutive_frames
    from tieredcore.model import EntryBatch

    lead = b"\xee" * 5
    buf = lead + encode_consecutive_frames(first, payloads)
    starts, at = array.array("q"), len(lead)
    for p in payloads:
        starts.append(at + 12)
        at += 12 + len(p)
    return EntryBatch(ledger_id, first, buf, starts, array.array("i", map(len, payloads)), len(lead), len(buf))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block=st.integers(min_value=140, max_value=700),
    pad_last=st.booleans(),
    ledgers=st.lists(st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=25), min_size=1,
                     max_size=3),
    cuts=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=10),
)
def test_add_batch_forms_the_blocks_add_forms(block: int, pad_last: bool, ledgers: list[list[int]],
                                              cuts: list[int]) -> None:
    """Batches of any size (entries larger than a block, exactly full blocks, ledger changes) form the
    same blocks, with the same frames and sizes, as the same entries added one at a time."""
    one, many = BlockFormer(block, pad_last=pad_last), BlockFormer(block, pad_last=pad_last)
    want, got = [], []
    k = 0
    for lid, sizes in enumerate(ledgers, start=7):
        payloads = [bytes([lid, i % 256]) * (n // 2) + b"z" * (n % 2) for i, n in enumerate(sizes)]
        for i, p in enumerate(payloads):
            closed = one.add(lid, i, p)
            if closed is not None:
                want.append(closed)
        i = 0
        while i < len(payloads):
            n = cuts[k % len(cuts)]
            k += 1
            got += many.add_batch(_batch(lid, i, payloads[i : i + n]))
            i += n
    for former, out in ((one, want), (many, got)):
        tail = former.flush()
        if tail is not None:
            out.append(tail)
    assert [(b.ledger_id, b.first_entry, bytes(b.frames), b.sizes, b.block_size) for b in got] == \
           [(b.ledger_id, b.first_entry, bytes(b.frames), b.sizes, b.block_size) for b in want]


def test_add_batch_refuses_a_gap_like_add() -> None:
    former = BlockFormer(1024)
    former.add_batch(_batch(1, 0, [b"x", b"y"]))
    with pytest.raises(ValidationError, match="entry 3 after entry 1"):
        former.add_batch(_batch(1, 3, [b"z"]))
