"""Fuzzing of the offload format decoders: V1/V2 index, index trailer (checkpoints, checksums), data
blocks and frames, whole data objects, streaming segments (blocks, data + V2 index, LedgerInfo properties), BookKeeper ledger metadata and ManagedLedgerInfo records.

Contract: any input gives a result or a TieredError, never another exception, a hang (hypothesis
deadline) or unbounded memory (tests/fuzz/test_memory_bounds.py). Results are checked for sanity where
that is cheap (a parsed index re-encodes to the same index, a decoded block re-encodes to its bytes).
"""

from __future__ import annotations

import struct
import zlib

import crc32c
import pytest
import zstandard
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.v2_checker import V2CheckError, check_v2_segment
from tests.support.wire import varint
from tieredcore.errors import TieredError
from tieredcore.formats.block import (
    DecodedBlock,
    block_header,
    check_data_object,
    checkpoints_for,
    decode_block,
    encode_consecutive_frames,
    encode_data_object,
    encode_frames,
    iter_data_object,
    padding,
    parse_frames,
    plan_blocks,
    scan_frames,
)
from tieredcore.formats.index import (
    IndexEntry,
    LedgerIndex,
    LedgerSection,
    SegmentIndex,
    check_index_v1,
    encode_index_v1,
    encode_index_v2,
    index_trailer,
    parse_checkpoints,
    parse_index,
    parse_index_v1,
)
from tieredcore.formats.ledger_metadata import decode_ledger_metadata, encode_ledger_metadata
from tieredcore.formats.mlinfo import decode_managed_ledger_info, encode_managed_ledger_info
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.segment import (
    LedgerRun,
    StreamingBlock,
    build_streaming_block,
    decode_checkpoints_property,
    decode_checksums_property,
    decode_streaming_block,
    encode_checkpoints_property,
    encode_checksums_property,
    iter_segment,
    plan_segment,
    segment_sections,
    streaming_block_header,
)
from tieredcore.formats.trailer import (
    ChunkChecksums,
    ChunkCrcWriter,
    encode_checkpoints,
    encode_checksums,
    parse_trailer,
)
from tieredcore.model import STATE_CLOSED, LedgerMetadata

from .strategies import EXTREMES, FUZZ, HANG_TIMEOUT, fuzz_input, mutated, outcome

pytestmark = pytest.mark.timeout(HANG_TIMEOUT)

# --- valid encodings the mutations start from --------------------------------------------------------

PAYLOADS = [bytes([i]) * (i * 7 % 50) for i in range(12)]  # zero-length entries included
MAX_BLOCK = 300
CHUNK = 64
SIZES = [len(p) for p in PAYLOADS]
PLANS = plan_blocks(SIZES, MAX_BLOCK)
DATA, ENTRIES = encode_data_object(PAYLOADS, MAX_BLOCK)
META = LedgerMetadata(
    ledger_id=7, state=STATE_CLOSED, last_entry_id=len(PAYLOADS) - 1, length=sum(SIZES), ctime=1_700_000_000_000,
    custom_metadata={"application": b"pulsar", "tiered/ledgerId": b"7"},
)
META_BYTES = encode_ledger_metadata(META)


def _v1_index() -> bytes:
    idx = encode_index_v1(META_BYTES, len(DATA), ENTRIES)
    idx += encode_checkpoints(checkpoints_for(PLANS, SIZES, 40))
    w = ChunkCrcWriter(CHUNK)
    w.update(DATA)
    return idx + encode_checksums(idx, CHUNK, w.finish())


V1 = _v1_index()
M = len(META_BYTES)
N = len(ENTRIES)
_ENTRIES_END = 32 + M + 20 * N
V1_FIELDS = [(4, 4), (8, 8), (16, 8), (24, 4), (28, 4)]
V1_FIELDS += [(32 + M + 20 * k + off, w) for k in range(N) for off, w in ((0, 8), (8, 4), (12, 8))]
V1_FIELDS += [(_ENTRIES_END + 4, 4)]  # checkpoint count
_TSK = V1.index(b"TSK1")
V1_FIELDS += [(_TSK + 4, 4), (_TSK + 8, 4)]  # checksum chunk size, count

SECTIONS = [
    LedgerSection(ledger_id=3, entries=10, size=1000, index_entries=[IndexEntry(0, 1, 0), IndexEntry(5, 2, 300)]),
    LedgerSection(ledger_id=4, entries=2, size=20, index_entries=[IndexEntry(0, 3, 600)], timestamp=17),
]
V2 = encode_index_v2(900, SECTIONS)
V2_FIELDS = [(4, 4), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4)]

PLAIN_INFO = pb.ManagedLedgerInfo()
for _i in range(3):
    _li = PLAIN_INFO.ledgerInfo.add(ledgerId=_i, entries=10, size=1000, timestamp=1_700_000_000_000 + _i)
    _li.properties.add(key=f"k{_i}", value="v")
    _li.offloadContext.driverMetadata.name = "S3"
    _li.offloadContext.driverMetadata.properties.add(key="bucket", value="b")
PLAIN_INFO.properties.add(key="foo", value="bar")
MLINFO = {kind: encode_managed_ledger_info(PLAIN_INFO, kind) for kind in ("NONE", "ZLIB", "ZSTD")}
MLINFO_FIELDS = [(0, 2), (2, 4)]


def _check_v1_roundtrip(idx: LedgerIndex, buf: bytes) -> None:
    """A parsed V1 index re-encodes (with its trailer) to an index that parses to the same fields."""
    again = parse_index_v1(encode_index_v1(idx.metadata_bytes, idx.data_object_length, idx.entries) + idx.trailer,
                           idx.ledger_id)
    for name in ("metadata", "metadata_bytes", "data_object_length", "data_header_length", "entries", "trailer"):
        assert getattr(again, name) == getattr(idx, name), name
    assert len(buf) == _end_of_entries(idx) + len(idx.trailer)


def _end_of_entries(idx: LedgerIndex) -> int:
    return 32 + len(idx.metadata_bytes) + 20 * len(idx.entries)


def _exercise_v1(idx: LedgerIndex) -> None:
    """Everything a reader does with a parsed index: each call returns or raises a TieredError."""
    t = outcome(index_trailer, idx)
    if not isinstance(t, TieredError):
        assert len(t.checkpoint_ids) == len(t.checkpoint_offsets)
        if t.checksums is not None:
            assert len(t.checksums.crcs) == -(-t.checksums.object_length // t.checksums.chunk_size)
    outcome(parse_checkpoints, idx)
    outcome(check_index_v1, idx, idx.data_object_length)
    outcome(check_index_v1, idx, len(DATA), max_block_size=MAX_BLOCK, check_length_field=True)
    for eid in {-1, 0, 5, idx.last_entry_id, idx.last_entry_id + 1, *idx.entry_ids[:3]}:
        outcome(idx.lookup, eid)
        outcome(idx.lookup_span, eid)
    idx.block_sizes()


# --- V1 / V2 index ------------------------------------------------------------------------------------


@FUZZ
@given(fuzz_input(V1, V1_FIELDS, max_size=600))
@example(V1)
@example(V2)
@example(V1[:_ENTRIES_END] + b"TSC1\x7f\xff\xff\xff")
@example(V1[:_TSK] + b"TSK1\x00\x00\x00\x00\x00\x00\x00\x00")
def test_parse_index(buf: bytes) -> None:
    idx = outcome(parse_index, buf, 7)
    if isinstance(idx, LedgerIndex):
        _check_v1_roundtrip(idx, buf)
        _exercise_v1(idx)
    elif isinstance(idx, SegmentIndex):
        _exercise_v2(idx)
    outcome(parse_index_v1, buf, 7)


@FUZZ
@given(fuzz_input(V2, V2_FIELDS, max_size=400))
@example(V2)
def test_parse_index_v2(buf: bytes) -> None:
    idx = outcome(parse_index, buf)
    if isinstance(idx, SegmentIndex):
        again = parse_index(encode_index_v2(idx.data_object_length, idx.sections.values()))
        assert isinstance(again, SegmentIndex)
        assert again.sections == idx.sections and again.data_object_length == idx.data_object_length
        _exercise_v2(idx)
    elif isinstance(idx, LedgerIndex):
        _exercise_v1(idx)


def _exercise_v2(idx: SegmentIndex) -> None:
    for lid, sec in list(idx.sections.items())[:4]:
        for eid in {-1, 0, sec.last_entry_id, sec.last_entry_id + 1}:
            outcome(idx.lookup, lid, eid)
            outcome(idx.lookup_span, lid, eid)
        assert sec.metadata.ledger_id == lid
    outcome(idx.section, -5)


# --- index trailer ---------------------------------------------------------------------------------------


@FUZZ
@given(
    fuzz_input(V1[_ENTRIES_END:], [(4, 4), (_TSK - _ENTRIES_END + 4, 4), (_TSK - _ENTRIES_END + 8, 4)]),
    st.just(crc32c.crc32c(V1[:_ENTRIES_END])) | st.integers(0, 2**32 - 1),  # the true prefix CRC: checksums parse
    st.sampled_from(EXTREMES) | st.integers(-(2**63), 2**63 - 1),
    st.sampled_from((len(DATA), 0, -1, 1, 2**63 - 1)) | st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=300),
    st.integers(-(2**20), 2**20),
)
def test_parse_trailer(trailer: bytes, prefix_crc: int, last: int, length: int, data: bytes, start: int) -> None:
    t = outcome(parse_trailer, trailer, prefix_crc, last, length)
    if isinstance(t, TieredError):
        return
    ids, offs = t.checkpoint_ids, t.checkpoint_offsets
    assert len(ids) == len(offs)
    assert ids == sorted(set(ids)) and offs == sorted(set(offs))
    if t.checksums is not None:
        assert not t.problem
        _exercise_checksums(t.checksums, data, start)


@FUZZ
@given(
    st.integers(1, 2**31 - 1),
    st.integers(0, 3000),
    st.binary(max_size=300),
    st.sampled_from((0, 64, 128, -64, 2**31 - 1)) | st.integers(-(2**20), 2**20),
)
@example(chunk=1, length=0, data=b"\x00", start=0)  # past the object end: was an IndexError
@example(chunk=64, length=640, data=b"\x00" * 64, start=-64)  # before the start: read crcs[-1]
def test_chunk_checksums_verify(chunk: int, length: int, data: bytes, start: int) -> None:
    """verify() of any bytes at any start, against the checksums of DATA and of an object of ``length``
    bytes (as parse_trailer builds them: one CRC per chunk)."""
    w = ChunkCrcWriter(min(chunk, 97))
    w.update(DATA)
    sums = ChunkChecksums(w.chunk_size, tuple(w.finish()), len(DATA))
    _exercise_checksums(sums, data, start)
    assert outcome(sums.verify, DATA, 0, "fuzz") is None
    _exercise_checksums(ChunkChecksums(chunk, (0,) * -(-length // chunk), length), data, start)


def _exercise_checksums(sums: ChunkChecksums, data: bytes, start: int) -> None:
    outcome(sums.verify, data, start, "fuzz")
    a, b = sums.align(max(start, 0), max(start, 0) + len(data))
    assert a % sums.chunk_size == 0 and a <= max(start, 0)


# --- data blocks and frames ------------------------------------------------------------------------------


_BLOCK0 = DATA[: ENTRIES[1].offset]
BLOCK_FIELDS = [(4, 8), (12, 8), (20, 8), (128, 4), (132, 8), (140, 4)]


def _reencode(block: DecodedBlock) -> bytes:
    frames = encode_frames(block.entries)
    return block_header(block.first_entry_id, block.block_size) + frames + padding(
        block.block_size - 128 - len(frames))


@FUZZ
@given(fuzz_input(_BLOCK0, BLOCK_FIELDS, max_size=400), st.integers(-300, 400), st.booleans())
@example(_BLOCK0, 0, True)
@example(b"", -128, False)  # negative offset: was a struct.error
@example(_BLOCK0 + _BLOCK0, -len(_BLOCK0), True)  # negative offset: decoded the block counting from the end
def test_decode_block(buf: bytes, offset: int, exact: bool) -> None:
    got = outcome(decode_block, buf, offset, exact=exact)
    if isinstance(got, TieredError):
        return
    assert offset >= 0
    assert _reencode(got) == buf[offset : offset + got.block_size]
    assert [e for e, _ in got.entries] == list(range(got.first_entry_id, got.first_entry_id + len(got.entries)))


_FRAMES = encode_consecutive_frames(0, PAYLOADS)


@FUZZ
@given(
    fuzz_input(_FRAMES, [(0, 4), (4, 8), (12, 4)], max_size=400),
    st.integers(-10, 300),
    st.none() | st.integers(-10, 600),
    st.none() | st.sampled_from((0, 1, -1, 2**63 - 1)),
    st.none() | st.sampled_from((0, 3, -1, 2**63 - 1)),
)
def test_scan_frames(buf: bytes, pos: int, end: int | None, first: int | None, last: int | None) -> None:
    scan = outcome(scan_frames, buf, pos, end, first, last)
    if isinstance(scan, TieredError):
        return
    assert pos <= scan.next_pos <= max(len(buf) if end is None else end, pos)
    assert encode_frames(scan.entries) == buf[pos : scan.next_pos]
    if first is not None:
        assert [e for e, _ in scan.entries] == list(range(first, first + len(scan.entries)))
    if last is None:
        assert parse_frames(buf, pos, end, first) == scan.entries


def _read_all(data: bytes, index: LedgerIndex | list[IndexEntry]) -> list[tuple[int, bytes]]:
    return list(iter_data_object(data, index))


def _parse_or_none(buf: bytes) -> LedgerIndex | None:
    got = outcome(parse_index, buf, 7)
    return got if isinstance(got, LedgerIndex) else None


@FUZZ
@given(
    fuzz_input(DATA, [(o + f, w) for o in (e.offset for e in ENTRIES) for f, w in BLOCK_FIELDS], max_size=900),
    st.one_of(st.just(V1), mutated(V1, V1_FIELDS)),
    st.lists(st.builds(IndexEntry, st.sampled_from(EXTREMES), st.integers(-(2**31), 2**31 - 1),
                       st.sampled_from(EXTREMES) | st.integers(-1000, 1000)), max_size=4),
)
@example(DATA, V1, [IndexEntry(0, 1, -len(DATA))])
def test_data_object(data: bytes, index_bytes: bytes, raw_entries: list[IndexEntry]) -> None:
    """iter_data_object / check_data_object over damaged data with a valid index, valid data with a damaged
    index, and absurd raw index entries: a TieredError or a result. With the true blocks, data that passes
    the trailer's chunk checksums reads back exactly as written, and data that passes check_data_object
    holds entries 0..n-1 (frames themselves carry no checksum)."""
    indexes: list[LedgerIndex | list[IndexEntry]] = [raw_entries]
    idx = _parse_or_none(index_bytes)
    if idx is not None:
        indexes.append(idx)
    for index in indexes:
        got = outcome(_read_all, data, index)
        true_blocks = isinstance(index, LedgerIndex) and index.entries == tuple(ENTRIES)
        if true_blocks and not isinstance(got, TieredError):
            sums = index_trailer(index).checksums
            if sums is not None and outcome(sums.verify, data, 0, "fuzz") is None:
                assert got == list(enumerate(PAYLOADS))
        checked = outcome(check_data_object, data, index, MAX_BLOCK)
        if checked is None and true_blocks:
            assert [e for e, _ in iter_data_object(data, index)] == list(range(len(PAYLOADS)))


# --- streaming segments (PIP-76) ------------------------------------------------------------------------


SEG_RUNS = [LedgerRun(11, 3, [0, 5, 40, 17, 90]), LedgerRun(4, 0, [60, 0, 2])]
SEG_PLAN = plan_segment(SEG_RUNS, 160)
_SEG_FRAMES = [encode_consecutive_frames(r.first_entry, [bytes([r.ledger_id]) * n for n in r.entry_sizes])
               for r in SEG_RUNS]
SEG_DATA = b"".join(build_streaming_block(b, _SEG_FRAMES[b.run][b.frames_start : b.frames_start + b.frames_length])
                    for b in SEG_PLAN.blocks)
SEG_INDEX = encode_index_v2(len(SEG_DATA), segment_sections(SEG_PLAN, checkpoint_interval=20)[::-1])
SEG_BLOCK_FIELDS = [(b.offset + f, w) for b in SEG_PLAN.blocks
                    for f, w in ((4, 8), (12, 8), (20, 8), (28, 8), (128, 4), (132, 8))]
SEG_INDEX_FIELDS = [(4, 4), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4)]
MD = {"s3managedledgeroffloaderformatversion": "1"}


def _reencode_streaming(block: StreamingBlock) -> bytes:
    frames = encode_frames(block.entries)
    return streaming_block_header(block.ledger_id, block.first_entry_id, block.block_size) + frames + padding(
        block.block_size - 128 - len(frames))


@FUZZ
@given(fuzz_input(SEG_DATA[:160], SEG_BLOCK_FIELDS[:6], max_size=400), st.integers(-300, 400))
@example(SEG_DATA[:160], 0)
@example(SEG_DATA[:320], -160)  # negative offset: read the header counting from the end
def test_decode_streaming_block(buf: bytes, offset: int) -> None:
    got = outcome(decode_streaming_block, buf, offset)
    if isinstance(got, TieredError):
        return
    assert offset >= 0
    assert _reencode_streaming(got) == buf[offset : offset + got.block_size]
    assert [e for e, _ in got.entries] == list(range(got.first_entry_id, got.first_entry_id + len(got.entries)))


def _segment_entries(data: bytes, index: SegmentIndex) -> list[tuple[int, int, bytes]]:
    return list(iter_segment(data, index))


@FUZZ
@given(
    st.one_of(st.just(SEG_DATA), fuzz_input(SEG_DATA, SEG_BLOCK_FIELDS, max_size=1200)),
    st.one_of(st.just(SEG_INDEX), mutated(SEG_INDEX, SEG_INDEX_FIELDS)),
)
@example(SEG_DATA, SEG_INDEX)
def test_segment(data: bytes, index_bytes: bytes) -> None:
    """iter_segment over damaged data or a damaged V2 index: a TieredError or a result; whatever the
    independent conformance checker accepts, iter_segment reads the same way."""
    idx = outcome(parse_index, index_bytes)
    got = outcome(_segment_entries, data, idx) if isinstance(idx, SegmentIndex) else idx
    try:
        per_ledger = check_v2_segment(data, index_bytes, MD, MD)
    except V2CheckError:
        return
    assert isinstance(got, list), got
    assert sorted(got) == sorted((lid, e, p) for lid, entries in per_ledger.items() for e, p in entries)


_CHECKPOINTS = encode_checkpoints_property([(1, 140), (3, 200), (9, 800)])
_CHECKSUMS = encode_checksums_property(64, [1, 2, 3])


def _text(base: str) -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=80), mutated(base.encode()).map(lambda b: b.decode("latin-1")))


@FUZZ
@given(_text(_CHECKPOINTS), _text(_CHECKSUMS), st.sampled_from((0, 1, 150, 192, 2**40)))
@example(_CHECKPOINTS, _CHECKSUMS, 150)
def test_segment_properties(checkpoints: str, checksums: str, length: int) -> None:
    cp = outcome(decode_checkpoints_property, checkpoints, "fuzz")
    if not isinstance(cp, TieredError):
        ids, offs = cp
        assert len(ids) == len(offs)
        assert all(a < b for a, b in zip(ids, ids[1:], strict=False))
        assert all(a < b for a, b in zip(offs, offs[1:], strict=False))
    sums = outcome(decode_checksums_property, checksums, length, "fuzz")
    if not isinstance(sums, TieredError):
        assert sums.chunk_size > 0 and len(sums.crcs) == -(-length // sums.chunk_size)


# --- BookKeeper ledger metadata ---------------------------------------------------------------------------


@FUZZ
@given(fuzz_input(META_BYTES, max_size=300))
@example(META_BYTES)
@example(META_BYTES.replace(b"application", b"\xffpplication"))  # invalid UTF-8 in a string key
def test_decode_ledger_metadata(buf: bytes) -> None:
    md = outcome(decode_ledger_metadata, buf, 9)
    if isinstance(md, TieredError):
        return
    assert md.ledger_id == 9
    assert all(type(k) is str and type(v) is bytes for k, v in md.custom_metadata.items())
    assert all(type(v) is int for v in (md.state, md.last_entry_id, md.length, md.ctime))
    outcome(encode_ledger_metadata, md)


# --- ManagedLedgerInfo records ----------------------------------------------------------------------------


def _strings_are_str(msg: Message) -> bool:
    """Every string field of ``msg`` (recursively) decoded to ``str`` (upb hands back bytes otherwise)."""
    stack = [msg]
    while stack:
        m = stack.pop()
        for fd, value in m.ListFields():
            values = list(value) if fd.is_repeated else [value]
            if fd.type == FieldDescriptor.TYPE_STRING and not all(type(v) is str for v in values):
                return False
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                stack.extend(values)
    return True


def _zstd_frame(content_size: int | None, payload: bytes) -> bytes:
    """A zstd frame of ``payload``; with ``content_size`` its header declares that size instead (4-byte
    Frame_Content_Size field, single segment), whatever the payload holds."""
    if content_size is None:
        return zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(payload.ljust(70000, b"\0")))
    assert frame[4] == 0xA0  # FCS flag 2 (4 bytes), single segment: content size at bytes 5..8
    frame[5:9] = struct.pack("<I", content_size)
    return bytes(frame)


@st.composite
def compressed_record(draw: st.DrawFn) -> bytes:
    """Pulsar's compressed framing around valid or broken payloads, with forged metadata fields."""
    raw = PLAIN_INFO.SerializeToString()
    kind = draw(st.integers(0, 6))
    declared = draw(st.sampled_from((len(raw), 0, 1, 2**31 - 1, -1, -(2**31))) | st.integers(-(2**31), 2**31 - 1))
    payload = draw(st.one_of(
        st.binary(max_size=200),
        st.just(zlib.compress(raw)), mutated(zlib.compress(raw)),
        st.just(zstandard.ZstdCompressor().compress(raw)), mutated(zstandard.ZstdCompressor().compress(raw)),
        st.builds(_zstd_frame, st.none() | st.sampled_from((0, len(raw), 2**32 - 1, 2**31)), st.just(raw)),
    ))
    meta = pb.ManagedLedgerInfoMetadata()
    meta.ParseFromString(b"\x08" + varint(kind) + b"\x10" + varint(declared))
    mb = meta.SerializePartialToString()
    mb = mb if draw(st.booleans()) else draw(mutated(mb))
    meta_len = len(mb) if draw(st.booleans()) else draw(st.sampled_from(EXTREMES) | st.integers(-10, 300))
    return struct.pack(">h", 0x4778) + struct.pack(">I", meta_len % 2**32) + mb + payload


@FUZZ
@given(st.one_of(
    st.binary(max_size=400),
    st.sampled_from(list(MLINFO.values())).flatmap(lambda b: mutated(b, MLINFO_FIELDS)),
    compressed_record(),
))
@example(MLINFO["ZLIB"])
@example(MLINFO["ZSTD"])
@example(MLINFO["NONE"].replace(b"foo", b"\xfe\xff\xfe"))  # invalid UTF-8 in a string field
def test_decode_managed_ledger_info(buf: bytes) -> None:
    info = outcome(decode_managed_ledger_info, buf)
    if isinstance(info, TieredError):
        return
    assert isinstance(info, pb.ManagedLedgerInfo) and info.IsInitialized()
    assert _strings_are_str(info)
    assert decode_managed_ledger_info(encode_managed_ledger_info(info)) == info
