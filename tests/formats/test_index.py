"""V1 and V2 index objects (docs/formats.md): layout, lookups, rejections, conformance checks."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import (
    BadRangeError,
    FormatError,
    InvalidMagicError,
    OffloadedLedgerNotFoundError,
    TruncatedError,
)
from tieredcore.formats import (
    IndexEntry,
    LedgerIndex,
    LedgerSection,
    SegmentIndex,
    check_index_v1,
    encode_index_v1,
    encode_index_v2,
    encode_ledger_metadata,
    parse_index,
    parse_index_v1,
)
from tieredcore.formats.constants import INDEX_MAGIC_V1, INDEX_MAGIC_V2
from tieredcore.formats.proto import MLDataFormats_pb2
from tieredcore.model import STATE_CLOSED, STATE_OPEN, LedgerMetadata

MiB = 1024 * 1024
B64 = 64 * MiB


def md(
    last: int = 5000, length: int = 123456, state: int = STATE_CLOSED, ledger_id: int = 3
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        state=state,
        last_entry_id=last,
        length=length,
        ctime=1700000000000,
        custom_metadata={"application": b"pulsar", "component": b"managed-ledger"},
    )


EX5 = [IndexEntry(0, 2, 0), IndexEntry(1000, 3, B64), IndexEntry(2000, 4, 2 * B64)]


def ex5_bytes() -> bytes:
    return encode_index_v1(encode_ledger_metadata(md()), 3 * B64, EX5)


# --- V1 layout -----------------------------------------------------------------------------------


def test_v1_layout_exact():
    meta = encode_ledger_metadata(md())
    m = len(meta)
    buf = ex5_bytes()
    assert len(buf) == 32 + m + 60
    assert struct.unpack(">Iiqqii", buf[:32]) == (INDEX_MAGIC_V1, 32 + m + 60, 3 * B64, 128, 3, m)
    assert buf[:4] == bytes.fromhex("de47de47")
    assert buf[32 : 32 + m] == meta
    assert buf[32 + m :] == bytes.fromhex(
        "0000000000000000"
        "00000002"
        "0000000000000000"
        "00000000000003e8"
        "00000003"
        "0000000004000000"
        "00000000000007d0"
        "00000004"
        "0000000008000000"
    )


def test_example1_index():
    meta = encode_ledger_metadata(md(last=2, length=30))
    buf = encode_index_v1(meta, 194, [IndexEntry(0, 1, 0)])
    idx = parse_index(buf, 7)
    assert isinstance(idx, LedgerIndex)
    assert idx.entries == (IndexEntry(0, 1, 0),)
    assert idx.data_object_length == 194
    assert (idx.ledger_id, idx.last_entry_id, idx.length, idx.is_closed) == (7, 2, 30, True)
    check_index_v1(idx, 194, max_block_size=64 * MiB, expected_last_entry_id=2, expected_length=30)


# --- example 5 -----------------------------------------------------------------------------------


def test_example5_floor_lookups():
    idx = parse_index(ex5_bytes(), 3)
    assert isinstance(idx, LedgerIndex)
    assert idx.last_entry_id == 5000
    assert idx.lookup(0) == IndexEntry(0, 2, 0)
    assert idx.lookup(500) == IndexEntry(0, 2, 0)
    assert idx.lookup(999) == IndexEntry(0, 2, 0)
    assert idx.lookup(1000) == IndexEntry(1000, 3, B64)
    assert idx.lookup(1300).first_entry_id == 1000 and idx.lookup(1300).offset == 64 * MiB
    assert idx.lookup(3000).first_entry_id == 2000 and idx.lookup(3000).offset == 128 * MiB
    assert idx.lookup(5000).first_entry_id == 2000
    assert idx.lookup_span(1300) == (IndexEntry(1000, 3, B64), 2 * B64)
    assert idx.lookup_span(4000) == (IndexEntry(2000, 4, 2 * B64), 3 * B64)
    with pytest.raises(BadRangeError) as ei:
        idx.lookup(6000)
    assert str(ei.value) == "Entry index: 6000 beyond lastEntryId: 5000"
    with pytest.raises(BadRangeError, match="Entry index: 5001 beyond lastEntryId: 5000"):
        idx.lookup(5001)
    with pytest.raises(BadRangeError):
        idx.lookup(-1)


def test_example5_all_zero_buffer_is_invalid_magic():
    with pytest.raises(InvalidMagicError, match="Invalid MagicWord"):
        parse_index(bytes(len(ex5_bytes())))
    with pytest.raises(InvalidMagicError, match="Invalid MagicWord"):
        parse_index(bytes.fromhex("fbdbabcb") + bytes(100))


def test_example5_truncated_by_one_byte_is_eof():
    buf = ex5_bytes()
    with pytest.raises(EOFError):
        parse_index(buf[:-1])
    with pytest.raises(TruncatedError):
        parse_index(buf[:-1])


def test_every_truncation_is_eof():
    buf = ex5_bytes()
    for cut in range(len(buf)):
        with pytest.raises(TruncatedError):
            parse_index(buf[:cut])


def test_trailing_bytes_and_length_field_ignored():
    buf = ex5_bytes()
    idx = parse_index(buf + b"extension bytes", 3)
    assert isinstance(idx, LedgerIndex)
    assert idx.entries == tuple(EX5)
    assert idx.trailer == b"extension bytes"
    patched = bytearray(buf)
    struct.pack_into(">i", patched, 4, 12345)
    idx2 = parse_index(bytes(patched), 3)
    assert idx2.entries == tuple(EX5) and idx2.index_length_field == 12345
    with pytest.raises(FormatError, match="index length field"):
        check_index_v1(idx2, 3 * B64)


def test_memoryview_and_bytearray_input():
    buf = ex5_bytes()
    assert parse_index(memoryview(buf), 3) == parse_index(bytearray(buf), 3) == parse_index(buf, 3)


def test_v1_rejects_wrong_header_length_and_bad_metadata():
    patched = bytearray(ex5_bytes())
    struct.pack_into(">q", patched, 16, 64)
    with pytest.raises(FormatError, match="header length 64"):
        parse_index(bytes(patched))
    bad_meta = encode_index_v1(b"\xff\xff\xff", 3 * B64, EX5)
    with pytest.raises(FormatError, match="ledger metadata"):
        parse_index(bad_meta)
    negative = bytearray(ex5_bytes())
    struct.pack_into(">i", negative, 24, -1)
    with pytest.raises(FormatError, match="negative"):
        parse_index(bytes(negative))


def test_parse_index_v1_rejects_v2():
    with pytest.raises(InvalidMagicError):
        parse_index_v1(encode_index_v2(10, []))


# --- check_index_v1 ------------------------------------------------------------------------------


def _idx(entries, data_len, meta=None):
    return parse_index(encode_index_v1(encode_ledger_metadata(meta or md()), data_len, entries), 3)


def test_check_index_v1_accepts_conforming():
    good = [IndexEntry(0, 1, 0), IndexEntry(1000, 2, B64), IndexEntry(2000, 3, 2 * B64)]
    check_index_v1(_idx(good, 2 * B64 + 500), 2 * B64 + 500, max_block_size=B64, expected_last_entry_id=5000)


@pytest.mark.parametrize(
    ("entries", "data_len", "meta", "kwargs", "message"),
    [
        ([IndexEntry(0, 1, 0)], 1000, None, {"actual": 999}, "actual data object size"),
        ([IndexEntry(1, 1, 0)], 1000, None, {}, r"is not \(0, 1, 0\)"),
        ([IndexEntry(0, 2, 0)], 1000, None, {}, r"is not \(0, 1, 0\)"),
        ([IndexEntry(0, 1, 0), IndexEntry(10, 3, 500)], 1000, None, {}, "part id 3"),
        ([IndexEntry(0, 1, 0), IndexEntry(0, 2, 500)], 1000, None, {}, "not above"),
        ([IndexEntry(0, 1, 0), IndexEntry(10, 2, 1200)], 1000, None, {}, "implied size"),
        (
            [IndexEntry(0, 1, 0), IndexEntry(10, 2, 500)],
            1000,
            None,
            {"max_block_size": 400},
            "max block size",
        ),
        ([IndexEntry(0, 1, 0)], 1000, md(state=STATE_OPEN), {}, "CLOSED"),
        ([IndexEntry(0, 1, 0), IndexEntry(10, 2, 500)], 1000, md(last=5), {}, "below last block"),
        ([IndexEntry(0, 1, 0)], 1000, None, {"expected_last_entry_id": 4999}, "LAC 4999"),
        ([IndexEntry(0, 1, 0)], 1000, None, {"expected_length": 1}, "payload total 1"),
        ([], 1000, None, {}, "no index entries"),
    ],
)
def test_check_index_v1_violations(entries, data_len, meta, kwargs, message):
    idx = _idx(entries, data_len, meta)
    actual = kwargs.pop("actual", data_len)
    with pytest.raises(FormatError, match=message):
        check_index_v1(idx, actual, **kwargs)


def test_lookup_on_index_not_starting_at_zero():
    idx = _idx([IndexEntry(10, 1, 0)], 1000)
    with pytest.raises(BadRangeError, match="before first indexed entry 10"):
        idx.lookup(5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 10_000), min_size=1, max_size=200),
    st.lists(st.integers(140, 10**9), min_size=200, max_size=200),
    st.data(),
)
def test_v1_round_trip_and_floor(gaps, sizes, data):
    ids = [0]
    for g in gaps[:-1]:
        ids.append(ids[-1] + g)
    offsets = [0]
    for s in sizes[: len(ids) - 1]:
        offsets.append(offsets[-1] + s)
    entries = [IndexEntry(i, p + 1, o) for p, (i, o) in enumerate(zip(ids, offsets, strict=True))]
    last = ids[-1] + gaps[-1] - 1
    data_len = offsets[-1] + sizes[len(ids) - 1]
    idx = parse_index(encode_index_v1(encode_ledger_metadata(md(last=last)), data_len, entries), 3)
    assert idx.entries == tuple(entries)
    check_index_v1(idx, data_len, expected_last_entry_id=last)
    e = data.draw(st.integers(0, last))
    found = idx.lookup(e)
    assert found.first_entry_id <= e
    k = entries.index(found)
    assert k == len(entries) - 1 or entries[k + 1].first_entry_id > e


# --- V2 ------------------------------------------------------------------------------------------


def v2_sections() -> list[LedgerSection]:
    return [
        LedgerSection(ledger_id=1, entries=1500, size=15000, index_entries=(IndexEntry(1000, 2, 0),)),
        LedgerSection(
            ledger_id=2,
            entries=3000,
            size=30000,
            index_entries=(IndexEntry(0, 3, B64), IndexEntry(1000, 4, 2 * B64)),
            timestamp=1700000000000,
        ),
    ]


def test_v2_worked_example():
    buf = encode_index_v2(3 * B64, v2_sections())
    idx = parse_index(buf)
    assert isinstance(idx, SegmentIndex)
    assert idx.ledger_ids == [1, 2]
    assert idx.data_object_length == 3 * B64 and idx.data_header_length == 128
    assert idx.index_length_field == len(buf)
    assert idx.lookup(1, 1000) == IndexEntry(1000, 2, 0)
    assert idx.lookup(1, 1499) == IndexEntry(1000, 2, 0)
    assert idx.lookup(2, 0) == IndexEntry(0, 3, 64 * MiB)
    assert idx.lookup(2, 999) == IndexEntry(0, 3, 64 * MiB)
    assert idx.lookup(2, 1000) == IndexEntry(1000, 4, 128 * MiB)
    assert idx.lookup(2, 2999) == IndexEntry(1000, 4, 128 * MiB)
    assert idx.lookup_span(1, 1200) == (IndexEntry(1000, 2, 0), B64)
    assert idx.lookup_span(2, 1200) == (IndexEntry(1000, 4, 2 * B64), 3 * B64)
    with pytest.raises(BadRangeError, match="Entry index: 1500 beyond lastEntryId: 1499"):
        idx.lookup(1, 1500)
    with pytest.raises(BadRangeError, match="before first indexed entry 1000"):
        idx.lookup(1, 999)
    with pytest.raises(OffloadedLedgerNotFoundError):
        idx.lookup(3, 0)
    s2 = idx.section(2)
    assert (s2.last_entry_id, s2.length, s2.timestamp) == (2999, 30000, 1700000000000)
    meta = s2.metadata
    assert (meta.ledger_id, meta.is_closed, meta.last_entry_id, meta.length) == (2, True, 2999, 30000)
    assert idx.sections == {s.ledger_id: s for s in v2_sections()}


def test_v2_layout_exact():
    buf = encode_index_v2(3 * B64, v2_sections()[:1])
    li = MLDataFormats_pb2.ManagedLedgerInfo.LedgerInfo(ledgerId=1, entries=1500, size=15000)
    meta = li.SerializeToString()
    assert struct.unpack(">Iiqq", buf[:24]) == (INDEX_MAGIC_V2, len(buf), 3 * B64, 128)
    assert buf[:4] == bytes.fromhex("3d1fb0bc")
    assert struct.unpack(">qii", buf[24:40]) == (1, 1, len(meta))
    parsed = MLDataFormats_pb2.ManagedLedgerInfo.LedgerInfo.FromString(buf[40 : 40 + len(meta)])
    assert (parsed.ledgerId, parsed.entries, parsed.size) == (1, 1500, 15000)
    assert buf[40 + len(meta) :] == bytes.fromhex("00000000000003e8000000020000000000000000")
    assert len(buf) == 24 + 16 + len(meta) + 20


def test_v2_unsorted_sections():
    buf = encode_index_v2(3 * B64, list(reversed(v2_sections())))
    idx = parse_index(buf)
    assert isinstance(idx, SegmentIndex)
    assert idx.ledger_ids == [2, 1]
    assert idx.lookup(1, 1200) == IndexEntry(1000, 2, 0)
    assert idx.lookup(2, 1200) == IndexEntry(1000, 4, 2 * B64)


def test_v2_truncation_and_errors():
    buf = encode_index_v2(3 * B64, v2_sections())
    first_section_end = len(encode_index_v2(3 * B64, v2_sections()[:1]))
    for cut in range(len(buf)):
        if cut in (24, first_section_end):
            continue  # section boundaries: a shorter but well-formed index (format is "until the end")
        with pytest.raises(TruncatedError):
            parse_index(buf[:cut])
    dup = encode_index_v2(10, [v2_sections()[0], v2_sections()[0]])
    with pytest.raises(FormatError, match="duplicate"):
        parse_index(dup)
    patched = bytearray(buf)
    struct.pack_into(">q", patched, 16, 0)
    with pytest.raises(FormatError, match="header length 0"):
        parse_index(bytes(patched))
    corrupt = bytearray(buf)
    struct.pack_into(">i", corrupt, 36, 3)  # metaLen 3: LedgerInfo bytes cut short
    with pytest.raises(FormatError):
        parse_index(bytes(corrupt))
