"""Index objects: V1 (one ledger, docs/formats.md) and V2 (multi-ledger streaming segments, docs/formats.md).

Parsing is bulk (one ``struct.iter_unpack`` over the entry region); lookups are ``bisect`` floors.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import starmap

import crc32c
from google.protobuf.message import DecodeError

from tieredcore.errors import (
    BadRangeError,
    FormatError,
    InvalidMagicError,
    OffloadedLedgerNotFoundError,
    TruncatedError,
    ValidationError,
)
from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    INDEX_ENTRY_LENGTH,
    INDEX_MAGIC_V1,
    INDEX_MAGIC_V2,
    INDEX_V1_HEADER_LENGTH,
    INDEX_V2_HEADER_LENGTH,
    INDEX_V2_SECTION_HEADER_LENGTH,
)
from tieredcore.formats.ledger_metadata import decode_ledger_metadata
from tieredcore.formats.proto import MLDataFormats_pb2
from tieredcore.formats.trailer import IndexTrailer, parse_trailer
from tieredcore.model import STATE_CLOSED, LedgerMetadata

Buffer = bytes | bytearray | memoryview

_V1_HEADER = struct.Struct(">Iiqqii")  # magic, index length, data length, header length, n, M
_V2_HEADER = struct.Struct(">Iiqq")  # magic, index length, data length, header length
_V2_SECTION = struct.Struct(">qii")  # ledger id, n, metaLen
_ENTRY = struct.Struct(">qiq")  # firstEntryId, partId, blockOffset
_MAGIC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One block of a data object: its first entry id, multipart part id and byte offset."""

    first_entry_id: int
    part_id: int
    offset: int


def _encode_entries(entries: Sequence[IndexEntry]) -> bytes:
    try:
        return b"".join(starmap(_ENTRY.pack, ((e.first_entry_id, e.part_id, e.offset) for e in entries)))
    except struct.error as e:
        raise ValidationError(f"index entry out of range: {e}") from e


def _parse_entries(buf: memoryview, start: int, n: int, what: str) -> tuple[IndexEntry, ...]:
    end = start + INDEX_ENTRY_LENGTH * n
    if len(buf) < end:
        raise TruncatedError(
            f"{what}: truncated: {n} index entries need {end} bytes, buffer holds {len(buf)}"
        )
    return tuple(starmap(IndexEntry, _ENTRY.iter_unpack(buf[start:end])))


def _floor(ids: Sequence[int], entry_id: int, what: str) -> int:
    i = bisect_right(ids, entry_id) - 1
    if i < 0:
        first = ids[0] if ids else None
        raise BadRangeError(f"Entry index: {entry_id} before first indexed entry {first} of {what}")
    return i


def _check_header_length(header_length: int, what: str) -> None:
    if header_length != BLOCK_HEADER_LENGTH:
        raise FormatError(f"{what}: data block header length {header_length}, expected {BLOCK_HEADER_LENGTH}")


# ================================================================================================
# V1
# ================================================================================================


def encode_index_v1(metadata_bytes: bytes, data_object_length: int, entries: Sequence[IndexEntry]) -> bytes:
    """V1 index object: header, ``LedgerMetadataFormat`` bytes, then ``20 * n`` entry bytes.

    The index-length field is ``32 + M + 20n``.
    """
    m = len(metadata_bytes)
    n = len(entries)
    header = _V1_HEADER.pack(
        INDEX_MAGIC_V1,
        INDEX_V1_HEADER_LENGTH + m + INDEX_ENTRY_LENGTH * n,
        data_object_length,
        BLOCK_HEADER_LENGTH,
        n,
        m,
    )
    return b"".join((header, bytes(metadata_bytes), _encode_entries(entries)))


@dataclass(frozen=True)
class LedgerIndex:
    """A parsed V1 index object."""

    metadata: LedgerMetadata
    metadata_bytes: bytes
    data_object_length: int
    data_header_length: int
    entries: tuple[IndexEntry, ...]
    index_length_field: int = 0  # as stored; readers ignore it (checked by check_index_v1)
    trailer: bytes = b""  # bytes after the entries (ignored by Pulsar's reader; this project's extensions)
    trailer_prefix_crc: int = 0  # CRC32C of the index bytes before the trailer (the trailer's checksum chains it)
    _ids: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ids", tuple(e.first_entry_id for e in self.entries))

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_entry_id(self) -> int:
        return self.metadata.last_entry_id

    @property
    def length(self) -> int:
        return self.metadata.length

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    @property
    def entry_ids(self) -> tuple[int, ...]:
        """First entry id of every block (sorted as stored)."""
        return self._ids

    def _position(self, entry_id: int) -> int:
        if entry_id < 0:
            raise BadRangeError(f"Entry index: {entry_id} is negative")
        if entry_id > self.last_entry_id:
            raise BadRangeError(f"Entry index: {entry_id} beyond lastEntryId: {self.last_entry_id}")
        return _floor(self._ids, entry_id, f"ledger {self.ledger_id}")

    def lookup(self, entry_id: int) -> IndexEntry:
        """The block holding ``entry_id``: the floor index entry (largest firstEntryId <= entry_id)."""
        return self.entries[self._position(entry_id)]

    def lookup_span(self, entry_id: int) -> tuple[IndexEntry, int]:
        """``(index entry, end offset)`` of the block holding ``entry_id`` (end is exclusive)."""
        i = self._position(entry_id)
        end = self.entries[i + 1].offset if i + 1 < len(self.entries) else self.data_object_length
        return self.entries[i], end

    def block_sizes(self) -> list[int]:
        """Size of every block implied by the offsets and the data object length."""
        offs = [e.offset for e in self.entries]
        offs.append(self.data_object_length)
        return [b - a for a, b in zip(offs, offs[1:], strict=False)]


def _parse_v1(buf: memoryview, ledger_id: int) -> LedgerIndex:
    what = f"ledger {ledger_id} index"
    if len(buf) < INDEX_V1_HEADER_LENGTH:
        raise TruncatedError(
            f"{what}: truncated: header needs {INDEX_V1_HEADER_LENGTH} bytes, buffer holds {len(buf)}"
        )
    _, index_length, data_length, header_length, n, m = _V1_HEADER.unpack_from(buf, 0)
    if n < 0 or m < 0:
        raise FormatError(f"{what}: negative count (entries {n}, metadata length {m})")
    _check_header_length(header_length, what)
    meta_end = INDEX_V1_HEADER_LENGTH + m
    if len(buf) < meta_end:
        raise TruncatedError(f"{what}: truncated: metadata needs {meta_end} bytes, buffer holds {len(buf)}")
    metadata_bytes = bytes(buf[INDEX_V1_HEADER_LENGTH:meta_end])
    entries = _parse_entries(buf, meta_end, n, what)
    metadata = decode_ledger_metadata(metadata_bytes, ledger_id)
    entries_end = meta_end + INDEX_ENTRY_LENGTH * n
    return LedgerIndex(
        metadata=metadata,
        metadata_bytes=metadata_bytes,
        data_object_length=data_length,
        data_header_length=header_length,
        entries=entries,
        index_length_field=index_length,
        trailer=bytes(buf[entries_end:]),
        trailer_prefix_crc=crc32c.crc32c(buf[:entries_end]) if len(buf) > entries_end else 0,
    )


def check_index_v1(
    index: LedgerIndex,
    actual_data_object_size: int,
    *,
    max_block_size: int | None = None,
    expected_last_entry_id: int | None = None,
    expected_length: int | None = None,
    check_length_field: bool = True,
) -> None:
    """Index side of the structural checks of docs/formats.md; FormatError on the first violation.

    Checks: length field = 32 + M + 20n; ids strictly increasing from 0; part ids 1..n; offsets a
    running sum from 0 of positive block sizes (optionally every non-last block == max_block_size);
    data object length = actual size; metadata state CLOSED; lastEntryId >= last block's first id
    (and = the expected LAC / length when given); header length 128. Readers pass
    ``check_length_field=False``: Pulsar's reader ignores that field (docs/formats.md).
    """
    what = f"ledger {index.ledger_id} index"
    entries = index.entries
    n = len(entries)
    m = len(index.metadata_bytes)
    want_len = INDEX_V1_HEADER_LENGTH + m + INDEX_ENTRY_LENGTH * n
    if check_length_field and index.index_length_field != want_len:
        raise FormatError(
            f"{what}: index length field {index.index_length_field} != 32 + M + 20n = {want_len}"
        )
    _check_header_length(index.data_header_length, what)
    if n == 0:
        raise FormatError(f"{what}: no index entries")
    if index.data_object_length != actual_data_object_size:
        raise FormatError(
            f"{what}: data object length {index.data_object_length} != actual data object size "
            f"{actual_data_object_size}"
        )
    first = entries[0]
    if first.first_entry_id != 0 or first.part_id != 1 or first.offset != 0:
        raise FormatError(f"{what}: first index entry {first} is not (0, 1, 0)")
    sizes = index.block_sizes()
    for i, (e, size) in enumerate(zip(entries, sizes, strict=True)):
        if e.part_id != i + 1:
            raise FormatError(f"{what}: index entry {i} has part id {e.part_id}, expected {i + 1}")
        if i and e.first_entry_id <= entries[i - 1].first_entry_id:
            raise FormatError(
                f"{what}: index entry {i} first entry id {e.first_entry_id} not above "
                f"{entries[i - 1].first_entry_id}"
            )
        if size < BLOCK_HEADER_LENGTH + 12:
            raise FormatError(
                f"{what}: block {i} at offset {e.offset} has implied size {size} "
                f"(offsets must be a running sum of block sizes)"
            )
        if max_block_size is not None and i < n - 1 and size != max_block_size:
            raise FormatError(
                f"{what}: non-last block {i} at offset {e.offset} has size {size}, "
                f"expected max block size {max_block_size}"
            )
    md = index.metadata
    if md.state != STATE_CLOSED:
        raise FormatError(f"{what}: ledger metadata state {md.state}, expected CLOSED (3)")
    if md.last_entry_id < entries[-1].first_entry_id:
        raise FormatError(
            f"{what}: lastEntryId {md.last_entry_id} below last block's first entry id "
            f"{entries[-1].first_entry_id}"
        )
    if expected_last_entry_id is not None and md.last_entry_id != expected_last_entry_id:
        raise FormatError(f"{what}: lastEntryId {md.last_entry_id} != LAC {expected_last_entry_id}")
    if expected_length is not None and md.length != expected_length:
        raise FormatError(f"{what}: metadata length {md.length} != payload total {expected_length}")
    if md.length < 0:
        raise FormatError(f"{what}: negative metadata length {md.length}")


# ================================================================================================
# V2 (streaming segments)
# ================================================================================================


@dataclass(frozen=True)
class LedgerSection:
    """One ledger's part of a V2 index: its ``LedgerInfo`` fields and its blocks."""

    ledger_id: int
    entries: int  # LedgerInfo.entries (count)
    size: int  # LedgerInfo.size (payload bytes)
    index_entries: tuple[IndexEntry, ...]
    timestamp: int = 0  # LedgerInfo.timestamp when present
    # LedgerInfo.properties (Pulsar's reader ignores them): this project's checkpoints and checksums
    properties: tuple[tuple[str, str], ...] = ()
    _ids: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index_entries", tuple(self.index_entries))
        object.__setattr__(self, "properties", tuple(tuple(kv) for kv in self.properties))
        object.__setattr__(self, "_ids", tuple(e.first_entry_id for e in self.index_entries))

    @property
    def last_entry_id(self) -> int:
        return self.entries - 1

    @property
    def length(self) -> int:
        return self.size

    @property
    def metadata(self) -> LedgerMetadata:
        return LedgerMetadata(
            ledger_id=self.ledger_id,
            state=STATE_CLOSED,
            last_entry_id=self.last_entry_id,
            length=self.size,
            ctime=self.timestamp,
        )

    @property
    def first_entry_id(self) -> int:
        """The first entry of this ledger in this segment (a ledger may span segments)."""
        return self._ids[0] if self._ids else 0

    def property(self, key: str) -> str | None:
        return next((v for k, v in self.properties if k == key), None)

    def lookup(self, entry_id: int) -> IndexEntry:
        """Floor block of ``entry_id`` within this ledger's blocks."""
        if entry_id < 0:
            raise BadRangeError(f"Entry index: {entry_id} is negative")
        if entry_id > self.last_entry_id:
            raise BadRangeError(f"Entry index: {entry_id} beyond lastEntryId: {self.last_entry_id}")
        return self.index_entries[_floor(self._ids, entry_id, f"ledger {self.ledger_id} in segment")]


@dataclass(frozen=True)
class SegmentIndex:
    """A parsed V2 index: per-ledger sections keyed by ledger id, in stored order."""

    data_object_length: int
    data_header_length: int
    sections: Mapping[int, LedgerSection]
    index_length_field: int = 0

    @property
    def ledger_ids(self) -> list[int]:
        return list(self.sections)

    def section(self, ledger_id: int) -> LedgerSection:
        try:
            return self.sections[ledger_id]
        except KeyError:
            raise OffloadedLedgerNotFoundError(f"ledger {ledger_id} is not in this segment") from None

    def lookup(self, ledger_id: int, entry_id: int) -> IndexEntry:
        return self.section(ledger_id).lookup(entry_id)

    def lookup_span(self, ledger_id: int, entry_id: int) -> tuple[IndexEntry, int]:
        """``(index entry, end offset)``: blocks tile the whole object, so the end is the next
        larger offset of any ledger (or the data object length)."""
        ie = self.lookup(ledger_id, entry_id)
        later = [e.offset for s in self.sections.values() for e in s.index_entries if e.offset > ie.offset]
        return ie, min(later, default=self.data_object_length)


def _encode_ledger_info(s: LedgerSection) -> bytes:
    li = MLDataFormats_pb2.ManagedLedgerInfo.LedgerInfo()
    li.ledgerId = s.ledger_id
    li.entries = s.entries
    li.size = s.size
    if s.timestamp:
        li.timestamp = s.timestamp
    for k, v in s.properties:
        li.properties.add(key=k, value=v)
    return li.SerializeToString()


def encode_index_v2(data_object_length: int, sections: Iterable[LedgerSection]) -> bytes:
    """V2 index object; sections are written in the given order."""
    parts = []
    for s in sections:
        meta = _encode_ledger_info(s)
        parts.append(_V2_SECTION.pack(s.ledger_id, len(s.index_entries), len(meta)))
        parts.append(meta)
        parts.append(_encode_entries(s.index_entries))
    body = b"".join(parts)
    header = _V2_HEADER.pack(
        INDEX_MAGIC_V2, INDEX_V2_HEADER_LENGTH + len(body), data_object_length, BLOCK_HEADER_LENGTH
    )
    return header + body


def _parse_v2(buf: memoryview) -> SegmentIndex:
    what = "segment index"
    if len(buf) < INDEX_V2_HEADER_LENGTH:
        raise TruncatedError(
            f"{what}: truncated: header needs {INDEX_V2_HEADER_LENGTH} bytes, buffer holds {len(buf)}"
        )
    _, index_length, data_length, header_length = _V2_HEADER.unpack_from(buf, 0)
    _check_header_length(header_length, what)
    sections: dict[int, LedgerSection] = {}
    pos = INDEX_V2_HEADER_LENGTH
    end = len(buf)
    while pos < end:
        if end - pos < INDEX_V2_SECTION_HEADER_LENGTH:
            raise TruncatedError(f"{what}: truncated ledger section header at offset {pos}")
        ledger_id, n, meta_len = _V2_SECTION.unpack_from(buf, pos)
        swhat = f"{what}, ledger {ledger_id}"
        if n < 0 or meta_len < 0:
            raise FormatError(f"{swhat}: negative count (entries {n}, metadata length {meta_len})")
        if ledger_id in sections:
            raise FormatError(f"{swhat}: duplicate ledger section")
        pos += INDEX_V2_SECTION_HEADER_LENGTH
        if end - pos < meta_len:
            raise TruncatedError(f"{swhat}: truncated ledger info at offset {pos}")
        li = MLDataFormats_pb2.ManagedLedgerInfo.LedgerInfo()
        try:
            li.ParseFromString(bytes(buf[pos : pos + meta_len]))
        except DecodeError as e:
            raise FormatError(f"{swhat}: corrupt LedgerInfo: {e}") from e
        if not li.IsInitialized():
            raise FormatError(f"{swhat}: LedgerInfo misses required fields")
        pos += meta_len
        entries = _parse_entries(buf, pos, n, swhat)
        if any(b.first_entry_id <= a.first_entry_id for a, b in zip(entries, entries[1:], strict=False)):
            # Pulsar's reader keys a section's blocks by first entry id (a sorted map, first one wins)
            seen: dict[int, IndexEntry] = {}
            for e in entries:
                seen.setdefault(e.first_entry_id, e)
            entries = tuple(sorted(seen.values(), key=lambda e: e.first_entry_id))
        pos += INDEX_ENTRY_LENGTH * n
        sections[ledger_id] = LedgerSection(
            ledger_id=ledger_id,
            entries=li.entries,
            size=li.size,
            index_entries=entries,
            timestamp=li.timestamp,
            properties=tuple((kv.key, kv.value) for kv in li.properties),
        )
    return SegmentIndex(
        data_object_length=data_length,
        data_header_length=header_length,
        sections=sections,
        index_length_field=index_length,
    )


# ================================================================================================
# dispatch
# ================================================================================================


def parse_index(buf: Buffer, ledger_id: int = -1) -> LedgerIndex | SegmentIndex:
    """Parse a V1 or V2 index, dispatching on the first int32.

    ``ledger_id`` (V1 only) is recorded in the returned metadata; the V1 format does not store it.
    Bad magic -> InvalidMagicError; input ending early -> TruncatedError (an EOFError).
    """
    mv = memoryview(buf).cast("B")
    if len(mv) < 4:
        raise TruncatedError(f"index truncated: {len(mv)} bytes, magic needs 4")
    (magic,) = _MAGIC.unpack_from(mv, 0)
    if magic == INDEX_MAGIC_V1:
        return _parse_v1(mv, ledger_id)
    if magic == INDEX_MAGIC_V2:
        return _parse_v2(mv)
    raise InvalidMagicError(
        f"Invalid MagicWord. read: 0x{magic:08x} expected: 0x{INDEX_MAGIC_V1:08x} (V1) "
        f"or 0x{INDEX_MAGIC_V2:08x} (V2)"
    )


def parse_index_v1(buf: Buffer, ledger_id: int = -1) -> LedgerIndex:
    """Like :func:`parse_index` but a V2 index is an InvalidMagicError."""
    idx = parse_index(buf, ledger_id)
    if not isinstance(idx, LedgerIndex):
        raise InvalidMagicError(
            f"Invalid MagicWord. read: 0x{INDEX_MAGIC_V2:08x} expected: 0x{INDEX_MAGIC_V1:08x}"
        )
    return idx


# ================================================================================================
# V1 trailer (tieredcore.formats.trailer)
# ================================================================================================


def index_trailer(index: LedgerIndex) -> IndexTrailer:
    """The parsed sections of the index's trailer (checkpoints, checksums)."""
    return parse_trailer(index.trailer, index.trailer_prefix_crc, index.last_entry_id, index.data_object_length)


def parse_checkpoints(index: LedgerIndex) -> tuple[list[int], list[int]]:
    """``(entry ids, frame offsets)`` of the index's checkpoint trailer; empty lists when there is
    none or it is not one this reader understands (readers then walk blocks from their start)."""
    t = index_trailer(index)
    return t.checkpoint_ids, t.checkpoint_offsets
