"""Read handle of an offloaded ledger (docs/formats.md).

The index is parsed once per handle. Reads seek with an exact cached offset, or the nearest checkpoint
of the index trailer (an exact frame offset every few KiB, written by this project's offloader), or
the index's floor block, and walk frames, fetching ranged GETs:

* a read that continues where an earlier read of this handle stopped is a sequential stream and fetches
  whole `read_buffer` windows (few requests for catch-up readers);
* any other read fetches about what it is expected to return (requested entries x average entry size),
  so random reads fetch little more than they return.

Fetched windows are kept in a small LRU shared by the handle's readers, so concurrent readers at
different positions keep their own buffered bytes instead of evicting one shared buffer (Pulsar #18723).

When the index carries chunk checksums (this project's objects, docs/formats.md) every fetch covers
whole chunks and is verified before any byte of it is used: a flipped byte fails the read with
CorruptObjectError naming the object and range, never returns other data. Pulsar's objects have no
checksums and read as before (frame ids and lengths are still checked).
"""

from __future__ import annotations

import struct
import threading
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

from tieredcore.errors import BadRangeError, FormatError
from tieredcore.formats import constants as C
from tieredcore.formats.index import LedgerIndex, index_trailer
from tieredcore.formats.mlinfo import LedgerInfo
from tieredcore.formats.trailer import ChunkChecksums, IndexTrailer
from tieredcore.model import Entry, LedgerMetadata
from tieredcore.offload.cache import OffsetCache
from tieredcore.stores.blob import BlobStore

_FRAME = struct.Struct(">iq")
_MAX_WINDOWS = 8
_MAX_STREAMS = 16


@dataclass(frozen=True)
class ExpectedLedger:
    """What the topic's metadata says an offloaded ledger holds; opening checks the index against it."""

    entries: int | None = None
    size: int | None = None
    topic: str | None = None  # managed-ledger name

    @classmethod
    def of(cls, li: LedgerInfo, topic: str | None = None) -> ExpectedLedger:
        return cls(li.entries if li.HasField("entries") else None, li.size if li.HasField("size") else None, topic)


class OffloadedLedgerHandle:
    def __init__(
        self,
        store: BlobStore,
        key: str,
        ledger_id: int,
        index: LedgerIndex,
        read_buffer: int,
        offset_cache: OffsetCache,
        trailer: IndexTrailer | None = None,
        verify: bool = True,
    ) -> None:
        self.store = store
        self.key = key
        self._ledger_id = ledger_id
        self.index = index
        self.read_buffer = read_buffer
        self.offset_cache = offset_cache
        self._uuid = key.rsplit("/", 1)[-1][:36]
        self._object_length = index.data_object_length
        entries = max(index.last_entry_id + 1, 1)
        self._avg_frame = index.length / entries + C.ENTRY_HEADER_SIZE
        trailer = trailer if trailer is not None else index_trailer(index)
        # exact frame offsets inside blocks (index trailer extension; absent in Pulsar's objects)
        self._cp_ids, self._cp_offsets = trailer.checkpoint_ids, trailer.checkpoint_offsets
        # chunk checksums (absent in Pulsar's objects): fetches are chunk-aligned and verified
        self.checksums: ChunkChecksums | None = trailer.checksums
        self._verify = verify and self.checksums is not None
        self._lock = threading.Lock()
        self._windows: OrderedDict[int, bytes] = OrderedDict()  # start offset -> bytes
        self._streams: OrderedDict[int, None] = OrderedDict()  # offsets where earlier reads stopped
        self.requests = 0  # ranged GETs issued (observability and tests)
        self.bytes_fetched = 0
        self.index_bytes = 0  # size of the index object read to open this handle

    # -- ReadHandle ---------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self.index.last_entry_id

    @property
    def length(self) -> int:
        return self.index.length

    @property
    def is_closed(self) -> bool:
        return self.index.is_closed

    @property
    def metadata(self) -> LedgerMetadata:  # from the index
        return self.index.metadata

    def close(self) -> None:
        with self._lock:
            self._windows.clear()
            self._streams.clear()

    def read(self, first: int, last: int) -> list[Entry]:
        lac = self.index.last_entry_id
        if first < 0 or first > last or last > lac:
            raise BadRangeError(
                f"ledger {self._ledger_id}: bad read range {first}..{last} (last add confirmed {lac})"
            )
        cached = self.offset_cache.get(self._ledger_id, self._uuid, first)
        if cached is not None:
            pos, eid = cached, first
        else:
            block = self.index.lookup(first)
            pos, eid = block.offset + C.BLOCK_HEADER_LENGTH, block.first_entry_id
            i = bisect_right(self._cp_ids, first) - 1
            if i >= 0 and self._cp_ids[i] > eid:  # a checkpoint inside this block, at or before first
                pos, eid = self._cp_offsets[i], self._cp_ids[i]
        with self._lock:
            sequential = pos in self._streams

        out: list[Entry] = []
        append = out.append
        unpack = _FRAME.unpack_from
        key, objlen = self.key, self._object_length
        buf, bstart, bend = b"", 0, 0
        while eid <= last:
            if pos < bstart or pos + 12 > bend:
                bstart, buf = self._fetch(pos, 12, (last - eid + 1) * self._avg_frame, sequential)
                bend = bstart + len(buf)
            rel = pos - bstart
            if rel + 12 > len(buf):
                raise FormatError(f"{key}: truncated frame header at offset {pos}")
            length, fid = unpack(buf, rel)
            if length < 0 or (length == C.STREAMING_BLOCK_MAGIC and fid == C.BLOCK_HEADER_LENGTH
                              and self.index.lookup(eid).offset == pos):
                # padding, or the next block's header: continue at the block holding eid (a streaming
                # block's magic is positive: after a full block, one without padding, the next block's
                # [magic][header length 128] reads as a frame header)
                block = self.index.lookup(eid)
                nxt = block.offset + C.BLOCK_HEADER_LENGTH
                if block.first_entry_id != eid or nxt <= pos:
                    raise FormatError(f"{key}: entry {eid} expected at offset {pos}, found block end")
                pos = nxt
                continue
            if fid != eid:
                raise FormatError(f"{key}: expected entry {eid} at offset {pos}, found entry {fid}")
            end = pos + 12 + length
            if end > objlen:
                raise FormatError(f"{key}: entry {eid} of {length} bytes runs past the object end {objlen}")
            if end > bend:
                bstart, buf = self._fetch(pos, 12 + length, (last - eid + 1) * self._avg_frame, sequential)
                bend = bstart + len(buf)
                rel = pos - bstart
            if eid >= first:
                append(Entry(eid, buf[rel + 12 : rel + 12 + length]))
            pos = end
            eid += 1
        if last < lac:
            self.offset_cache.put(self._ledger_id, self._uuid, last + 1, pos)
        with self._lock:
            self._streams[pos] = None
            while len(self._streams) > _MAX_STREAMS:
                self._streams.popitem(last=False)
        return out

    # -- fetching -----------------------------------------------------------------------------

    def _fetch(self, pos: int, need: int, expected: float, sequential: bool) -> tuple[int, bytes]:
        """A window starting at or before pos that holds at least `need` bytes from pos (or the rest
        of the object)."""
        with self._lock:
            for start, data in reversed(self._windows.items()):
                if start <= pos and pos + need <= start + len(data):
                    self._windows.move_to_end(start)
                    return start, data
        # a random read fetches what it expects to return; without checksums a little slack absorbs a
        # wrong estimate, with checksums the widening to whole chunks does
        slack = 0 if self._verify else 4096
        size = self.read_buffer if sequential else min(self.read_buffer, int(expected) + slack)
        size = max(size, need)
        if pos >= self._object_length:
            raise FormatError(f"{self.key}: read at offset {pos} beyond object end {self._object_length}")
        start = pos
        if self._verify:  # windows start on a chunk boundary, so a stream's windows stay read_buffer long
            assert self.checksums is not None
            start -= start % self.checksums.chunk_size
            size = max(size, pos + need - start)
        start, data = self._get(start, min(start + size, self._object_length))
        if start + len(data) < pos + min(need, self._object_length - pos):
            raise FormatError(f"{self.key}: short read at offset {pos}: {start + len(data) - pos} bytes")
        with self._lock:
            self._windows[start] = data
            while len(self._windows) > _MAX_WINDOWS:
                self._windows.popitem(last=False)
        return start, data

    def _get(self, start: int, end: int) -> tuple[int, bytes]:
        """One ranged GET of ``[start, end)`` widened to whole chunks and verified when the object has
        checksums; returns (its start, its bytes)."""
        if self._verify:
            assert self.checksums is not None
            start, end = self.checksums.align(start, end)
        data = self.store.get_range(self.key, start, end - 1)
        with self._lock:
            self.requests += 1
            self.bytes_fetched += len(data)
        if self._verify:
            assert self.checksums is not None
            if len(data) != end - start:
                raise FormatError(f"{self.key}: short read of bytes {start}-{end - 1}: {len(data)} bytes")
            self.checksums.verify(data, start, self.key)
        return start, data

    def read_range(self, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` of the data object (verified like every fetch; not cached): for
        streaming scans such as verification against the hot tier."""
        if start < 0 or end > self._object_length or start >= end:
            raise BadRangeError(f"{self.key}: range {start}..{end} outside 0..{self._object_length}")
        got_start, data = self._get(start, end)
        mv = memoryview(data)[start - got_start : end - got_start]
        if len(mv) != end - start:
            raise FormatError(f"{self.key}: short read of bytes {start}-{end - 1}: {len(mv)} bytes")
        return mv
