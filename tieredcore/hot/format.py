"""On-disk format of the hot tier's ledgers (tieredcore.hot.local) and the recovery of a torn tail.

One directory holds every ledger as three files:

- ``<id>.log`` — entry frames ``[len:int32 BE][entryId:int64 BE][payload]`` back to back. This is the
  frame format of the offload data block (docs/formats.md), so the offloader copies a contiguous byte range of
  this file straight into a block.
- ``<id>.idx`` — one fixed 16-byte record per entry, ``[offset:int64 BE][crc32c:uint32 BE][len:int32 BE]``;
  the CRC32C covers the whole frame (12-byte header + payload). Encoded and decoded in bulk with
  ``array`` + ``byteswap`` and extended slicing (no per-record Python loop).
- ``<id>.rng`` — written at seal by the writer: CRC32C per ~1 MiB run of whole frames
  (tieredcore.formats.frame_ranges), what offload and the lag cleanup's proof check instead of every
  frame's CRC. Optional: a ledger sealed by recovery has none, and a damaged one is ignored (every frame
  is then checked on its own).
- ``<id>.meta`` — BookKeeper ``LedgerMetadataFormat`` protobuf (docs/metadata.md). An OPEN ledger stores
  lastEntryId -1 and length 0 there: its last add confirmed is the number of valid index records.

``LEDGER_ID`` holds the last allocated id, zero-padded to ``COUNTER_WIDTH`` digits.

This module only knows bytes and file descriptors; opening, locking and replacing the files is the
store's business.
"""

from __future__ import annotations

import array
import itertools
import operator
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import replace

import crc32c

from tieredcore.errors import CorruptEntryError, FormatError
from tieredcore.fileio import pread_exact
from tieredcore.formats.ledger_metadata import decode_ledger_metadata, encode_ledger_metadata
from tieredcore.model import STATE_CLOSED, LedgerMetadata

FRAME_HEADER = struct.Struct(">iq")  # [len:int32][entryId:int64]
FRAME_HEADER_LEN = FRAME_HEADER.size  # 12
IDX_RECORD = struct.Struct(">qIi")  # [offset:int64][crc32c:uint32][len:int32]
IDX_RECORD_LEN = IDX_RECORD.size  # 16
MAX_ENTRY_SIZE = 2**31 - 1 - FRAME_HEADER_LEN

# File kinds: a ledger's files are named "<id>.<kind>"
META = "meta"
LOG = "log"
IDX = "idx"
RNG = "rng"
KINDS = (META, LOG, IDX, RNG)
COUNTER_FILE = "LEDGER_ID"
COUNTER_WIDTH = 20

_crc = crc32c.crc32c
_LITTLE = sys.byteorder == "little"
_EMPTY_I = array.array("i")
assert array.array("q").itemsize == 8 and array.array("I").itemsize == 4 and _EMPTY_I.itemsize == 4


def ledger_file(root: str, ledger_id: int, kind: str) -> str:
    return os.path.join(root, f"{ledger_id}.{kind}")


# --- .meta -----------------------------------------------------------------------------------


def encode_metadata(meta: LedgerMetadata) -> bytes:
    """The .meta file: BookKeeper LedgerMetadataFormat; an OPEN ledger stores lastEntryId -1, length 0
    (its LAC lives in the .idx), as BookKeeper does."""
    if meta.state != STATE_CLOSED:
        meta = replace(meta, last_entry_id=-1, length=0)
    return encode_ledger_metadata(meta)


def decode_metadata(ledger_id: int, data: bytes) -> LedgerMetadata:
    meta = decode_ledger_metadata(data, ledger_id)
    if meta.state != STATE_CLOSED:
        meta = replace(meta, last_entry_id=-1, length=0)
    elif meta.last_entry_id < -1 or meta.length < 0:  # sizes the index read: never negative
        raise FormatError(
            f"ledger {ledger_id}: sealed metadata with lastEntryId {meta.last_entry_id}, length {meta.length}"
        )
    return meta


# --- .idx ------------------------------------------------------------------------------------


def encode_index(offsets: Sequence[int], crcs: array.array, lens: array.array, end: int) -> array.array:
    """Index records of frames at `offsets` (all below `end`) with their CRCs and payload lengths, as
    an array of 4 native uint32 words a record (offset hi, offset lo, crc, len) already swapped to big
    endian: write it as is. C-level map/array operations, no per-record bytecode."""
    n = len(offsets)
    words = array.array("I", bytes(16 * n))
    if end >= 1 << 32:
        words[0::4] = array.array("I", map(operator.rshift, offsets, itertools.repeat(32)))
        words[1::4] = array.array("I", map(operator.and_, offsets, itertools.repeat(0xFFFFFFFF)))
    else:
        words[1::4] = array.array("I", offsets)
    words[2::4] = crcs
    words[3::4] = array.array("I", lens)
    if _LITTLE:
        words.byteswap()
    return words


def decode_index(buf: bytes | bytearray | memoryview) -> tuple[array.array, array.array, array.array]:
    """(offsets 'q', crcs 'I', lens 'i') of a buffer of whole 16-byte records — C-level, no loop."""
    mv = memoryview(buf)
    n = len(mv) // IDX_RECORD_LEN
    mv = mv[: n * IDX_RECORD_LEN]
    q = array.array("q")
    q.frombytes(mv)
    w = array.array("I")
    w.frombytes(mv)
    if _LITTLE:
        q.byteswap()
        w.byteswap()
    offsets = q[0::2]
    crcs = w[2::4]
    lens = array.array("i")
    lens.frombytes(w[3::4].tobytes())  # reinterpret (already native order) as signed
    return offsets, crcs, lens


def read_index(idx_fd: int, meta: LedgerMetadata) -> tuple[array.array, array.array, array.array]:
    """The whole records of an .idx, decoded; of a sealed ledger no more than its metadata's entries
    (a longer file is not read past them)."""
    size = os.fstat(idx_fd).st_size
    if meta.state == STATE_CLOSED:
        size = min(size, (meta.last_entry_id + 1) * IDX_RECORD_LEN)
    return decode_index(pread_exact(idx_fd, size - size % IDX_RECORD_LEN, 0))


def metadata_with_index(meta: LedgerMetadata, offsets: array.array, lens: array.array) -> LedgerMetadata:
    """The metadata a read handle reports: a sealed ledger's, once its index agrees with it
    (CorruptEntryError otherwise); an OPEN ledger's with the LAC and length its index records give."""
    ledger_id = meta.ledger_id
    n = len(offsets)
    if meta.state == STATE_CLOSED:
        if n != meta.last_entry_id + 1:
            raise CorruptEntryError(
                f"ledger {ledger_id}: index holds {n} records, metadata says {meta.last_entry_id + 1} entries"
            )
        if sum(lens) != meta.length:
            raise CorruptEntryError(
                f"ledger {ledger_id}: index sizes sum to {sum(lens)}, metadata length {meta.length}"
            )
        return meta
    return replace(meta, last_entry_id=n - 1, length=sum(lens))


# --- recovery --------------------------------------------------------------------------------


def cut_torn_tail(log_fd: int, idx_fd: int) -> tuple[int, int, int]:
    """Recovery of an OPEN ledger (caller holds the writer lock): returns (entries, log end, length).

    Truncate .idx to whole records; drop records from the end whose frame is not inside .log, is not
    contiguous with the previous record, has a wrong header or fails its CRC; truncate .log after the
    last valid frame. Only the tail is examined; earlier entries are verified on read.
    """
    idx_size = os.fstat(idx_fd).st_size
    log_size = os.fstat(log_fd).st_size
    n = idx_size // IDX_RECORD_LEN
    changed = False
    if idx_size != n * IDX_RECORD_LEN:
        os.ftruncate(idx_fd, n * IDX_RECORD_LEN)
        changed = True

    def record(k: int) -> tuple[int, int, int]:
        return IDX_RECORD.unpack(pread_exact(idx_fd, IDX_RECORD_LEN, k * IDX_RECORD_LEN))

    def valid(k: int, off: int, crc: int, size: int) -> bool:
        if off < 0 or size < 0 or off + FRAME_HEADER_LEN + size > log_size:
            return False
        if k == 0:
            if off != 0:
                return False
        else:
            prev_off, _, prev_size = record(k - 1)
            if prev_off + FRAME_HEADER_LEN + prev_size != off:
                return False
        frame = pread_exact(log_fd, FRAME_HEADER_LEN + size, off)
        if len(frame) != FRAME_HEADER_LEN + size or FRAME_HEADER.unpack_from(frame) != (size, k):
            return False
        return _crc(frame) == crc

    k = n - 1
    end = 0
    while k >= 0:
        off, crc, size = record(k)
        if valid(k, off, crc, size):
            end = off + FRAME_HEADER_LEN + size
            break
        k -= 1
    entries = k + 1
    if entries != n:
        os.ftruncate(idx_fd, entries * IDX_RECORD_LEN)
        changed = True
    if log_size != end:
        os.ftruncate(log_fd, end)
        changed = True
    if changed:
        os.fsync(log_fd)
        os.fsync(idx_fd)
    length = 0
    if entries:
        idx = pread_exact(idx_fd, entries * IDX_RECORD_LEN, 0)
        length = sum(decode_index(idx)[2])
    return entries, end, length
