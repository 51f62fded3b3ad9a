"""Segments written by SegmentOffloader.write over a real workspace (hot tier + filesystem object store)
pass the independent V2 conformance checker (tests/support/v2_checker.py), which also rejects
hand-corrupted copies of them."""

from __future__ import annotations

import struct

import pytest

from tests.support.v2_checker import V2CheckError, check_v2_segment, parse_v2_index
from tests.support.workspaces import sealed
from tieredcore.formats.proto.MLDataFormats_pb2 import ManagedLedgerInfo
from tieredcore.offload.segments import SegmentOffloader, SegmentSource

T = "persistent://t/a/topic-0000"
UUID = "0b6c3e0e-6f7e-4d3a-9d36-6a1c1f2b5e01"
BLOCK = 600


@pytest.fixture
def ws(make_ws):
    """Three sealed ledgers of 12 entries of 0..300 bytes, an open one."""
    return make_ws(["t/a"], ledgers=3, entries=12, entry_size="0-300")


def write(ws, ranges, block_size=BLOCK, min_part_size=0):
    """Write a segment of ``ranges`` (ledger, first, last); returns (data, index, data md, index md, expected)."""
    seg = SegmentOffloader(ws.offloader, block_size=block_size, min_part_size=min_part_size)
    handles, sources, expected = [], [], {}
    try:
        for lid, first, last in ranges:
            h = ws.hot.open_ledger(lid)
            handles.append(h)
            entries = h.read(0, last)
            sources.append(SegmentSource(h, first, last, size_through=sum(len(e.data) for e in entries)))
            expected[lid] = [(e.entry_id, e.data) for e in entries[first:]]
        obj = seg.write(sources, UUID, {"managedledgername": "t/a/persistent/topic-0000"})
    finally:
        for h in handles:
            h.close()
    data_info, index_info = ws.store.head(obj.data_key), ws.store.head(obj.index_key)
    data, index = ws.store.get(obj.data_key), ws.store.get(obj.index_key)
    assert (len(data), data_info.size) == (obj.data_length, obj.data_length)
    return data, index, data_info.metadata, index_info.metadata, expected


@pytest.fixture
def segment(ws):
    a, b, c = sealed(ws, T)
    return write(ws, [(a, 5, 11), (b, 0, 11), (c, 0, 3)])


@pytest.mark.parametrize("min_part_size", [0, 1500])
@pytest.mark.parametrize("block_size", [140, BLOCK, 4096])
def test_writer_output_conforms(ws, block_size, min_part_size):
    a, b, c = sealed(ws, T)
    data, index, dmd, imd, expected = write(ws, [(b, 0, 11), (a, 3, 9), (c, 11, 11)], block_size, min_part_size)
    assert check_v2_segment(data, index, dmd, imd, block_size=block_size) == expected
    parts = [e[1] for s in parse_v2_index(index) for e in s.index_entries]
    assert min(parts) == 1
    if min_part_size == 0:
        assert sorted(parts) == list(range(1, len(parts) + 1))


def test_open_ledger_entries_conform(ws):
    """Entries of a ledger still being written (up to its last add confirmed) go into a segment too."""
    w = ws.hot.create_ledger({"k": "v"})
    try:
        w.append_many([b"x" * n for n in (0, 5, 300, 0, 70)])
        data, index, dmd, imd, expected = write(ws, [(sealed(ws, T)[-1], 0, 11), (w.ledger_id, 1, 4)])
    finally:
        w.release()
    assert expected[w.ledger_id] == [(1, b"x" * 5), (2, b"x" * 300), (3, b""), (4, b"x" * 70)]
    assert check_v2_segment(data, index, dmd, imd, block_size=BLOCK) == expected


def test_sections_in_another_order_conform(segment):
    data, index, dmd, imd, expected = segment
    spans = [(s.start, s.end) for s in parse_v2_index(index)]
    body = b"".join(index[a:z] for a, z in reversed(spans))
    assert check_v2_segment(data, index[:24] + body, dmd, imd, block_size=BLOCK) == expected


# --- hand-corrupted copies ---------------------------------------------------------------------------


def _blocks(index: bytes) -> list[tuple[int, int, int, int]]:
    """(offset, ledger, first entry id, position of the offset field in the index), in offset order."""
    out = []
    for s in parse_v2_index(index):
        entries_at = s.end - 20 * len(s.index_entries)
        for i, (first, _part, off) in enumerate(s.index_entries):
            out.append((off, s.ledger_id, first, entries_at + 20 * i + 12))
    return sorted(out)


def _set(buf: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(buf)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def _first_padding_byte(data: bytes, off: int) -> int:
    pos = off + 128
    while struct.unpack_from(">i", data, pos)[0] >= 0:
        pos += 12 + struct.unpack_from(">i", data, pos)[0]
    return pos


def test_corruptions_are_rejected(segment):
    data, index, dmd, imd, _ = segment
    blocks = _blocks(index)
    assert len(blocks) >= 4
    off1, _, _, off1_field = blocks[1]
    pad = _first_padding_byte(data, 0)
    sections = parse_v2_index(index)
    s = sections[1]
    without = _set(index[:24] + index[24 : s.start] + index[s.end :], 4, ">i", len(index) - (s.end - s.start))
    cases = {
        "flipped padding byte": (_set(data, pad + 1, ">B", data[pad + 1] ^ 0x01), index, "padding byte"),
        "padding byte at the block end": (_set(data, blocks[1][0] - 1, ">B", 0), index, "padding byte"),
        "wrong block length": (_set(data, off1 + 12, ">q", BLOCK + 4), index, "block length"),
        "missing section": (data, without, "the next block"),
        "shifted offset": (data, _set(index, off1_field, ">q", off1 + 4), "block length 600, the next block"),
        "shifted first offset": (data, _set(index, blocks[0][3], ">q", 4), "first block is at offset 4"),
        "shifted offset, previous length fixed up": (
            _set(data, blocks[0][0] + 12, ">q", off1 + 4), _set(index, off1_field, ">q", off1 + 4), "padding byte at"),
        "block magic": (_set(data, off1, ">B", data[off1] ^ 0x01), index, "magic 0x27a66d32"),
        "header ledger id": (_set(data, off1 + 28, ">q", 999), index, "names ledger 999"),
        "header first entry": (_set(data, off1 + 20, ">q", blocks[1][2] + 1), index, "first entry id"),
        "header zero byte": (_set(data, off1 + 100, ">B", 1), index, "not all zero"),
        "frame entry id": (_set(data, 128 + 4, ">q", 0), index, "holds entry 0"),
        "index length field": (data, _set(index, 4, ">i", len(index) + 1), "index length"),
        "data length field": (data, _set(index, 8, ">q", len(data) - 1), "data object length"),
        "data header length field": (data, _set(index, 16, ">q", 127), "header length"),
        "index magic": (data, _set(index, 0, ">I", 0xDE47DE47), "magic"),
        "truncated index": (data, _set(index[:-1], 4, ">i", len(index) - 1), "past the end|trailing"),
        "truncated data": (data[:-1], _set(index, 8, ">q", len(data) - 1), "block length|padding"),
        "part id 0": (data, _set(index, blocks[0][3] - 4, ">i", 0), "part id"),
    }
    for name, (d, i, message) in cases.items():
        with pytest.raises(V2CheckError, match=message):
            check_v2_segment(d, i, dmd, imd, block_size=BLOCK)
            pytest.fail(f"{name}: accepted")


def test_block_size_rule(segment):
    data, index, dmd, imd, expected = segment
    assert check_v2_segment(data, index, dmd, imd) == expected  # no block size given: not checked
    with pytest.raises(V2CheckError, match="expected max"):
        check_v2_segment(data, index, dmd, imd, block_size=BLOCK - 4)


def test_part_ids_must_not_decrease(segment):
    data, index, dmd, imd, _ = segment
    blocks = _blocks(index)
    bad = _set(index, blocks[-1][3] - 4, ">i", 1)  # the last block back in part 1
    with pytest.raises(V2CheckError, match="part id 1 at offset"):
        check_v2_segment(data, bad, dmd, imd)


def test_ledger_info_entries_and_size(segment):
    data, index, dmd, imd, _ = segment
    s = parse_v2_index(index)[1]  # the ledger from entry 0
    meta_at = s.start + 16
    meta_len = struct.unpack_from(">i", index, s.start + 12)[0]
    for field, value, message in [("entries", 11, "LedgerInfo.entries - 1 = 10"), ("size", 1, "LedgerInfo.size 1")]:
        li = ManagedLedgerInfo.LedgerInfo()
        li.ParseFromString(index[meta_at : meta_at + meta_len])
        setattr(li, field, value)
        raw = li.SerializeToString()
        new = index[: s.start + 12] + struct.pack(">i", len(raw)) + raw + index[meta_at + meta_len :]
        new = _set(new, 4, ">i", len(new))
        with pytest.raises(V2CheckError, match=message):
            check_v2_segment(data, new, dmd, imd)


@pytest.mark.parametrize("which", ["data", "index"])
@pytest.mark.parametrize("value", [None, "2", ""])
def test_format_version_metadata(segment, which, value):
    data, index, dmd, imd, _ = segment
    md = dict(dmd if which == "data" else imd)
    md.pop("s3managedledgeroffloaderformatversion")
    if value is not None:
        md["s3managedledgeroffloaderformatversion"] = value
    args = (md, imd) if which == "data" else (dmd, md)
    with pytest.raises(V2CheckError, match=f"{which}.*s3managedledgeroffloaderformatversion"):
        check_v2_segment(data, index, *args)
