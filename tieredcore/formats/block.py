"""V1 ledger data blocks (docs/formats.md): frames, block planning, block encoding, decoding and checking.

Entry frame: ``[len:int32 BE][entryId:int64 BE][payload]``. The hot tier stores entries in exactly
this framing, so an offloaded block is ``header + one contiguous slice of frames + padding``:
:func:`plan_blocks` says where each slice starts and ends, :func:`build_block` wraps it.

Everything here is bulk: frame encoding is ``map``/``zip``/``bytes.join`` (no Python bytecode per
entry), planning is cumulative sums + ``bisect`` (Python work per *block*, not per entry). Walking
frames is inherently one step per entry (lengths are variable) and uses one ``unpack_from`` each.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import itemgetter
from typing import NamedTuple

from tieredcore.errors import (
    FormatError,
    InvalidMagicError,
    LedgerStateError,
    TruncatedError,
    ValidationError,
)
from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    BLOCK_HEADER_USED,
    BLOCK_HEADER_ZEROS,
    BLOCK_PADDING,
    DATA_BLOCK_MAGIC,
    ENTRY_HEADER_SIZE,
    MAX_ENTRY_SIZE,
    MIN_BLOCK_SIZE,
)
from tieredcore.formats.index import IndexEntry, LedgerIndex

Buffer = bytes | bytearray | memoryview

_BULK_ENTRIES = 16384  # from here on frame_ends sums with numpy
_FRAME = struct.Struct(">iq")
_INT = struct.Struct(">i")
_BLOCK_HEADER = struct.Struct(">Iqqq")  # magic, header length, block length, first entry id
_ZEROS = bytes(BLOCK_HEADER_ZEROS)


def _bytes_view(buf: Buffer) -> memoryview:
    mv = memoryview(buf)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


# ================================================================================================
# encoding
# ================================================================================================


def encode_frames(entries: Iterable[tuple[int, Buffer]]) -> bytes:
    """Concatenated frames ``[len][entryId][payload]`` of ``(entry_id, payload)`` pairs, in order."""
    pairs = entries if isinstance(entries, list | tuple) else list(entries)
    if not pairs:
        return b""
    ids = list(map(itemgetter(0), pairs))
    payloads = list(map(itemgetter(1), pairs))
    try:
        headers = list(map(_FRAME.pack, map(len, payloads), ids))
    except struct.error as e:
        raise ValidationError(f"entry id or payload length out of range for a frame: {e}") from e
    return b"".join(chain.from_iterable(zip(headers, payloads, strict=True)))


def encode_consecutive_frames(first_entry_id: int, payloads: Sequence[Buffer]) -> bytes:
    """Frames of ``payloads`` with entry ids ``first_entry_id, first_entry_id + 1, ...``."""
    try:
        headers = list(
            map(_FRAME.pack, map(len, payloads), range(first_entry_id, first_entry_id + len(payloads)))
        )
    except struct.error as e:
        raise ValidationError(f"entry id or payload length out of range for a frame: {e}") from e
    return b"".join(chain.from_iterable(zip(headers, payloads, strict=True)))


def block_header(first_entry_id: int, block_size: int) -> bytes:
    """The 128-byte V1 block header: magic, 128, block size, first entry id, 100 zero bytes."""
    try:
        head = _BLOCK_HEADER.pack(DATA_BLOCK_MAGIC, BLOCK_HEADER_LENGTH, block_size, first_entry_id)
    except struct.error as e:
        raise ValidationError(f"block header field out of range: {e}") from e
    return head + _ZEROS


def padding(n: int) -> bytes:
    """``n`` bytes of the ``FE DC DE AD`` cycle, starting at ``FE``."""
    if n < 0:
        raise ValidationError(f"negative padding length {n}")
    q, r = divmod(n, 4)
    return BLOCK_PADDING * q + BLOCK_PADDING[:r]


@dataclass(frozen=True)
class BlockPlan:
    """One block of a data object: entries ``first_entry..last_entry`` whose frames take
    ``frames_length`` (= sum of 12 + len) bytes; the rest after the header is padding."""

    first_entry: int
    last_entry: int
    block_size: int
    frames_length: int

    @property
    def entry_count(self) -> int:
        return self.last_entry - self.first_entry + 1

    @property
    def payload_length(self) -> int:
        return self.frames_length - ENTRY_HEADER_SIZE * self.entry_count

    @property
    def padding_length(self) -> int:
        return self.block_size - BLOCK_HEADER_LENGTH - self.frames_length


def frame_ends(entry_sizes: Sequence[int]) -> Sequence[int]:
    """Cumulative frame bytes: element i = total frame bytes of entries 0..i-1 (n + 1 elements), as an
    ``array('q')``. Shared by plan_blocks and checkpoints_for (computed once per ledger). Large ledgers go
    through numpy: a million entries cost ~80 ms as Python ints, ~10 ms as one cumulative sum."""
    n = len(entry_sizes)
    out = array("q")
    if n < _BULK_ENTRIES:
        out.extend(accumulate(map(ENTRY_HEADER_SIZE.__add__, entry_sizes), initial=0))
        return out
    import numpy as np  # imported here: a 60 ms import that small ledgers (and most CLI runs) never need

    ends = np.empty(n + 1, dtype=np.int64)
    ends[0] = 0
    np.cumsum(np.asarray(entry_sizes, dtype=np.int64) + ENTRY_HEADER_SIZE, out=ends[1:])
    out.frombytes(ends.tobytes())
    return out


def _one_size(sizes: Sequence[int]) -> bool:
    """Whether every entry in ``sizes`` (non-empty) has the same size (compared as bytes when an array)."""
    if isinstance(sizes, array):
        return sizes == array(sizes.typecode, sizes[:1]) * len(sizes)
    return min(sizes) == max(sizes)


def plan_blocks(entry_sizes: Sequence[int], max_block_size: int, cum: Sequence[int] | None = None) -> list[BlockPlan]:
    """Split a ledger with payload sizes ``entry_sizes`` (entry ids 0..n-1) into blocks.

    Block starting at entry ``first`` after ``written`` payload bytes (docs/formats.md):
    ``min(maxBlockSize, (LAC - first + 1) * 12 + (ledgerLength - written) + 128)``; greedy packing,
    entries never split, so every block but the last is exactly ``max_block_size`` and the last has
    no padding. Work is O(n) in C (cumulative sums) plus O(blocks * log n) bisects.
    """
    if max_block_size < MIN_BLOCK_SIZE:
        raise ValidationError(
            f"max block size {max_block_size} is below the minimum {MIN_BLOCK_SIZE} "
            f"(block header {BLOCK_HEADER_LENGTH} + entry header {ENTRY_HEADER_SIZE})"
        )
    n = len(entry_sizes)
    if n == 0:
        raise LedgerStateError("cannot offload a ledger with no entries")
    smallest, largest = min(entry_sizes), max(entry_sizes)
    if smallest < 0:
        raise ValidationError(f"negative entry size {smallest}")
    if largest > MAX_ENTRY_SIZE:
        raise ValidationError(f"entry size {largest} exceeds the int32 frame length limit")
    if largest + MIN_BLOCK_SIZE > max_block_size:
        raise ValidationError(
            f"entry of {largest} bytes cannot fit a block of max block size {max_block_size} "
            f"(needs at least {largest + MIN_BLOCK_SIZE})"
        )
    # cum[i] = total frame bytes of entries 0..i-1
    if cum is None:
        cum = frame_ends(entry_sizes)
    elif len(cum) != n + 1:
        raise ValidationError(f"plan_blocks: {len(cum)} cumulative frame ends for {n} entries")
    total = cum[-1]
    capacity = max_block_size - BLOCK_HEADER_LENGTH
    plans: list[BlockPlan] = []
    first = 0
    while first < n:
        start = cum[first]
        remaining = total - start  # (LAC - first + 1) * 12 + (ledgerLength - written)
        if remaining <= capacity:
            plans.append(BlockPlan(first, n - 1, remaining + BLOCK_HEADER_LENGTH, remaining))
            break
        stop = bisect_right(cum, start + capacity, first, n + 1) - 1  # entries first..stop-1 fit
        plans.append(BlockPlan(first, stop - 1, max_block_size, cum[stop] - start))
        first = stop
    return plans


def block_offsets(plans: Sequence[BlockPlan]) -> list[int]:
    """Byte offset of every block in the data object (a running sum of block sizes from 0)."""
    return list(accumulate((p.block_size for p in plans[:-1]), initial=0)) if plans else []


def frames_offsets(plans: Sequence[BlockPlan]) -> list[int]:
    """Where each block's frame slice starts inside the ledger's concatenated frames."""
    return list(accumulate((p.frames_length for p in plans[:-1]), initial=0)) if plans else []


def index_entries_for(plans: Sequence[BlockPlan]) -> list[IndexEntry]:
    """V1 index entries ``(firstEntryId, partId = i + 1, offset)`` for the planned blocks."""
    return [
        IndexEntry(p.first_entry, i + 1, off)
        for i, (p, off) in enumerate(zip(plans, block_offsets(plans), strict=True))
    ]


def checkpoints_for(
    plans: Sequence[BlockPlan], entry_sizes: Sequence[int], interval: int, cum: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """``(entryId, frame offset)`` checkpoints inside blocks: in every block, the first frame at least
    ``interval`` bytes after the block's first frame or the previous checkpoint. A frame is then never
    more than ``interval`` bytes after the nearest index point or checkpoint before it. Python work
    per checkpoint (bisects over cumulative sums), not per entry."""
    if interval <= 0 or not plans:
        return []
    if cum is None:
        cum = frame_ends(entry_sizes)
    out: list[tuple[int, int]] = []
    for plan, off in zip(plans, block_offsets(plans), strict=True):
        base = cum[plan.first_entry]
        data_start = off + BLOCK_HEADER_LENGTH
        first, last = plan.first_entry, plan.last_entry
        if _one_size(entry_sizes[first : last + 1]):  # entries of one size: every step-th entry
            frame = cum[first + 1] - base
            step = -(-interval // frame)
            ids = range(first + step, last + 1, step)
            out += zip(ids, range(data_start + step * frame, data_start + frame * (last - first) + 1, step * frame),
                       strict=True)
            continue
        last_cp = base
        while True:
            k = bisect_left(cum, last_cp + interval, plan.first_entry + 1, plan.last_entry + 1)
            if k > plan.last_entry:
                break
            out.append((k, data_start + cum[k] - base))
            last_cp = cum[k]
    return out


def _block_parts(plan: BlockPlan, frames: Buffer) -> tuple[bytes, Buffer, bytes]:
    mv = _bytes_view(frames)
    if len(mv) != plan.frames_length:
        raise ValidationError(
            f"block of entries {plan.first_entry}..{plan.last_entry}: got {len(mv)} frame bytes, "
            f"plan says {plan.frames_length}"
        )
    pad = plan.padding_length
    if pad < 0:
        raise ValidationError(
            f"block of entries {plan.first_entry}..{plan.last_entry}: frames ({plan.frames_length} "
            f"bytes) do not fit block size {plan.block_size}"
        )
    if len(mv) >= ENTRY_HEADER_SIZE:
        length, eid = _FRAME.unpack_from(mv, 0)
        if eid != plan.first_entry or length < 0:
            raise FormatError(
                f"block planned to start at entry {plan.first_entry}: frames start with entry {eid} "
                f"(length {length})"
            )
    return block_header(plan.first_entry, plan.block_size), mv, padding(pad)


def build_block(plan: BlockPlan, frames: Buffer) -> bytes:
    """``header + frames + padding`` for one planned block (``frames`` = the plan's frame slice)."""
    return b"".join(_block_parts(plan, frames))


def encode_data_object(entries: Sequence[Buffer], max_block_size: int) -> tuple[bytes, list[IndexEntry]]:
    """Whole data object of a ledger holding ``entries`` (ids 0..n-1), and its index entries."""
    plans = plan_blocks(list(map(len, entries)), max_block_size)
    frames = memoryview(encode_consecutive_frames(0, entries))
    parts: list[Buffer] = []
    for plan, start in zip(plans, frames_offsets(plans), strict=True):
        parts.extend(_block_parts(plan, frames[start : start + plan.frames_length]))
    return b"".join(parts), index_entries_for(plans)


# ================================================================================================
# decoding
# ================================================================================================


class FrameScan(NamedTuple):
    entries: list[tuple[int, bytes]]
    next_pos: int  # where the next frame (or the end marker) starts
    end_of_block: bool  # stopped at a negative length: padding or the next block's magic


def scan_frames(
    buf: Buffer,
    pos: int,
    end: int | None = None,
    first_id: int | None = None,
    last_id: int | None = None,
) -> FrameScan:
    """Walk frames from ``pos`` while a whole frame fits before ``end`` (default: buffer end).

    Stops at a negative length (``end_of_block=True``: padding or the next block's magic), at a
    frame that does not fit (``next_pos`` is its start: fetch more and resume), or after the frame
    of ``last_id``. With ``first_id``, ids must be consecutive from it (else FormatError).
    """
    mv = _bytes_view(buf)
    end = len(mv) if end is None else end
    if end > len(mv) or pos < 0:
        raise ValidationError(f"frame scan range {pos}..{end} outside buffer of {len(mv)} bytes")
    out: list[tuple[int, bytes]] = []
    append = out.append
    unpack = _FRAME.unpack_from
    expect = first_id
    while True:
        if pos + ENTRY_HEADER_SIZE <= end:
            length, eid = unpack(mv, pos)
        elif pos + 4 <= end:
            return FrameScan(out, pos, _INT.unpack_from(mv, pos)[0] < 0)
        else:
            return FrameScan(out, pos, False)
        if length < 0:
            return FrameScan(out, pos, True)
        stop = pos + ENTRY_HEADER_SIZE + length
        if stop > end:
            return FrameScan(out, pos, False)
        if expect is not None:
            if eid != expect:
                raise FormatError(f"frame at offset {pos} holds entry {eid}, expected entry {expect}")
            expect += 1
        append((eid, bytes(mv[pos + ENTRY_HEADER_SIZE : stop])))
        pos = stop
        if last_id is not None and eid >= last_id:
            return FrameScan(out, pos, False)


def parse_frames(
    buf: Buffer, pos: int, end: int | None = None, first_id: int | None = None
) -> list[tuple[int, bytes]]:
    """``(entry_id, payload)`` of every whole frame from ``pos`` (see :func:`scan_frames`)."""
    return scan_frames(buf, pos, end, first_id).entries


class DecodedBlock(NamedTuple):
    first_entry_id: int
    block_size: int
    entries: list[tuple[int, bytes]]


class _BlockScan(NamedTuple):
    first_entry_id: int
    block_size: int
    count: int
    payload_length: int
    entries: list[tuple[int, bytes]] | None


def _check_block_header(
    mv: memoryview, offset: int, span: int | None, first_id: int | None, what: str
) -> tuple[int, int]:
    """(first entry id, block length) from the header of the block at ``offset`` of ``mv``, after
    checking it (magic, header length, block length, first entry id, zeroed reserved bytes) and that
    the whole block lies within ``mv``; ``span`` / ``first_id``, what an index implies, if given."""
    limit = len(mv)
    if offset < 0:  # an index offset read from outside: never let it count from the buffer's end
        raise FormatError(f"{what} at negative offset {offset}")
    if limit - offset < BLOCK_HEADER_LENGTH:
        raise TruncatedError(
            f"block at offset {offset} truncated: header needs {BLOCK_HEADER_LENGTH} bytes, "
            f"{max(limit - offset, 0)} available"
        )
    magic, header_len, size, first = _BLOCK_HEADER.unpack_from(mv, offset)
    if magic != DATA_BLOCK_MAGIC:
        raise InvalidMagicError(
            f"Invalid MagicWord. read: 0x{magic:08x} expected: 0x{DATA_BLOCK_MAGIC:08x} "
            f"(block at offset {offset})"
        )
    if header_len != BLOCK_HEADER_LENGTH:
        raise FormatError(
            f"block at offset {offset}: header length {header_len}, expected {BLOCK_HEADER_LENGTH}"
        )
    if size < MIN_BLOCK_SIZE:
        raise FormatError(f"block at offset {offset}: block length {size} below minimum {MIN_BLOCK_SIZE}")
    if span is not None and size != span:
        raise FormatError(
            f"{what} at offset {offset}: block length {size} != next offset - this offset = {span}"
        )
    if first_id is not None and first != first_id:
        raise FormatError(
            f"{what} at offset {offset}: first entry id {first} != index first entry id {first_id}"
        )
    if first < 0:
        raise FormatError(f"block at offset {offset}: negative first entry id {first}")
    if offset + size > limit:
        raise TruncatedError(
            f"block at offset {offset} truncated: block length {size}, {limit - offset} bytes available"
        )
    if mv[offset + BLOCK_HEADER_USED : offset + BLOCK_HEADER_LENGTH] != _ZEROS:
        raise FormatError(f"block at offset {offset}: header bytes 28..127 are not all zero")
    return first, size


def _scan_block(
    mv: memoryview,
    offset: int,
    collect: bool,
    span: int | None = None,
    first_id: int | None = None,
    what: str = "block",
) -> _BlockScan:
    """Validate the block at ``offset`` of ``mv`` (header, frames, padding); with ``span`` /
    ``first_id`` also its length and first entry id as an index implies them."""
    first, size = _check_block_header(mv, offset, span, first_id, what)
    bend = offset + size
    entries: list[tuple[int, bytes]] | None = [] if collect else None
    unpack = _FRAME.unpack_from
    pos = offset + BLOCK_HEADER_LENGTH
    expect = first
    payload = 0
    while pos + ENTRY_HEADER_SIZE <= bend:
        length, eid = unpack(mv, pos)
        if length < 0:
            break
        stop = pos + ENTRY_HEADER_SIZE + length
        if stop > bend:
            raise FormatError(
                f"block at offset {offset}: frame at offset {pos} (entry {eid}, length {length}) "
                f"overruns the block end {bend}"
            )
        if eid != expect:
            raise FormatError(
                f"block at offset {offset}: frame at offset {pos} holds entry {eid}, expected {expect}"
            )
        if entries is not None:
            entries.append((eid, bytes(mv[pos + ENTRY_HEADER_SIZE : stop])))
        payload += length
        expect += 1
        pos = stop
    count = expect - first
    if count == 0:
        raise FormatError(f"block at offset {offset} holds no entries")
    if mv[pos:bend] != padding(bend - pos):
        raise FormatError(
            f"block at offset {offset}: bad padding: {bend - pos} bytes at offset {pos} are not "
            f"the FE DC DE AD cycle"
        )
    return _BlockScan(first, size, count, payload, entries)


def decode_block(buf: Buffer, offset: int = 0, *, exact: bool = True) -> DecodedBlock:
    """Decode and validate the block at ``offset``: magic (InvalidMagicError), header length 128,
    zero bytes, consecutive entry ids from the header's first id, the padding cycle.

    A buffer shorter than the block -> TruncatedError. With ``exact`` (default) the block must end
    exactly at the end of the buffer.
    """
    mv = _bytes_view(buf)
    scan = _scan_block(mv, offset, collect=True)
    if exact and offset + scan.block_size != len(mv):
        raise FormatError(
            f"block at offset {offset}: block length {scan.block_size} but {len(mv) - offset} bytes given"
        )
    assert scan.entries is not None
    return DecodedBlock(scan.first_entry_id, scan.block_size, scan.entries)


def iter_data_object(data: Buffer, index: LedgerIndex | Sequence[IndexEntry]) -> Iterator[tuple[int, bytes]]:
    """Yield ``(entry_id, payload)`` of every entry of a data object, block by block (validated)."""
    mv = _bytes_view(data)
    entries = index.entries if isinstance(index, LedgerIndex) else index
    for e in entries:
        yield from _scan_block(mv, e.offset, collect=True).entries or ()


def check_data_object(
    data: Buffer,
    index: LedgerIndex | Sequence[IndexEntry],
    max_block_size: int | None = None,
) -> None:
    """Data side of the structural checks of docs/formats.md; FormatError (or a subclass) on the first
    violation.

    Every block at its index offset: magic, header length 128, block length = next offset - this
    offset (last block: object end), first entry id = index id, 100 zero bytes, frames contiguous
    with consecutive ids (also across blocks, from 0), padding cycle, and every non-last block
    exactly ``max_block_size`` when given. With a :class:`LedgerIndex`, also the data object length,
    lastEntryId and payload length recorded in it.
    """
    mv = _bytes_view(data)
    entries = list(index.entries if isinstance(index, LedgerIndex) else index)
    if not entries:
        raise FormatError("index has no blocks")
    if isinstance(index, LedgerIndex) and index.data_object_length != len(mv):
        raise FormatError(f"data object is {len(mv)} bytes, index says {index.data_object_length}")
    if entries[0].offset != 0:
        raise FormatError(f"first block at offset {entries[0].offset}, expected 0")
    next_id = 0
    payload = 0
    n = len(entries)
    for i, e in enumerate(entries):
        end = entries[i + 1].offset if i + 1 < n else len(mv)
        if end <= e.offset:
            raise FormatError(f"block {i} at offset {e.offset}: next block offset {end} not above it")
        scan = _scan_block(mv, e.offset, False, end - e.offset, e.first_entry_id, f"block {i}")
        if scan.first_entry_id != next_id:
            raise FormatError(
                f"block {i} at offset {e.offset}: starts at entry {scan.first_entry_id}, expected {next_id}"
            )
        if max_block_size is not None and i < n - 1 and scan.block_size != max_block_size:
            raise FormatError(
                f"block {i} at offset {e.offset}: non-last block of {scan.block_size} bytes, "
                f"expected max block size {max_block_size}"
            )
        next_id += scan.count
        payload += scan.payload_length
    if isinstance(index, LedgerIndex):
        if next_id - 1 != index.last_entry_id:
            raise FormatError(
                f"data object ends at entry {next_id - 1}, index lastEntryId {index.last_entry_id}"
            )
        if payload != index.length:
            raise FormatError(f"data object holds {payload} payload bytes, index length {index.length}")
