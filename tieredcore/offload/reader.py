"""Read handle of an offloaded ledger (docs/formats.md).

The index is parsed once per handle. Reads seek with an exact cached offset, or the nearest checkpoint
of the index trailer (an exact frame offset every few KiB, written by this project's offloader) or, for
an object without one (Pulsar wrote it), of its entry-offsets sidecar (offload/sidecar.py: loaded once
per handle, recorded by a full pass), or the index's floor block, and walk frames, fetching ranged GETs:

* a read that continues where an earlier read of this handle stopped is a sequential stream and fetches
  windows of at least `stream_window` bytes (8 MiB: few requests for catch-up readers), and the next
  windows are asked for in the background before the current one is awaited (read-ahead);
* any other read fetches about what it is expected to return (requested entries x average entry size),
  so random reads fetch little more than they return.

Fetched windows are kept in a small LRU shared by the handle's readers, so concurrent readers at
different positions keep their own buffered bytes instead of evicting one shared buffer (Pulsar #18723).

The walk checks every frame (ids consecutive, lengths within the window and the object, padding and
block headers) without a Python step per entry where it can: frames of one payload length (fixed-size
messages) are checked a few hundred at a time by one struct unpack of their headers, other frames lying
wholly inside the window by a tight loop; payload offsets follow from the lengths afterwards, in C.

When the index carries chunk checksums (this project's objects, docs/formats.md) every fetch covers
whole chunks and is verified before any byte of it is used: a flipped byte fails the read with
CorruptObjectError naming the object and range, never returns other data. Pulsar's objects have no
checksums and read as before (frame ids and lengths are still checked).
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import struct
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tieredcore.cold.blob import BlobStore
from tieredcore.errors import BadRangeError, FormatError
from tieredcore.formats import constants as C
from tieredcore.formats import native
from tieredcore.formats.index import LedgerIndex, index_trailer
from tieredcore.formats.mlinfo import LedgerInfo
from tieredcore.formats.trailer import ChunkChecksums, IndexTrailer
from tieredcore.model import Entry, EntryBatch, LedgerMetadata
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.sidecar import OffsetsSidecar

_FRAME = struct.Struct(">iq")
_frames_c = native.cbatch.frames if native.cbatch else None
_MAX_WINDOWS = 8
_MAX_WINDOW_BYTES = 40 * 1024 * 1024  # fetched windows kept per handle (at least the newest one)
_MAX_STREAMS = 16
_MAX_AHEAD = 4  # windows read ahead at once per handle (for up to two concurrent streams)
# windows a stream reads ahead of the one being consumed. Measured on moto (bench/offload.py's S3 phase,
# 8 MiB windows): depths 2, 3 and 4 within each other's noise, at 1.0-1.2x download_file; 2 holds the
# least memory (24 MiB a stream). Real S3 serves ~50-100 MB/s per connection: there 4-8 windows in
# flight (and as many threads) would be the choice, as boto3's 10 threads of 8 MiB ranges.
_READ_AHEAD_DEPTH = 2
_READ_AHEAD_THREADS = 4

_read_ahead_pool: ThreadPoolExecutor | None = None
_read_ahead_pid = 0
_read_ahead_lock = threading.Lock()


def _read_ahead_executor() -> ThreadPoolExecutor:
    """The process's read-ahead threads (made again in a forked child, whose copy has no threads)."""
    global _read_ahead_pool, _read_ahead_pid
    with _read_ahead_lock:
        if _read_ahead_pool is None or _read_ahead_pid != os.getpid():
            _read_ahead_pool = ThreadPoolExecutor(_READ_AHEAD_THREADS, thread_name_prefix="read-ahead")
            _read_ahead_pid = os.getpid()
        return _read_ahead_pool


def _frames_in(buf: bytes, rel: int, eid: int, stop: int, lengths: array) -> tuple[int, int]:
    """The walk's inner loop: frames of entries eid..stop from ``buf[rel:]`` for as long as each lies
    wholly inside ``buf`` with the next frame's header (``rel + 12 <= len(buf)`` on entry), its id the
    next one and its length not negative; their lengths are appended to ``lengths``. Returns (where it
    stopped, the entry id there): whatever it does not take (padding, a block header, a frame crossing
    the window's end, a wrong id) the caller's loop handles and reports, so the checks stay the same. A
    streaming block's magic read as a length (a frame header's place after a full block) never fits."""
    lim = min(len(buf), C.STREAMING_BLOCK_MAGIC) - 24
    if _frames_c is not None:  # the same loop in C (tieredcore/formats/cbatch.c)
        rel, eid, got = _frames_c(buf, rel, eid, stop, lim)
        lengths.frombytes(got)
        return rel, eid
    rel, eid = _uniform_frames(buf, rel, eid, stop, lim, lengths)
    add, unpack = lengths.append, _FRAME.unpack_from
    for e in range(eid, stop + 1):
        length, fid = unpack(buf, rel)
        if fid != e or not 0 <= length <= lim - rel:
            return rel, e
        add(length)
        rel += 12 + length
    return rel, stop + 1


def _uniform_frames(buf: bytes, rel: int, eid: int, stop: int, lim: int, lengths: array) -> tuple[int, int]:
    """:func:`_frames_in` for frames of one payload length back to back (fixed-size messages), checked
    in C: each piece of k frames is one unpack of their k headers, compared with the expected lengths and
    ids. Taken only when the last frame that would fit has that length and its id (else, or when a
    piece differs, the plain loop goes on from where this stopped)."""
    length = _FRAME.unpack_from(buf, rel)[0]
    stride = length + 12
    if length < 0:
        return rel, eid
    n = min(stop - eid + 1, (lim - rel) // stride)  # frames ending by lim, as the plain loop requires
    if n < _UNIFORM_MIN or _FRAME.unpack_from(buf, rel + (n - 1) * stride) != (length, eid + n - 1):
        return rel, eid
    while n >= _UNIFORM_MIN:
        k = 1 << (min(n, _UNIFORM_PIECE).bit_length() - 1)
        got = _headers(length, k).unpack_from(buf, rel)
        if got[0::2].count(length) != k or got[1::2] != tuple(range(eid, eid + k)):
            break
        lengths.extend(array("i", (length,)) * k)
        rel, eid, n = rel + k * stride, eid + k, n - k
    return rel, eid


_UNIFORM_MIN = 16  # frames: fewer go through the plain loop
_UNIFORM_PIECE = 512  # frames per unpack (powers of two: a few Structs per payload length)
_MIXED_PIECE = 4096  # frames of several lengths per unpack


@functools.lru_cache(maxsize=64)
def _headers(length: int, k: int) -> struct.Struct:
    """The headers of k frames of ``length``-byte payloads back to back: (length, id) k times."""
    return struct.Struct(">" + f"iq{length}x" * k)


@functools.lru_cache(maxsize=64)
def _bodies(length: int, k: int) -> struct.Struct:
    """The payloads of k frames of ``length``-byte payloads back to back, as k bytes objects."""
    return struct.Struct(">" + f"12x{length}s" * k)


def _payloads(buf: bytes, at: int, lengths: array) -> Sequence[bytes]:
    """The payloads of back-to-back frames starting at ``at``, as bytes, by struct unpacks (no slice
    object per entry): one per few hundred when they all have one length (their Structs cached), else
    one per few thousand by a Struct made for their lengths (half the cost of slicing each)."""
    n = len(lengths)
    out: list[bytes] = []
    if n < _UNIFORM_MIN or lengths != array("i", lengths[:1]) * n:
        for i in range(0, n, _MIXED_PIECE):  # pieces: a Struct's format holds 64 bytes per entry
            piece = lengths[i : i + _MIXED_PIECE]
            out += struct.Struct(">" + "12x%ds" * len(piece) % tuple(piece)).unpack_from(buf, at)
            at += sum(piece) + 12 * len(piece)
        return out
    length = lengths[0]
    while n:
        k = 1 << (min(n, _UNIFORM_PIECE).bit_length() - 1)
        out += _bodies(length, k).unpack_from(buf, at)
        at, n = at + k * (length + 12), n - k
    return out


def _starts(at: int, lengths: array) -> Sequence[int]:
    """Payload offsets of back-to-back frames whose first starts at ``at``, computed in C (no loop per
    entry): a range when the frames have one length (nothing per entry at all)."""
    n = len(lengths)
    if n and lengths == array("i", lengths[:1]) * n:
        return range(at + 12, at + 12 + n * (lengths[0] + 12), lengths[0] + 12)
    if not n:
        return array("q")
    return array("q", itertools.accumulate(map(operator.add, lengths[:-1], itertools.repeat(12)), initial=at + 12))


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
        stream_window: int = C.DEFAULT_STREAM_WINDOW,
        read_ahead: bool = True,
        sidecar: OffsetsSidecar | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self._ledger_id = ledger_id
        self.index = index
        self.read_buffer = read_buffer
        # a sequential stream's windows: a GET per few MiB, the next one in flight while this one is read
        # (a store that reads ahead itself is asked for read_buffer windows, as before)
        self.stream_window = read_buffer if store.reads_ahead else max(read_buffer, stream_window)
        self.read_ahead = read_ahead and not store.reads_ahead
        self._ahead: OrderedDict[int, tuple[int, Future]] = OrderedDict()  # windows read ahead: start -> (end, fetch)
        self.offset_cache = offset_cache
        self._uuid = key.rsplit("/", 1)[-1][:36]
        self._object_length = index.data_object_length
        entries = max(index.last_entry_id + 1, 1)
        self._avg_frame = index.length / entries + C.ENTRY_HEADER_SIZE
        trailer = trailer if trailer is not None else index_trailer(index)
        # exact frame offsets inside blocks (index trailer extension; absent in Pulsar's objects)
        self._cp_ids, self._cp_offsets = trailer.checkpoint_ids, trailer.checkpoint_offsets
        # Pulsar's objects: the entry-offsets sidecar beside them gives the checkpoints (loaded on the first
        # read that needs them) and records them when a full pass reads every entry (offload/sidecar.py)
        self.sidecar = sidecar if not self._cp_ids else None
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

    def object_handles(self) -> list[OffloadedLedgerHandle]:
        """This handle: a V1 copy is one object pair (CopyHandle)."""
        return [self]

    def close(self) -> None:
        with self._lock:
            self._windows.clear()
            self._streams.clear()
            ahead, self._ahead = self._ahead, OrderedDict()
        for _end, fut in ahead.values():
            fut.cancel()  # a fetch already running finishes; its bytes are dropped

    def read(self, first: int, last: int) -> list[Entry]:
        runs, lengths = self._walk(first, last)
        out: list[Entry] = []
        i = 0
        for buf, a, _b, n in runs:  # payloads taken straight from the windows (one copy each)
            payloads = _payloads(buf, a, lengths[i : i + n])
            # Entry straight from (id, payload) pairs: what Entry._make does, without a Python frame each
            out += map(tuple.__new__, itertools.repeat(Entry), zip(range(first + i, first + i + n), payloads,
                                                                    strict=True))
            i += n
        return out

    def read_batch(self, first: int, last: int) -> EntryBatch:
        """Entries first..last as one EntryBatch. Frames lying in one fetched window are returned as that
        window (nothing copied); frames spread over several windows or blocks are joined once (large
        batches of large entries: a fresh allocation per call, so read a few MiB per call)."""
        runs, lengths = self._walk(first, last)
        if len(runs) == 1:
            buf, a, b, _n = runs[0]
            return EntryBatch(self._ledger_id, first, buf, _starts(a, lengths), lengths, a, b)
        joined = b"".join(memoryview(buf)[a:b] for buf, a, b, _n in runs)  # the frames, back to back
        return EntryBatch(self._ledger_id, first, joined, _starts(0, lengths), lengths, 0, len(joined))

    def _walk(self, first: int, last: int) -> tuple[list[tuple[bytes, int, int, int]], array]:
        """Walk the frames of entries first..last in place in the fetched windows (ids and lengths
        checked): ``(runs, lengths)``, a run ``(window, start, end, entries)`` being contiguous frames of
        the batch in one window, ``lengths`` the payload lengths (a run's payload offsets follow from its
        start and them: :func:`_starts`). A walk from a sidecar's checkpoint that does not find its frames
        drops the sidecar and walks the block (a sidecar never makes a read fail or return other bytes);
        a full pass feeds the sidecar."""
        pos, eid, span, from_sidecar = self._walk_start(first, last)
        try:
            got = self._walk_from(first, last, pos, eid, span)
        except FormatError as e:
            if not from_sidecar or self.sidecar is None:
                raise
            self.sidecar.discard(f"no frame of entry {eid} where its checkpoint says (offset {pos}): {e}")
            pos, eid, span, _ = self._walk_start(first, last)
            got = self._walk_from(first, last, pos, eid, span)
        side = self.sidecar
        if side is not None and side.recording and side.feed(first, got[1]):
            side.finish(background=True)  # the write never delays this read
        return got

    def _walk_from(self, first: int, last: int, pos: int, eid: int,
                   span: int) -> tuple[list[tuple[bytes, int, int, int]], array]:
        """:meth:`_walk` from the frame of entry ``eid`` at ``pos``; ``span``: an offset the frames of
        eid..last end at or before (0: unknown), so the first fetch of a random read can hold them all.
        Frames lying wholly inside the current window go through :func:`_frames_in`'s tight loop; the
        first frame of a run, the last of a window, padding and block headers through the loop here."""
        with self._lock:
            sequential = pos in self._streams
        lengths, skipped = array("i"), array("i")
        runs: list[tuple[bytes, int, int, int]] = []
        run = -1  # where the current run starts in buf (-1: none open)
        run_first = 0  # the batch index of its first entry
        unpack = _FRAME.unpack_from
        key, objlen = self.key, self._object_length
        buf, bstart, bend = b"", 0, 0
        while eid <= last:
            if pos < bstart or pos + 12 > bend:
                if run >= 0:
                    runs.append((buf, run, pos - bstart, eid - first - run_first))
                    run = -1
                expect = (last - eid + 1) * self._avg_frame
                if span > pos and span - pos < self.read_buffer:  # exact: the frames end before span
                    expect, span = max(expect, span - pos), 0
                bstart, buf = self._fetch(pos, 12, expect, sequential)
                bend = bstart + len(buf)
            rel = pos - bstart
            if (run >= 0 or eid < first) and rel + 12 <= len(buf):
                to, eid = _frames_in(buf, rel, eid, last if run >= 0 else first - 1,
                                     lengths if run >= 0 else skipped)
                pos += to - rel
                rel = to
                if eid > last:
                    break
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
                if run >= 0:  # the frames stop here: padding and a header are not part of the run
                    runs.append((buf, run, rel, eid - first - run_first))
                    run = -1
                pos = nxt
                continue
            if fid != eid:
                raise FormatError(f"{key}: expected entry {eid} at offset {pos}, found entry {fid}")
            end = pos + 12 + length
            if end > objlen:
                raise FormatError(f"{key}: entry {eid} of {length} bytes runs past the object end {objlen}")
            if end > bend:
                if run >= 0:
                    runs.append((buf, run, rel, eid - first - run_first))
                    run = -1
                bstart, buf = self._fetch(pos, 12 + length, (last - eid + 1) * self._avg_frame, sequential)
                bend = bstart + len(buf)
                rel = pos - bstart
            if eid >= first:
                if run < 0:
                    run, run_first = rel, eid - first
                lengths.append(length)
            pos = end
            eid += 1
        runs.append((buf, run, pos - bstart, last + 1 - first - run_first))
        self._walk_end(last, pos)
        return runs, lengths

    def _walk_start(self, first: int, last: int) -> tuple[int, int, int, bool]:
        """Check the range; then where a walk to ``first`` starts, as (object offset, entry id, span, from
        the sidecar): the frame the offset cache remembers for ``first``, else the last checkpoint at or
        before it inside its block (the index trailer's, or the sidecar's of a Pulsar-written object),
        else its block's first frame. ``span`` (objects without checksums, whose fetches are not widened to
        chunks): where the next checkpoint or block after ``last`` starts, else 0."""
        lac = self.index.last_entry_id
        if first < 0 or first > last or last > lac:
            raise BadRangeError(
                f"ledger {self._ledger_id}: bad read range {first}..{last} (last add confirmed {lac})"
            )
        cached = self.offset_cache.get(self._ledger_id, self._uuid, first)
        if cached is not None:
            return cached, first, 0, False
        block = self.index.lookup(first)
        pos, eid = block.offset + C.BLOCK_HEADER_LENGTH, block.first_entry_id
        ids, offs = self._cp_ids, self._cp_offsets
        side = False
        if not ids and eid < first and self.sidecar is not None:
            got = self.sidecar.checkpoints()  # one GET, the first time
            if got is not None:
                (ids, offs), side = got, True
        i = bisect_right(ids, first) - 1
        if i >= 0 and ids[i] > eid:  # a checkpoint inside this block, at or before first
            pos, eid = offs[i], ids[i]
        else:
            side = False
        span = 0
        if not self._verify and ids:  # the next checkpoint in last's block, else (a V1 index) the block's end
            j = bisect_right(ids, last)
            if j < len(ids) and self.index.lookup(ids[j]).offset == self.index.lookup(last).offset:
                span = offs[j]
            elif isinstance(self.index, LedgerIndex):
                span = self.index.lookup_span(last)[1]
        return pos, eid, span, side

    def _walk_end(self, last: int, pos: int) -> None:
        """Remember where a walk that read up to ``last`` stopped (``pos``): as the offset of entry
        last + 1, and as a stream, so that a read starting there counts as sequential."""
        if last < self.index.last_entry_id:
            self.offset_cache.put(self._ledger_id, self._uuid, last + 1, pos)
        with self._lock:
            self._streams[pos] = None
            while len(self._streams) > _MAX_STREAMS:
                self._streams.popitem(last=False)

    # -- fetching -----------------------------------------------------------------------------

    def _fetch(self, pos: int, need: int, expected: float, sequential: bool) -> tuple[int, bytes]:
        """A window starting at or before pos that holds at least `need` bytes from pos (or the rest
        of the object)."""
        with self._lock:
            held = self._held(pos, need)
            if held is not None:
                return held
            # the window read ahead by a stream, holding pos + need (the frame at pos may start in the
            # window before it: the two are bridged for that frame)
            ahead = next(((a, e, f) for a, (e, f) in self._ahead.items() if a <= pos + need <= e and
                          (a <= pos or any(s <= pos and s + len(d) == a for s, d in self._windows.items()))),
                         None)
            # the frame's bytes before the window read ahead (a part of one frame)
            tail = next((d[pos - s :] for s, d in self._windows.items() if ahead is not None and pos < ahead[0]
                         and s <= pos and s + len(d) == ahead[0]), None)
        if pos >= self._object_length:
            raise FormatError(f"{self.key}: read at offset {pos} beyond object end {self._object_length}")
        # a read continuing an earlier one, or one expecting at least a read buffer's worth of entries,
        # streams: whole windows, read ahead
        stream = sequential or expected >= self.read_buffer
        if ahead is None:
            # a random read fetches what it expects to return; without checksums a little slack absorbs a
            # wrong estimate, with checksums the widening to whole chunks does
            slack = 0 if self._verify else 4096
            size = self.stream_window if stream else min(self.read_buffer, int(expected) + slack)
            size = max(size, need)
            start = pos
            if self._verify:  # windows start on a chunk boundary, so a stream's windows keep their length
                assert self.checksums is not None
                start -= start % self.checksums.chunk_size
                size = max(size, pos + need - start)
            end = self._window_end(start, start + size) if stream else min(start + size, self._object_length)
            with self._lock:  # stop where a window held already begins (concurrent readers' streams)
                end = min([end, *(s for s in self._windows if pos + need <= s < end)])
        else:
            end = ahead[1]
        if stream and self.read_ahead:  # the next windows are on their way before this one is awaited
            self._read_ahead(self.checksums.align(end, end)[1] if self._verify and self.checksums else end)
        start, data = self._take_ahead(ahead) if ahead is not None else self._get(start, end)
        if start + len(data) < pos + min(need, self._object_length - pos):
            raise FormatError(f"{self.key}: short read at offset {pos}: {start + len(data) - pos} bytes")
        with self._lock:
            self._windows[start] = data
            total = sum(map(len, self._windows.values()))
            while len(self._windows) > 1 and (len(self._windows) > _MAX_WINDOWS or total > _MAX_WINDOW_BYTES):
                total -= len(self._windows.popitem(last=False)[1])
        if tail is not None:  # the frame at pos straddles the window before and this one: bridged for it
            return pos, tail + data[: pos + need - start]
        return start, data

    def _held(self, pos: int, need: int) -> tuple[int, bytes] | None:
        """(Under the lock.) A held window with ``need`` bytes from pos, or, for a frame straddling two
        adjacent held windows, a bridge ``(pos, its bytes)`` made for that frame alone (a copy of the frame,
        not of a window; kept nowhere), or None."""
        for start, data in reversed(self._windows.items()):
            if start <= pos < start + len(data):
                end = start + len(data)
                if pos + need <= end:
                    self._windows.move_to_end(start)
                    return start, data
                nxt = self._windows.get(end)
                if nxt is not None and pos + need <= end + len(nxt):
                    return pos, data[pos - start :] + nxt[: pos + need - end]
        return None

    def _read_ahead(self, at: int) -> None:
        """Start fetching the stream's next _READ_AHEAD_DEPTH windows from ``at`` (those not held or on
        their way already), in the background: the caller consumes the current window meanwhile."""
        with self._lock:
            for _ in range(_READ_AHEAD_DEPTH):
                if at >= self._object_length:
                    break
                nxt_end = self._window_end(at, at + self.stream_window)
                if at not in self._ahead and not any(s <= at < s + len(d) for s, d in self._windows.items()):
                    self._ahead[at] = (nxt_end, _read_ahead_executor().submit(self._get, at, nxt_end))
                at = nxt_end
            while len(self._ahead) > _MAX_AHEAD:
                self._ahead.popitem(last=False)[1][1].cancel()

    def _window_end(self, start: int, end: int) -> int:
        """Where a stream's window [start, end) stops: on a store read ahead by this handle, at the
        object's end when less than half a window would be left after it (a 32.1 MiB object is 4 GETs,
        not 4 and a sliver); stores that read ahead themselves get the window as asked."""
        if self.read_ahead and self._object_length - end < self.stream_window // 2:
            return self._object_length
        return min(end, self._object_length)

    def _take_ahead(self, ahead: tuple[int, int, Future]) -> tuple[int, bytes]:
        """The window read ahead. When its fetch failed, the reader fetches the same window itself (the
        stream's later windows, already on their way, still line up); a persistent error reaches it."""
        a_start, a_end, fut = ahead
        with self._lock:
            self._ahead.pop(a_start, None)
        try:
            return fut.result()
        except Exception:
            return self._get(a_start, a_end)

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
