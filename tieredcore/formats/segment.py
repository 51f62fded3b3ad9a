"""Streaming (PIP-76) segment data objects (docs/formats.md "Streaming segments").

A segment's data object is a sequence of streaming blocks, one ledger per block:

``[magic 0x26A66D32:int32][header length 128:int64][block length:int64][first entry id:int64]
[ledger id:int64][92 zero bytes][frames [len][entryId][payload]...][padding FE DC DE AD ...]``

Block length follows Pulsar: ``max(streaming block size, 128 + 12·n + Σ len)`` — every block is padded
to the streaming block size, a block holding a single entry larger than that grows to fit it. A block
ends where the ledger changes. Offsets in the V2 index run across the whole object.

Blocks are grouped into multipart parts of at least the store's minimum part size (with the default
streaming block size of 5 MiB every block is exactly one part, as upstream writes them); an index
entry's part id is the part holding the block.

This project adds, per ledger section, LedgerInfo ``properties`` that Pulsar's reader ignores:
``tiered.checkpoints`` (exact frame offsets every few KiB, as in a V1 index trailer) and, on the first
section, ``tiered.checksums`` (a CRC32C per fixed-size chunk of the data object).
"""

from __future__ import annotations

import base64
import itertools
import operator
import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from tieredcore.errors import FormatError, InvalidMagicError, TruncatedError, ValidationError
from tieredcore.formats.block import padding, scan_frames
from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    BLOCK_PADDING,
    ENTRY_HEADER_SIZE,
    MAX_ENTRY_SIZE,
    STREAMING_BLOCK_MAGIC,
)
from tieredcore.formats.index import IndexEntry, LedgerSection, SegmentIndex
from tieredcore.formats.trailer import ChunkChecksums
from tieredcore.model import EntryBatch

Buffer = bytes | bytearray | memoryview

_HEADER = struct.Struct(">Iqqqq")  # magic, header length, block length, first entry id, ledger id
HEADER_ZEROS = BLOCK_HEADER_LENGTH - _HEADER.size  # 92
_ZEROS = bytes(HEADER_ZEROS)
_FRAME = struct.Struct(">iq")

PROP_CHECKPOINTS = "tiered.checkpoints"
PROP_CHECKSUMS = "tiered.checksums"


# ================================================================================================
# planning
# ================================================================================================


@dataclass(frozen=True)
class LedgerRun:
    """Consecutive entries ``first_entry..`` of one ledger written into a segment."""

    ledger_id: int
    first_entry: int
    entry_sizes: Sequence[int]  # payload sizes of first_entry, first_entry + 1, ...

    @property
    def last_entry(self) -> int:
        return self.first_entry + len(self.entry_sizes) - 1

    @property
    def payload_bytes(self) -> int:
        return sum(self.entry_sizes)


@dataclass(frozen=True)
class SegmentBlock:
    """One streaming block: entries ``first_entry..last_entry`` of ``ledger_id``."""

    ledger_id: int
    first_entry: int
    last_entry: int
    block_size: int
    frames_length: int
    offset: int  # in the data object
    part_number: int  # multipart part holding the block (from 1)
    run: int = 0  # index of its LedgerRun
    frames_start: int = 0  # where its frames start inside the run's concatenated frames

    @property
    def entry_count(self) -> int:
        return self.last_entry - self.first_entry + 1

    @property
    def padding_length(self) -> int:
        return self.block_size - BLOCK_HEADER_LENGTH - self.frames_length


@dataclass(frozen=True)
class SegmentPlan:
    runs: tuple[LedgerRun, ...]
    blocks: tuple[SegmentBlock, ...]
    parts: tuple[tuple[int, int], ...]  # (first block, last block) of every part
    length: int  # data object bytes
    _cums: tuple[tuple[int, ...], ...] = field(repr=False, compare=False, default=())

    def frame_cum(self, run: int) -> tuple[int, ...]:
        """Cumulative frame bytes of the run's entries (``[0] = 0``)."""
        return self._cums[run]


def _check_sizes(run: LedgerRun) -> None:
    if run.ledger_id < 0 or run.first_entry < 0:
        raise ValidationError(f"ledger {run.ledger_id} entry {run.first_entry}: ids must not be negative")
    if not run.entry_sizes:
        raise ValidationError(f"ledger {run.ledger_id}: a run needs at least one entry")
    lo, hi = min(run.entry_sizes), max(run.entry_sizes)
    if lo < 0 or hi > MAX_ENTRY_SIZE:
        raise ValidationError(f"ledger {run.ledger_id}: entry size out of 0..{MAX_ENTRY_SIZE}")


def plan_segment(runs: Sequence[LedgerRun], block_size: int, min_part_size: int = 0) -> SegmentPlan:
    """Blocks and parts of a segment holding ``runs`` in order. Python work per block (bisects over
    cumulative frame sizes), not per entry."""
    if block_size < BLOCK_HEADER_LENGTH + ENTRY_HEADER_SIZE:
        raise ValidationError(f"streaming block size {block_size} is below the 140-byte minimum")
    seen: set[int] = set()
    blocks: list[SegmentBlock] = []
    cums: list[tuple[int, ...]] = []
    capacity = block_size - BLOCK_HEADER_LENGTH
    offset = 0
    part, part_fill = 1, 0
    parts: list[tuple[int, int]] = []
    part_first = 0
    for r, run in enumerate(runs):
        _check_sizes(run)
        if run.ledger_id in seen:
            raise ValidationError(f"ledger {run.ledger_id} appears twice in one segment")
        seen.add(run.ledger_id)
        cum = tuple(accumulate(map(ENTRY_HEADER_SIZE.__add__, run.entry_sizes), initial=0))
        cums.append(cum)
        n = len(run.entry_sizes)
        i = 0
        while i < n:
            stop = bisect_right(cum, cum[i] + capacity, i + 1, n + 1) - 1  # entries i..stop-1 fit
            stop = max(stop, i + 1)  # an entry larger than a block gets a block of its own
            frames = cum[stop] - cum[i]
            size = max(block_size, BLOCK_HEADER_LENGTH + frames)
            if part_fill and min_part_size and part_fill >= min_part_size:
                parts.append((part_first, len(blocks) - 1))
                part, part_fill, part_first = part + 1, 0, len(blocks)
            blocks.append(SegmentBlock(run.ledger_id, run.first_entry + i, run.first_entry + stop - 1, size,
                                       frames, offset, part, r, cum[i]))
            offset += size
            part_fill += size
            if not min_part_size:  # one block per part
                parts.append((part_first, len(blocks) - 1))
                part, part_fill, part_first = part + 1, 0, len(blocks)
            i = stop
    if blocks and part_first < len(blocks):
        parts.append((part_first, len(blocks) - 1))
    return SegmentPlan(tuple(runs), tuple(blocks), tuple(parts), offset, tuple(cums))


@dataclass
class FormedBlock:
    """A streaming block formed from entries as they were read (:class:`BlockFormer`)."""

    ledger_id: int
    first_entry: int
    frames: bytearray  # [len][entryId][payload] of each entry, back to back
    sizes: list[int]  # payload sizes
    block_size: int = 0  # set when the block is closed: max(block size, 128 + frames)

    @property
    def last_entry(self) -> int:
        return self.first_entry + len(self.sizes) - 1


class BlockFormer:
    """Streams entries into streaming blocks laid out exactly as :func:`plan_segment` lays out the same
    entries (a block ends where the next entry would not fit or the ledger changes; an entry larger than
    a block gets a block of its own), for writers that learn entry sizes only by reading the entries
    (compaction reads them from older objects). Holds one block.

    ``pad_last=False``: a ledger's last block (closed by :meth:`flush` or a ledger change) is not padded
    (its length is the header plus its frames). Readers never read past a ledger's last entry, so the
    next block's header right after it is never taken for a frame (blocks closed because the next entry
    did not fit stay padded, as readers expect within a ledger); a small ledger then takes its bytes,
    not a whole block. Every block length is in its header and the index, so any reader finds them."""

    def __init__(self, block_size: int, *, pad_last: bool = True) -> None:
        if block_size < BLOCK_HEADER_LENGTH + ENTRY_HEADER_SIZE:
            raise ValidationError(f"streaming block size {block_size} is below the 140-byte minimum")
        self.block_size = block_size
        self.pad_last = pad_last
        self._capacity = block_size - BLOCK_HEADER_LENGTH
        self._cur: FormedBlock | None = None

    def add(self, ledger_id: int, entry_id: int, payload: Buffer) -> FormedBlock | None:
        """Add the next entry; returns the block it closed, if any."""
        n = len(payload)
        if n > MAX_ENTRY_SIZE:
            raise ValidationError(f"ledger {ledger_id} entry {entry_id}: {n} bytes exceed the frame length limit")
        cur = self._cur
        closed = None
        if cur is not None:
            if cur.ledger_id == ledger_id and entry_id != cur.first_entry + len(cur.sizes):
                raise ValidationError(f"ledger {ledger_id}: entry {entry_id} after entry {cur.last_entry}")
            if cur.ledger_id != ledger_id:
                closed = self.flush()
                cur = None
            elif len(cur.frames) + ENTRY_HEADER_SIZE + n > self._capacity:
                closed = self._close(padded=True)
                cur = None
        if cur is None:
            cur = self._cur = FormedBlock(ledger_id, entry_id, bytearray(), [])
        cur.frames += _FRAME.pack(n, entry_id)
        cur.frames += payload
        cur.sizes.append(n)
        return closed

    def add_batch(self, batch: EntryBatch) -> list[FormedBlock]:
        """Add a batch of entries (the next of their ledger) exactly as :meth:`add` would one by one, but
        copying runs of whole frames at once; returns the blocks it closed."""
        closed: list[FormedBlock] = []
        n = len(batch)
        if n == 0:
            return closed
        lid, eid0 = batch.ledger_id, batch.first_entry
        if max(batch.lengths) > MAX_ENTRY_SIZE:
            raise ValidationError(f"ledger {lid}: an entry of the batch from {eid0} exceeds the frame length limit")
        cur = self._cur
        if cur is not None:
            if cur.ledger_id == lid and eid0 != cur.first_entry + len(cur.sizes):
                raise ValidationError(f"ledger {lid}: entry {eid0} after entry {cur.last_entry}")
            if cur.ledger_id != lid:
                block = self.flush()
                assert block is not None
                closed.append(block)
                cur = None
        # frame k of the batch is buf[fe[k]:fe[k + 1]] (frames are back to back)
        fe = [*map(operator.sub, batch.starts, itertools.repeat(ENTRY_HEADER_SIZE)), batch.frames_end]
        mv = memoryview(batch.buf)
        i = 0
        while i < n:
            if cur is None:
                cur = self._cur = FormedBlock(lid, eid0 + i, bytearray(), [])
            j = bisect_right(fe, fe[i] + self._capacity - len(cur.frames), i + 1, n + 1) - 1  # i..j-1 fit
            if j == i:  # the next entry does not fit
                if cur.sizes:
                    block = self._close(padded=True)
                    assert block is not None
                    closed.append(block)
                    cur = None
                    continue
                j = i + 1  # an entry larger than a block: a block of its own
            cur.frames += mv[fe[i] : fe[j]]
            cur.sizes += batch.lengths[i:j]
            i = j
        mv.release()
        return closed

    def flush(self) -> FormedBlock | None:
        """Close the current block, the last of its ledger here (None when there is none)."""
        return self._close(padded=self.pad_last)

    def _close(self, padded: bool) -> FormedBlock | None:
        cur, self._cur = self._cur, None
        if cur is not None:
            frames = BLOCK_HEADER_LENGTH + len(cur.frames)
            cur.block_size = max(self.block_size, frames) if padded else frames
        return cur


# ================================================================================================
# encoding
# ================================================================================================


def streaming_block_header(ledger_id: int, first_entry_id: int, block_size: int) -> bytes:
    """The 128-byte streaming block header."""
    try:
        head = _HEADER.pack(STREAMING_BLOCK_MAGIC, BLOCK_HEADER_LENGTH, block_size, first_entry_id, ledger_id)
    except struct.error as e:
        raise ValidationError(f"streaming block header field out of range: {e}") from e
    return head + _ZEROS


def block_pieces(block: SegmentBlock, frames: Buffer) -> tuple[bytes, Buffer, bytes]:
    """``(header, frames, padding)`` of a block whose frames are ``frames``."""
    if len(frames) != block.frames_length:
        raise ValidationError(f"ledger {block.ledger_id} entries {block.first_entry}..{block.last_entry}: got "
                              f"{len(frames)} frame bytes, the plan says {block.frames_length}")
    return (streaming_block_header(block.ledger_id, block.first_entry, block.block_size), frames,
            padding(block.padding_length))


def build_streaming_block(block: SegmentBlock, frames: Buffer) -> bytes:
    return b"".join(block_pieces(block, frames))


def segment_checkpoints(plan: SegmentPlan, run: int, interval: int,
                        blocks: Sequence[SegmentBlock] | None = None) -> list[tuple[int, int]]:
    """``(entryId, frame offset in the object)`` every ``interval`` frame bytes inside the run's blocks
    (as a V1 trailer's checkpoints): a random read walks at most that far from an exact offset.
    ``blocks``: the run's blocks when the caller has them (default: picked from all the plan's)."""
    if interval <= 0:
        return []
    cum = plan.frame_cum(run)
    first = plan.runs[run].first_entry
    out: list[tuple[int, int]] = []
    for b in blocks if blocks is not None else [b for b in plan.blocks if b.run == run]:
        lo, hi = b.first_entry - first, b.last_entry - first
        data_start = b.offset + BLOCK_HEADER_LENGTH
        base = last_cp = cum[lo]
        while True:
            k = bisect_right(cum, last_cp + interval - 1, lo + 1, hi + 1)
            if k > hi:
                break
            out.append((first + k, data_start + cum[k] - base))
            last_cp = cum[k]
    return out


def encode_checkpoints_property(checkpoints: Sequence[tuple[int, int]]) -> str:
    flat = [v for cp in checkpoints for v in cp]
    return base64.b64encode(struct.pack(f">{len(flat)}q", *flat)).decode("ascii")


def decode_checkpoints_property(value: str, what: str) -> tuple[list[int], list[int]]:
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise FormatError(f"{what}: {PROP_CHECKPOINTS} is not base64: {e}") from e
    if len(raw) % 16:
        raise FormatError(f"{what}: {PROP_CHECKPOINTS} holds {len(raw)} bytes, not whole (entry, offset) pairs")
    flat = struct.unpack(f">{len(raw) // 8}q", raw)
    ids, offs = list(flat[0::2]), list(flat[1::2])
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)) or any(b <= a for a, b in zip(offs, offs[1:], strict=False)):
        raise FormatError(f"{what}: {PROP_CHECKPOINTS} is not strictly increasing")
    return ids, offs


def encode_checksums_property(chunk_size: int, crcs: Sequence[int]) -> str:
    return f"crc32c/{chunk_size}/" + base64.b64encode(struct.pack(f">{len(crcs)}I", *crcs)).decode("ascii")


def decode_checksums_property(value: str, object_length: int, what: str) -> ChunkChecksums:
    try:
        algo, size, b64 = value.split("/", 2)
        chunk = int(size)
        raw = base64.b64decode(b64.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise FormatError(f"{what}: {PROP_CHECKSUMS} is malformed: {e}") from e
    if algo != "crc32c" or chunk <= 0 or len(raw) % 4:
        raise FormatError(f"{what}: {PROP_CHECKSUMS} is malformed ({algo}, chunk {chunk}, {len(raw)} bytes)")
    crcs = struct.unpack(f">{len(raw) // 4}I", raw)
    if len(crcs) != -(-object_length // chunk):
        raise FormatError(f"{what}: {len(crcs)} chunk checksums for a {object_length}-byte object in {chunk}-byte chunks")
    return ChunkChecksums(chunk, tuple(crcs), object_length)


def segment_sections(
    plan: SegmentPlan,
    sizes: Sequence[int] | None = None,
    timestamps: Sequence[int] | None = None,
    checkpoint_interval: int = 0,
    checksums: tuple[int, Sequence[int]] | None = None,
) -> list[LedgerSection]:
    """The V2 index sections of ``plan``: per ledger ``entries`` = last entry in the segment + 1 (what
    Pulsar's reader takes as the ledger's last entry there), ``size`` (default: the run's payload bytes),
    ``timestamp`` when given (a sealed ledger whose last entry is in this segment)."""
    out: list[LedgerSection] = []
    # the blocks of each run, in one pass (a compacted segment holds thousands of runs)
    by_run: list[list[SegmentBlock]] = [[] for _ in plan.runs]
    for b in plan.blocks:
        by_run[b.run].append(b)
    for r, run in enumerate(plan.runs):
        entries = tuple(IndexEntry(b.first_entry, b.part_number, b.offset) for b in by_run[r])
        props: list[tuple[str, str]] = []
        cps = segment_checkpoints(plan, r, checkpoint_interval, by_run[r])
        if cps:
            props.append((PROP_CHECKPOINTS, encode_checkpoints_property(cps)))
        if checksums is not None and r == 0:
            props.append((PROP_CHECKSUMS, encode_checksums_property(*checksums)))
        out.append(LedgerSection(
            ledger_id=run.ledger_id,
            entries=run.last_entry + 1,
            size=sizes[r] if sizes is not None else run.payload_bytes,
            index_entries=entries,
            timestamp=timestamps[r] if timestamps is not None else 0,
            properties=tuple(props),
        ))
    return out


def segment_checksums(index: SegmentIndex, what: str) -> ChunkChecksums | None:
    """The chunk checksums recorded in the index (this project's segments), else None."""
    for s in index.sections.values():
        v = s.property(PROP_CHECKSUMS)
        if v is not None:
            return decode_checksums_property(v, index.data_object_length, what)
    return None


# ================================================================================================
# decoding
# ================================================================================================


@dataclass(frozen=True)
class StreamingBlock:
    ledger_id: int
    first_entry_id: int
    block_size: int
    entries: list[tuple[int, bytes]]
    data_end: int  # offset (in the buffer) where the frames end and padding begins


def parse_block_header(buf: Buffer, offset: int = 0) -> tuple[int, int, int]:
    """``(ledger id, first entry id, block length)`` of the streaming block at ``offset``."""
    mv = memoryview(buf)
    if offset < 0:  # an offset read from an index: never count from the buffer's end
        raise FormatError(f"streaming block at negative offset {offset}")
    if len(mv) - offset < BLOCK_HEADER_LENGTH:
        raise TruncatedError(f"streaming block at {offset}: header needs {BLOCK_HEADER_LENGTH} bytes")
    magic, hlen, blen, first, lid = _HEADER.unpack_from(mv, offset)
    if magic != STREAMING_BLOCK_MAGIC:
        raise InvalidMagicError(f"Data block header magic word not match. read: 0x{magic:08x} "
                                f"expected: 0x{STREAMING_BLOCK_MAGIC:08x} (at offset {offset})")
    if hlen != BLOCK_HEADER_LENGTH:
        raise FormatError(f"streaming block at {offset}: header length {hlen}, expected {BLOCK_HEADER_LENGTH}")
    if blen < BLOCK_HEADER_LENGTH:
        raise FormatError(f"streaming block at {offset}: block length {blen} is below the header length")
    if bytes(mv[offset + _HEADER.size: offset + BLOCK_HEADER_LENGTH]) != _ZEROS:
        raise FormatError(f"streaming block at {offset}: header bytes 36..127 are not zero")
    return lid, first, blen


def decode_streaming_block(buf: Buffer, offset: int = 0) -> StreamingBlock:
    """Parse and check one block: consecutive entry ids from the header's first entry, frames inside
    the block, the rest exactly the padding pattern."""
    mv = memoryview(buf)
    lid, first, blen = parse_block_header(mv, offset)
    end = offset + blen
    if end > len(mv):
        raise TruncatedError(f"streaming block at {offset}: {blen} bytes, buffer ends at {len(mv)}")
    scan = scan_frames(mv, offset + BLOCK_HEADER_LENGTH, end, first)
    data_end = scan.next_pos
    pad = bytes(mv[data_end:end])
    if pad != padding(len(pad)):
        raise FormatError(f"streaming block at {offset} (ledger {lid}): bytes after the last frame are not "
                          f"the {BLOCK_PADDING.hex()} padding")
    if not scan.entries:
        raise FormatError(f"streaming block at {offset} (ledger {lid}): no entries")
    return StreamingBlock(lid, first, blen, scan.entries, data_end)


def iter_segment(data: Buffer, index: SegmentIndex) -> Iterator[tuple[int, int, bytes]]:
    """``(ledger id, entry id, payload)`` of every entry, in object order, checked against the index:
    blocks tile the object, each where the index says, of the ledger it says, each ledger's entries
    consecutive from its section's first entry to ``entries - 1``, each section's index entries
    increasing (lookups bisect them) and no two index entries at one offset."""
    mv = memoryview(data)
    if len(mv) != index.data_object_length:
        raise FormatError(f"segment data object is {len(mv)} bytes, the index says {index.data_object_length}")
    at: dict[int, tuple[int, IndexEntry]] = {}
    for lid, s in index.sections.items():
        for prev, e in zip(s.index_entries, s.index_entries[1:], strict=False):
            if e.first_entry_id <= prev.first_entry_id or e.offset <= prev.offset:
                raise FormatError(f"segment index, ledger {lid}: index entry {e} does not follow {prev} "
                                  f"(entry ids and offsets increase within a ledger)")
        for e in s.index_entries:
            if e.offset in at:
                raise FormatError(f"segment index: ledgers {at[e.offset][0]} and {lid} both have a block at "
                                  f"offset {e.offset}")
            at[e.offset] = (lid, e)
    nxt: dict[int, int] = {lid: s.first_entry_id for lid, s in index.sections.items()}
    pos = 0
    while pos < len(mv):
        if pos not in at:
            raise FormatError(f"segment: a block starts at offset {pos} but the index has no entry there")
        lid, ie = at.pop(pos)
        blk = decode_streaming_block(mv, pos)
        if blk.ledger_id != lid or blk.first_entry_id != ie.first_entry_id:
            raise FormatError(f"segment block at {pos}: header says ledger {blk.ledger_id} entry "
                              f"{blk.first_entry_id}, the index says ledger {lid} entry {ie.first_entry_id}")
        if blk.first_entry_id != nxt[lid]:
            raise FormatError(f"segment block at {pos}: ledger {lid} continues at entry {blk.first_entry_id}, "
                              f"expected {nxt[lid]}")
        for eid, payload in blk.entries:
            yield lid, eid, payload
        nxt[lid] = blk.entries[-1][0] + 1
        pos += blk.block_size
    if at:
        raise FormatError(f"segment: index entries at offsets {sorted(at)[:5]} point past the blocks")
    for lid, s in index.sections.items():
        if nxt[lid] != s.entries:
            raise FormatError(f"segment: ledger {lid} ends at entry {nxt[lid] - 1}, its section says {s.entries - 1}")


def frame_header(length: int, entry_id: int) -> bytes:
    return _FRAME.pack(length, entry_id)
