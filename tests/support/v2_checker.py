"""An independent conformance checker for streaming (PIP-76) segments: a data object of streaming blocks
and its V2 index, validated byte for byte.

Written only from the format description (/work/shared/spec/03-streaming-format.md, docs/formats.md),
with ``struct`` and the generated ``LedgerInfo`` protobuf class, and none of tieredcore's codecs: a
writer and a reader that share a misunderstanding cannot both pass a test that uses this checker.

Layout checked (every integer big-endian):

- streaming block: ``[magic 0x26A66D32:int32][128:int64][block length:int64][first entry id:int64]
  [ledger id:int64][92 zero bytes][frames [len:int32][entryId:int64][payload]...][padding]``, the
  padding being the bytes ``FE DC DE AD`` repeated from the first byte after the last frame;
- V2 index: ``[magic 0x3D1FB0BC:int32][index length:int32][data object length:int64][128:int64]`` then,
  repeated to the end, ``[ledgerId:int64][n:int32][metaLen:int32][LedgerInfo][n x (firstEntryId:int64,
  partId:int32, offset:int64)]``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from tieredcore.formats.proto.MLDataFormats_pb2 import ManagedLedgerInfo

BLOCK_MAGIC = 0x26A66D32
INDEX_MAGIC = 0x3D1FB0BC
HEADER_LENGTH = 128
PADDING = bytes.fromhex("fedcdead")
FORMAT_VERSION_KEY = "s3managedledgeroffloaderformatversion"

_INDEX_HEADER = struct.Struct(">Iiqq")  # 24 bytes
_SECTION_HEADER = struct.Struct(">qii")  # 16 bytes
_INDEX_ENTRY = struct.Struct(">qiq")  # 20 bytes
_BLOCK_HEADER = struct.Struct(">Iqqqq")  # 36 bytes
_FRAME_HEADER = struct.Struct(">iq")  # 12 bytes


class V2CheckError(AssertionError):
    """The segment does not conform; the message says where and why."""


@dataclass(frozen=True)
class Section:
    """One ledger's section of a V2 index, as stored."""

    ledger_id: int
    entries: int  # LedgerInfo.entries
    size: int  # LedgerInfo.size
    index_entries: tuple[tuple[int, int, int], ...]  # (firstEntryId, partId, offset) in stored order
    start: int  # byte range of the whole section in the index object
    end: int


def _fail(msg: str) -> None:
    raise V2CheckError(msg)


def _version(metadata: Mapping[str, str], what: str) -> None:
    md = {str(k).lower(): v for k, v in metadata.items()}
    if md.get(FORMAT_VERSION_KEY) != "1":
        _fail(f"{what}: user metadata {FORMAT_VERSION_KEY} is {md.get(FORMAT_VERSION_KEY)!r}, expected '1'")


def parse_v2_index(index: bytes, data_length: int | None = None) -> list[Section]:
    """The sections of a V2 index, after checking its header (and, given ``data_length``, the data object
    length field). Sections must follow each other to the exact end of the object."""
    if len(index) < _INDEX_HEADER.size:
        _fail(f"index: {len(index)} bytes, the header needs {_INDEX_HEADER.size}")
    magic, index_length, data_len, header_len = _INDEX_HEADER.unpack_from(index, 0)
    if magic != INDEX_MAGIC:
        _fail(f"index: magic 0x{magic:08x}, expected 0x{INDEX_MAGIC:08x}")
    if index_length != len(index):
        _fail(f"index: index length field {index_length}, the object holds {len(index)} bytes")
    if data_length is not None and data_len != data_length:
        _fail(f"index: data object length field {data_len}, the data object holds {data_length} bytes")
    if header_len != HEADER_LENGTH:
        _fail(f"index: data header length field {header_len}, expected {HEADER_LENGTH}")
    sections: list[Section] = []
    seen: set[int] = set()
    pos = _INDEX_HEADER.size
    while pos < len(index):
        start = pos
        if len(index) - pos < _SECTION_HEADER.size:
            _fail(f"index: {len(index) - pos} trailing bytes at {pos}, a section header needs {_SECTION_HEADER.size}")
        ledger_id, n, meta_len = _SECTION_HEADER.unpack_from(index, pos)
        what = f"index section at {pos} (ledger {ledger_id})"
        if ledger_id in seen:
            _fail(f"{what}: a second section for the ledger")
        seen.add(ledger_id)
        if n < 1:
            _fail(f"{what}: {n} index entries, a ledger in a segment has at least one block")
        if meta_len < 0:
            _fail(f"{what}: negative LedgerInfo length {meta_len}")
        pos += _SECTION_HEADER.size
        if pos + meta_len > len(index):
            _fail(f"{what}: LedgerInfo of {meta_len} bytes runs past the end of the index")
        li = ManagedLedgerInfo.LedgerInfo()
        try:
            li.ParseFromString(index[pos : pos + meta_len])
        except DecodeError as e:
            _fail(f"{what}: LedgerInfo does not parse: {e}")
        if not li.IsInitialized() or li.ledgerId != ledger_id:
            _fail(f"{what}: LedgerInfo names ledger {li.ledgerId if li.HasField('ledgerId') else None}")
        if not li.HasField("entries") or not li.HasField("size"):
            _fail(f"{what}: LedgerInfo lacks entries or size")
        pos += meta_len
        if pos + n * _INDEX_ENTRY.size > len(index):
            _fail(f"{what}: {n} index entries run past the end of the index")
        entries = tuple(_INDEX_ENTRY.unpack_from(index, pos + i * _INDEX_ENTRY.size) for i in range(n))
        pos += n * _INDEX_ENTRY.size
        sections.append(Section(ledger_id, li.entries, li.size, entries, start, pos))
    if not sections:
        _fail("index: no ledger section")
    return sections


def _walk_block(data: bytes, off: int, end: int, ledger_id: int, first: int) -> tuple[list[tuple[int, bytes]], int]:
    """Entries of the block ``data[off:end]`` (checked against the index's ledger and first entry id)
    and its frame bytes."""
    what = f"block at {off} (ledger {ledger_id})"
    if end - off < HEADER_LENGTH:
        _fail(f"{what}: {end - off} bytes, a header needs {HEADER_LENGTH}")
    magic, hlen, blen, bfirst, bledger = _BLOCK_HEADER.unpack_from(data, off)
    if magic != BLOCK_MAGIC:
        _fail(f"{what}: magic 0x{magic:08x}, expected 0x{BLOCK_MAGIC:08x}")
    if hlen != HEADER_LENGTH:
        _fail(f"{what}: header length {hlen}, expected {HEADER_LENGTH}")
    if blen != end - off:
        _fail(f"{what}: block length {blen}, the next block (or the end) is {end - off} bytes on")
    if bledger != ledger_id:
        _fail(f"{what}: header names ledger {bledger}, the index ledger {ledger_id}")
    if bfirst != first:
        _fail(f"{what}: header first entry id {bfirst}, the index says {first}")
    if any(data[off + _BLOCK_HEADER.size : off + HEADER_LENGTH]):
        _fail(f"{what}: header bytes 36..127 are not all zero")
    pos = off + HEADER_LENGTH
    out: list[tuple[int, bytes]] = []
    expect = first
    while end - pos >= _FRAME_HEADER.size:
        length, eid = _FRAME_HEADER.unpack_from(data, pos)
        if length < 0:
            break
        if eid != expect:
            _fail(f"{what}: frame at {pos} holds entry {eid}, expected {expect}")
        stop = pos + _FRAME_HEADER.size + length
        if stop > end:
            _fail(f"{what}: frame at {pos} ({length} bytes) runs past the block end {end}")
        out.append((eid, data[pos + _FRAME_HEADER.size : stop]))
        expect += 1
        pos = stop
    if not out:
        _fail(f"{what}: no entries")
    pad = data[pos:end]
    want = (PADDING * (len(pad) // 4 + 1))[: len(pad)]
    if pad != want:
        bad = next(i for i in range(len(pad)) if pad[i] != want[i])
        _fail(f"{what}: padding byte at {pos + bad} is {pad[bad]:02x}, expected {want[bad]:02x}")
    return out, pos - off - HEADER_LENGTH


def check_v2_segment(
    data: bytes,
    index: bytes,
    data_metadata: Mapping[str, str],
    index_metadata: Mapping[str, str],
    *,
    block_size: int | None = None,
) -> dict[int, list[tuple[int, bytes]]]:
    """Validate a segment (data object + V2 index + both objects' user metadata) and return its entries
    per ledger, ``{ledger id: [(entry id, payload), ...]}``. ``block_size``: the streaming block size
    the writer was configured with (then every block must be ``max(block_size, 128 + 12n + Σ len)``).
    Raises :class:`V2CheckError` on the first violation."""
    data, index = bytes(data), bytes(index)
    _version(data_metadata, "data object")
    _version(index_metadata, "index object")
    sections = parse_v2_index(index, len(data))

    blocks: list[tuple[int, int, int, int]] = []  # (offset, ledger, first entry id, part id)
    for s in sections:
        what = f"index section of ledger {s.ledger_id}"
        for i, (first, part, off) in enumerate(s.index_entries):
            if i and (first <= s.index_entries[i - 1][0] or off <= s.index_entries[i - 1][2]):
                _fail(f"{what}: index entry {i} {(first, part, off)} does not follow {s.index_entries[i - 1]}")
            if part < 1:
                _fail(f"{what}: part id {part} below 1")
            if not 0 <= off < len(data):
                _fail(f"{what}: offset {off} outside the {len(data)}-byte data object")
            blocks.append((off, s.ledger_id, first, part))
    blocks.sort()
    for a, b in zip(blocks, blocks[1:], strict=False):
        if a[0] == b[0]:
            _fail(f"index: ledgers {a[1]} and {b[1]} both have a block at offset {a[0]}")
        if b[3] < a[3]:
            _fail(f"index: part id {b[3]} at offset {b[0]} after part id {a[3]} at offset {a[0]}")
    if blocks[0][0] != 0:
        _fail(f"index: the first block is at offset {blocks[0][0]}, not 0 (a gap at the start)")

    found: dict[int, list[tuple[int, bytes]]] = {s.ledger_id: [] for s in sections}
    for i, (off, lid, first, _part) in enumerate(blocks):
        end = blocks[i + 1][0] if i + 1 < len(blocks) else len(data)
        entries, frames = _walk_block(data, off, end, lid, first)
        if block_size is not None and end - off != max(block_size, HEADER_LENGTH + frames):
            _fail(f"block at {off} (ledger {lid}): {end - off} bytes, expected max({block_size}, "
                  f"{HEADER_LENGTH} + {frames}) with a {block_size}-byte block size")
        got = found[lid]
        if got and got[-1][0] + 1 != first:
            _fail(f"block at {off}: ledger {lid} continues at entry {first} after entry {got[-1][0]}")
        got.extend(entries)

    for s in sections:
        got = found[s.ledger_id]
        what = f"ledger {s.ledger_id}"
        if got[0][0] != s.index_entries[0][0]:  # the section's first index entry is its lowest offset
            _fail(f"{what}: entries start at {got[0][0]}, the index at {s.index_entries[0][0]}")
        if got[-1][0] != s.entries - 1:
            _fail(f"{what}: last entry {got[-1][0]}, LedgerInfo.entries - 1 = {s.entries - 1}")
        payload = sum(len(p) for _, p in got)
        # size counts the ledger's payload bytes through its last entry here: all of them when the
        # segment holds the ledger from entry 0, at least those in the segment otherwise
        if (s.size != payload) if got[0][0] == 0 else (s.size < payload):
            _fail(f"{what}: LedgerInfo.size {s.size} for {payload} payload bytes from entry {got[0][0]}")
    return found
