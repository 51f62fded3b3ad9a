"""Proof that an offloaded copy reads back correctly, before anything relies on it alone.

:func:`verify_offloaded` streams a whole data object with ranged GETs (bounded memory: one window plus
one frame), checking every block's structure (magic, header length, block length, first entry id, zero
bytes, consecutive entry ids, the padding cycle), every chunk checksum the index carries (the handle
verifies each fetch), and, given the hot tier's per-entry CRC32C (which covers exactly the bytes of a
frame: 12-byte header + payload), every frame against the hot copy. Counts are not proof: a flipped
payload byte, a cut tail or a changed frame length all fail here with CorruptObjectError naming the
object and byte range.

Used before a hot copy is marked for deletion (deletion-lag cleanup), after a repair writes a
replacement copy, and by the deep scrub.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from tieredcore.errors import CorruptObjectError
from tieredcore.formats import constants as C
from tieredcore.formats.block import padding
from tieredcore.offload.reader import OffloadedLedgerHandle

DEFAULT_WINDOW = 8 * 1024 * 1024

_FRAME = struct.Struct(">iq")
_HEADER = struct.Struct(">Iqqq")  # magic, header length, block length, first entry id
_ZEROS = bytes(C.BLOCK_HEADER_ZEROS)
_crc = crc32c.crc32c


@dataclass
class VerifyReport:
    entries: int = 0
    blocks: int = 0
    bytes_read: int = 0
    requests: int = 0
    against_hot: bool = False


class _Stream:
    """Sequential views of a data object, fetched window by window (each fetch chunk-verified by the
    handle). Views never go backwards; every byte of the object is fetched exactly once."""

    def __init__(self, h: OffloadedLedgerHandle, window: int) -> None:
        self.h = h
        self.window = window
        self.length = h.index.data_object_length
        self.buf = memoryview(b"")
        self.start = 0  # object offset of buf[0]

    @property
    def end(self) -> int:
        return self.start + len(self.buf)

    def view(self, pos: int, n: int) -> memoryview:
        if pos < self.start:
            raise AssertionError(f"stream went backwards: {pos} < {self.start}")
        if pos + n > self.length:
            raise CorruptObjectError(f"{self.h.key}: structure runs past the object end {self.length} "
                                     f"(bytes {pos}-{pos + n - 1})")
        if pos + n > self.end:
            # fetch from where the last fetch stopped (never skipping a byte: each is verified), keeping
            # the unread tail of the buffer (less than one frame)
            keep_from = min(pos, self.end)
            keep = self.buf[keep_from - self.start :]
            stop = min(max(pos + n, self.end + self.window), self.length)
            new = self.h.read_range(self.end, stop)
            self.buf = memoryview(bytes(keep) + bytes(new)) if len(keep) else new
            self.start = keep_from
        return self.buf[pos - self.start : pos - self.start + n]


def verify_offloaded(
    h: OffloadedLedgerHandle, expected_crcs: Sequence[int] | None = None, *, window: int = DEFAULT_WINDOW
) -> VerifyReport:
    """Read the whole data object of ``h`` back and check it (see the module docstring).
    ``expected_crcs``: the hot copy's CRC32C per entry (frame header + payload), index = entry id."""
    idx = h.index
    key = h.key
    rep = VerifyReport(against_hot=expected_crcs is not None)
    req0, bytes0 = h.requests, h.bytes_fetched
    n_entries = idx.last_entry_id + 1
    if expected_crcs is not None and len(expected_crcs) != n_entries:
        raise CorruptObjectError(f"{key}: holds {n_entries} entries, the hot copy {len(expected_crcs)}")
    s = _Stream(h, window)
    blocks = idx.entries
    length = idx.data_object_length
    next_id = 0
    payload_total = 0
    for i, e in enumerate(blocks):
        end = blocks[i + 1].offset if i + 1 < len(blocks) else length
        magic, hl, size, first = _HEADER.unpack(s.view(e.offset, _HEADER.size))
        where = f"{key}: block {i} at bytes {e.offset}-{end - 1}"
        if magic != C.DATA_BLOCK_MAGIC:
            raise CorruptObjectError(f"{where}: magic 0x{magic:08x}, expected 0x{C.DATA_BLOCK_MAGIC:08x}")
        if hl != C.BLOCK_HEADER_LENGTH or size != end - e.offset or first != e.first_entry_id or first != next_id:
            raise CorruptObjectError(f"{where}: header says length {size}, header {hl}, first entry {first} "
                                     f"(index: length {end - e.offset}, first entry {e.first_entry_id}; "
                                     f"expected entry {next_id})")
        if s.view(e.offset + C.BLOCK_HEADER_USED, C.BLOCK_HEADER_ZEROS) != _ZEROS:
            raise CorruptObjectError(f"{where}: header bytes 28..127 are not zero")
        pos = e.offset + C.BLOCK_HEADER_LENGTH
        while pos + C.ENTRY_HEADER_SIZE <= end:
            flen, eid = _FRAME.unpack(s.view(pos, C.ENTRY_HEADER_SIZE))
            if flen < 0:
                break
            stop = pos + C.ENTRY_HEADER_SIZE + flen
            if stop > end:
                raise CorruptObjectError(f"{key}: frame at bytes {pos}-{stop - 1} (entry {eid}, length {flen}) "
                                         f"overruns block {i} ending at {end}")
            if eid != next_id:
                raise CorruptObjectError(f"{key}: frame at byte {pos} holds entry {eid}, expected {next_id}")
            if eid >= n_entries:  # a frame after the last entry (room left in the last block)
                raise CorruptObjectError(f"{key}: frame at byte {pos} holds entry {eid}, the index ends at "
                                         f"entry {n_entries - 1}")
            frame = s.view(pos, stop - pos)
            if expected_crcs is not None:
                got = _crc(frame)
                if got != expected_crcs[eid]:
                    raise CorruptObjectError(
                        f"{key}: entry {eid} at bytes {pos}-{stop - 1} differs from the hot copy "
                        f"(CRC32C {got:08x}, hot {expected_crcs[eid]:08x})")
            payload_total += flen
            next_id += 1
            pos = stop
        if next_id == first:
            raise CorruptObjectError(f"{where}: holds no entries")
        pad_start = pos
        while pos < end:  # padding (the FE DC DE AD cycle from its first byte), a window at a time
            n = min(end - pos, s.window)
            phase = (pos - pad_start) % 4
            if s.view(pos, n) != padding(n + phase)[phase:]:
                raise CorruptObjectError(f"{key}: bytes {pos}-{pos + n - 1} of block {i} are not padding")
            pos += n
        rep.blocks += 1
    if s.end != length:
        raise CorruptObjectError(f"{key}: data object has {length - s.end} bytes after its last block")
    if next_id != n_entries or payload_total != idx.length:
        raise CorruptObjectError(f"{key}: holds {next_id} entries / {payload_total} bytes, its index says "
                                 f"{n_entries} / {idx.length}")
    rep.entries = next_id
    rep.requests = h.requests - req0
    rep.bytes_read = h.bytes_fetched - bytes0
    return rep
