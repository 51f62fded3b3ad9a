"""CRC32C over runs of whole frames ("frame ranges"): recorded by the hot tier as a ledger is written,
checked by the offloader and the deletion-lag cleanup's proof instead of one CRC per frame.

A ledger of 1 KiB entries has ~1,000 frames per MiB. Checking each frame's own CRC32C costs a C call, a
slice and a memoryview per frame (~0.45 us): more than the copy itself, and Python-level work that holds
the GIL while another thread copies. A CRC32C over ~1 MiB of consecutive frames proves the same bytes with
one call that releases the GIL. The frames' own CRCs stay in the hot index: they name the entry when a
range does not match.

Range ``k`` covers the frames of entries ``firsts[k] .. firsts[k + 1] - 1`` (the last one: through the
last entry), ``firsts[0] = 0``; a new range starts at the first frame that begins at least
``range_bytes`` after the start of the current one. File layout (big endian; docs/formats.md)::

    [magic "TRC1":u32][range bytes:u32][entries:i64][frames end:i64][count k:i32]
    k x [first entry:i64][frame offset:i64][crc32c:u32]
    [crc32c of every byte before:u32]

Pure bytes and arithmetic, no I/O.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from tieredcore.errors import FormatError, ValidationError

FRAME_RANGES_MAGIC = 0x54524331  # "TRC1"
DEFAULT_RANGE_BYTES = 1 << 20
_HEAD = struct.Struct(">IIqqi")
_RECORD = struct.Struct(">qqI")
_U32 = struct.Struct(">I")
_crc = crc32c.crc32c


@dataclass(frozen=True)
class FrameRanges:
    """The range CRCs of one sealed ledger of ``entries`` entries whose frames end at byte ``end``."""

    range_bytes: int
    entries: int
    end: int
    firsts: array  # 'q': first entry of each range
    offsets: array  # 'q': where that entry's frame starts (byte offset from the first frame)
    crcs: array  # 'I': CRC32C of the range's frames

    def __len__(self) -> int:
        return len(self.firsts)


def encode_frame_ranges(r: FrameRanges) -> bytes:
    if not (len(r.firsts) == len(r.offsets) == len(r.crcs)):
        raise ValidationError("frame ranges: firsts, offsets and crcs differ in length")
    body = _HEAD.pack(FRAME_RANGES_MAGIC, r.range_bytes, r.entries, r.end, len(r.firsts))
    flat: list[int] = []
    for rec in zip(r.firsts, r.offsets, r.crcs, strict=True):
        flat.extend(rec)
    body += struct.pack(">" + "qqI" * len(r.firsts), *flat)
    return body + _U32.pack(_crc(body))


def decode_frame_ranges(buf: bytes | bytearray | memoryview, entries: int, end: int) -> FrameRanges:
    """The ranges of a ledger of ``entries`` entries whose frames take ``end`` bytes: FormatError when the
    bytes are damaged or do not describe such a ledger (the caller then checks every frame instead)."""
    mv = memoryview(buf)
    if len(mv) < _HEAD.size + 4:
        raise FormatError(f"frame ranges: {len(mv)} bytes, shorter than a header")
    magic, range_bytes, n, n_end, count = _HEAD.unpack_from(mv, 0)
    if magic != FRAME_RANGES_MAGIC:
        raise FormatError(f"frame ranges: magic 0x{magic:08x}, expected 0x{FRAME_RANGES_MAGIC:08x}")
    size = _HEAD.size + _RECORD.size * count + 4
    if count <= 0 or len(mv) != size:
        raise FormatError(f"frame ranges: {count} records in {len(mv)} bytes (expected {size} bytes)")
    (stored,) = _U32.unpack_from(mv, size - 4)
    if _crc(mv[: size - 4]) != stored:
        raise FormatError("frame ranges: CRC32C of the file does not match")
    if (n, n_end) != (entries, end):  # written for other entries (a seal that a recovery later redid)
        raise FormatError(f"frame ranges: recorded for {n} entries in {n_end} bytes, the ledger holds {entries} "
                          f"in {end}")
    flat = struct.unpack_from(">" + "qqI" * count, mv, _HEAD.size)
    firsts, offsets, crcs = array("q", flat[0::3]), array("q", flat[1::3]), array("I", flat[2::3])
    if firsts[0] != 0 or offsets[0] != 0 or any(b <= a for a, b in zip(firsts, firsts[1:], strict=False)) \
            or any(b <= a for a, b in zip(offsets, offsets[1:], strict=False)) \
            or firsts[-1] >= entries or offsets[-1] >= end:
        raise FormatError(f"frame ranges: boundaries do not describe {entries} entries in {end} bytes")
    return FrameRanges(range_bytes, entries, end, firsts, offsets, crcs)


class RangeMismatch(FormatError):
    """Frames ``first .. stop - 1`` (bytes ``start .. end - 1`` of what was fed) do not hash to their
    range's CRC32C. ``entry``: the frame found to differ from its own CRC, when the caller's frame CRCs and
    the bytes were at hand (else None)."""

    def __init__(self, first: int, stop: int, start: int, end: int, got: int, want: int,
                 entry: int | None = None, entry_bytes: tuple[int, int] = (0, 0),
                 entry_crcs: tuple[int, int] = (0, 0)) -> None:
        self.first, self.stop, self.start, self.end, self.got, self.want = first, stop, start, end, got, want
        self.entry, self.entry_bytes, self.entry_crcs = entry, entry_bytes, entry_crcs
        super().__init__(f"entries {first}..{stop - 1} at bytes {start}-{end - 1}: CRC32C {got:08x}, "
                         f"recorded {want:08x}")


class RangeCheck:
    """Checks frames fed in entry order against a ledger's range CRCs.

    ``ends``: cumulative frame ends of the ledger (``ends[e]`` = where entry e's frame starts, relative to
    entry 0's; ``ends[-1]`` = the end), from its payload sizes; the ranges' offsets must agree with it.
    ``frame_crcs``: each frame's own CRC32C; with ``keep=True`` (the fed buffers are never reused) the
    pieces of the range being checked are kept, so a mismatch names the frame that differs."""

    def __init__(self, ranges: FrameRanges, ends: Sequence[int], frame_crcs: Sequence[int] | None = None,
                 keep: bool = False) -> None:
        n = len(ends) - 1
        if ranges.entries != n or ranges.end != ends[-1] or any(ends[f] != o for f, o in zip(ranges.firsts, ranges.offsets, strict=True)):
            raise FormatError(f"frame ranges do not match the ledger's {n} entries and their sizes")
        self.ranges, self.ends, self.frame_crcs = ranges, ends, frame_crcs
        self.keep = keep and frame_crcs is not None
        self.stops = [*ranges.firsts[1:], n]
        self.k = 0  # the range being checked
        self.crc = 0
        self.next = 0  # the entry the next piece must start with
        self.pieces: list[tuple[int, memoryview, int]] = []  # (first entry, frames, where they lie)

    def feed(self, first: int, data: memoryview, at: int = 0) -> None:
        """Frames of entries ``first ..`` (whole frames, exactly as many bytes as their sizes say);
        ``at``: where ``data`` lies in the caller's object, for the error message."""
        if first != self.next:
            raise FormatError(f"frame ranges: frames fed from entry {first}, expected entry {self.next}")
        ends = self.ends
        base = ends[first]
        stop = bisect_right(ends, base + len(data), first) - 1
        if ends[stop] - base != len(data):
            raise FormatError(f"frame ranges: {len(data)} bytes from entry {first} do not end on a frame")
        pos, eid = 0, first
        while self.k < len(self.stops) and self.stops[self.k] <= stop:
            nxt = self.stops[self.k]
            cut = ends[nxt] - base
            piece = data[pos:cut]
            self.crc = _crc(piece, self.crc)
            if self.keep:
                self.pieces.append((eid, piece, at + pos))
            self._close_range()
            pos, eid = cut, nxt
        if pos < len(data):
            piece = data[pos:]
            self.crc = _crc(piece, self.crc)
            if self.keep:
                self.pieces.append((eid, piece, at + pos))
        self.next = stop

    def _close_range(self) -> None:
        k, want = self.k, self.ranges.crcs[self.k]
        if self.crc != want:
            first, stop = self.ranges.firsts[k], self.stops[k]
            start, end = self.ends[first], self.ends[stop]
            raise self._name_frame(RangeMismatch(first, stop, start, end, self.crc, want))
        self.k += 1
        self.crc = 0
        self.pieces = []

    def _name_frame(self, e: RangeMismatch) -> RangeMismatch:
        """The first frame of the kept pieces whose own CRC differs (per-frame work on failure only)."""
        crcs, ends = self.frame_crcs, self.ends
        for first, piece, at in self.pieces:
            assert crcs is not None
            pos, eid = 0, first
            while pos < len(piece):
                size = ends[eid + 1] - ends[eid]
                got = _crc(piece[pos : pos + size])
                if got != crcs[eid]:
                    e.entry, e.entry_bytes, e.entry_crcs = eid, (at + pos, at + pos + size), (got, crcs[eid])
                    return e
                pos += size
                eid += 1
        return e

    def finish(self) -> None:
        """Every range was fed and matched."""
        if self.k != len(self.stops):
            raise FormatError(f"frame ranges: checked {self.k} of {len(self.stops)} ranges "
                              f"(frames fed through entry {self.next - 1})")


class RangeAccumulator:
    """Builds the range CRCs while frames are appended (the hot tier's writer): fed whole frames in order,
    with where each starts; ranges close at the first frame starting ``range_bytes`` or more after the
    current range's start."""

    def __init__(self, range_bytes: int = DEFAULT_RANGE_BYTES) -> None:
        if range_bytes <= 0:
            raise ValidationError(f"range bytes must be positive, got {range_bytes}")
        self.range_bytes = range_bytes
        self.firsts, self.offsets, self.crcs = array("q"), array("q"), array("I")
        self.first, self.offset, self.crc = 0, 0, 0  # the open range
        self.entries = 0
        self.end = 0

    def add(self, first: int, starts: Sequence[int], data: memoryview | bytes) -> None:
        """Frames of entries ``first ..`` (``data``, contiguous) starting at ``starts`` (absolute offsets,
        ascending, one per frame; ``data`` ends where the next frame will start)."""
        if first != self.entries or not starts or starts[0] != self.end:
            raise ValidationError(f"frame ranges: frames of entries from {first} at {starts[0] if starts else '?'}, "
                                  f"expected entry {self.entries} at {self.end}")
        base, pos, n = starts[0], 0, len(starts)
        mv = memoryview(data)
        while True:
            # the first frame of this batch starting at least range_bytes after the open range's start
            i = bisect_left(starts, self.offset + self.range_bytes)
            if i >= n:
                break
            if first + i > self.first:  # never an empty range (the batch's first frame may open one)
                cut = starts[i] - base
                self.crc = _crc(mv[pos:cut], self.crc)
                self.firsts.append(self.first)
                self.offsets.append(self.offset)
                self.crcs.append(self.crc)
                pos = cut
            self.first, self.offset, self.crc = first + i, starts[i], 0
        self.crc = _crc(mv[pos:], self.crc)
        self.entries = first + n
        self.end = base + len(mv)

    def result(self) -> FrameRanges | None:
        """The ranges of every frame added (None: no frame)."""
        if self.entries == 0:
            return None
        return FrameRanges(self.range_bytes, self.entries, self.end, array("q", [*self.firsts, self.first]),
                           array("q", [*self.offsets, self.offset]), array("I", [*self.crcs, self.crc]))

